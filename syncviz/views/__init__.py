"""Views of a recorded run for people: the terminal summary, strategy comparison, and exports
(TensorBoard, Perfetto, HTML). Views lay out what analysis computes; they compute no metric."""


def refuse_with_whole(whole: bool, **given: bool) -> None:
    """--whole reads a run at once in this process; the options of the reading by partitions of ranks
    (``given``: option name -> whether it was given, e.g. jobs=...) would do nothing there. One line and
    exit 2 (click.UsageError) naming them, instead of dropping them without a word."""
    named = [f"--{k.replace('_', '-')}" for k, v in given.items() if v]
    if whole and named:
        import click
        raise click.UsageError(f"--whole reads the run in this process, at once: {', '.join(named)} "
                               f"appl{'ies' if len(named) == 1 else 'y'} to the reading by partitions of ranks (leave out --whole)")
