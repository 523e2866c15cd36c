"""Analysis: pure functions of the trace tables → metric tables. The single definition of every
number syncviz shows (``metrics``), the tables views lay out (``tables``) and the interval
arithmetic both use (``intervals``). No plotting, no I/O, no torch.

``from syncviz import analysis as A`` gives every public function of the three modules.
"""
from syncviz.analysis.intervals import (BLOCKING, Coverage, blocking_rows, comm_rows,  # noqa: F401
                                        compute_intervals, innermost_optimizer_rows, merge_intervals,
                                        subtract_intervals, wire_mask)
from syncviz.analysis.metrics import *  # noqa: F401,F403
from syncviz.analysis.metrics import NS, busbw_factor  # noqa: F401
from syncviz.analysis.tables import *  # noqa: F401,F403
from syncviz.analysis.lanes import lanes  # noqa: F401
from syncviz.analysis.timeline import collective_parts, latest_in_matrix, latest_launcher, representative_ranks  # noqa: F401
from syncviz.analysis.headline import (HEADLINE_AGGREGATE, headline, headline_rows, run_summary,  # noqa: F401
                                       straggler_text, top_exposed, verdict)
from syncviz.analysis.queueing import (attributed_exposed, collective_times, straggler,  # noqa: F401
                                       straggler_table)
