"""syncviz: see where the time of data-parallel gradient synchronization goes.

From code (ranks launched by you): ``syncviz.instrument(model)`` or ``with syncviz.tracing(out):``.
From the shell: ``syncviz trace --nproc-per-node 2 train.py`` (see ``syncviz --help``).
"""
__version__ = "0.1.0"


def __getattr__(name):
    # Lazy: importing syncviz must stay cheap (the CLI, the dashboard and the readers don't need torch).
    if name in ("instrument", "tracing", "Recorder", "start", "get_recorder"):
        from syncviz import record
        return getattr(record, name)
    if name in ("load_run", "TraceError"):
        from syncviz import trace
        return getattr(trace, name)
    raise AttributeError(f"module 'syncviz' has no attribute {name!r}")
