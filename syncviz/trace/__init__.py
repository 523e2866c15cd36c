"""The trace: the contract between the stages. ``schema`` says what a run directory holds,
``write`` writes one, ``read`` reads one back into pandas tables. Every other stage imports this
package and nothing of the others' internals."""
from syncviz.trace import schema  # noqa: F401
from syncviz.trace.read import (Run, RunFiles, TraceError, events_frame, find_runs, is_run_dir,  # noqa: F401
                                load_events, load_layouts, load_run, machine_memory, open_run, rank_files, read_meta,
                                warn_problems)
from syncviz.trace.write import (RankWriter, events_to_batch, new_meta, write_json_atomic,  # noqa: F401
                                 write_run)
