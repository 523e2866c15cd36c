"""A collective still in flight when its step ends (an async all-reduce waited steps later,
manual_ddp --stale) gets its end time once it completes (record.batch.stamp_late_ends); the step's
own row keeps its end."""
from __future__ import annotations

from syncviz.record.batch import build_batch, stamp_late_ends
from syncviz.record.events import CollectiveCall, Phase
from syncviz.trace import schema as S


def _call(launch, done=-1, op="all_reduce"):
    return CollectiveCall(S.COLLECTIVE, op, op, 0, launch, 1024, "float32", 2, done=done)


def test_late_end_is_stamped_and_step_end_kept():
    early, late, other = _call(100, done=150), _call(200), _call(300, op="broadcast")
    phases = [Phase(S.FORWARD, "forward", 0, 90, 0), Phase(S.BACKWARD, "backward", 90, 180, 0)]
    cols = build_batch(3, phases=phases, ready=[], buckets=[], collectives=[early, late, other], base=0,
                       world_size=2, step_start=0, param_name=str, bucket_params=lambda layout, i: [])
    step_end = cols["end_ns"][cols["kind"].index(S.STEP)]
    assert step_end == 180
    late.done = 5_000                       # completed during a later step
    stamp_late_ends(cols, [late, other])    # `other` never completed: its row stays at -1 (dropped by the reader)
    ends = {s: e for k, s, e in zip(cols["kind"], cols["start_ns"], cols["end_ns"]) if k == S.COLLECTIVE}
    assert ends == {100: 150, 200: 5_000, 300: -1}
    assert cols["end_ns"][cols["kind"].index(S.STEP)] == step_end
