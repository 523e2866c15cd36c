"""The arithmetic that turns CUDA events into trace times, run without a GPU (CI never has one):
events here are stand-ins that know their GPU time in ns and answer ``elapsed_time`` in ms, as a
completed torch.cuda.Event does. The real events are exercised in tests/test_cuda_path.py."""
from syncviz.record.batch import apply_cuda_times
from syncviz.record.cudaclock import GpuClock
from syncviz.record.events import BucketCall, CollectiveCall
from syncviz.trace import schema as S


class _Done:
    def __init__(self, gpu_ns):
        self.gpu_ns = gpu_ns

    def elapsed_time(self, other):          # ms, float, as torch.cuda.Event
        return (other.gpu_ns - self.gpu_ns) / 1e6

    def query(self):
        return True


def test_anchor_chains_from_the_previous_one_and_never_precedes_its_enqueue():
    clock = GpuClock(lambda: 0)
    clock.ref = (_Done(1_000), 50_000)       # calibrated: GPU 1 µs ↔ our clock 50 µs
    # the GPU ran the anchor 3 ms after the reference although the host enqueued it at 10 µs
    assert clock.anchor_time(10_000, _Done(3_001_000)) == 3_050_000
    # chained from that anchor; a host enqueue time later than the chain wins (GPU clock slow)
    assert clock.anchor_time(9_000_000, _Done(4_001_000)) == 9_000_000
    assert clock.ref[1] == 9_000_000
    fresh = GpuClock(lambda: 0)               # never calibrated: the enqueue time, as before
    assert fresh.anchor_time(123, _Done(7)) == 123


def _cols(rows):
    cols = {c: [] for c in S.EVENT_COLUMNS}
    for kind, bucket, launch in rows:
        rec = {**S.EVENT_DEFAULTS, "kind": kind, "bucket": bucket, "launch_ns": launch, "start_ns": launch}
        for c in S.EVENT_COLUMNS:
            cols[c].append(rec[c])
    return cols


def test_ddp_buckets_and_engine_rows_get_gpu_times_other_rows_keep_theirs():
    ddp = BucketCall(0, 0, 100, 8, "float32", "allreduce", 0)
    ddp.cuda = [_Done(6_500), _Done(7_000)]
    eng = CollectiveCall(S.BUCKET, "syncviz all_reduce", "all_reduce", 0, 200, 8, "float32", 2, bucket=1)
    eng.cuda = [_Done(6_600), _Done(8_000), "cuda:0"]
    pending = CollectiveCall(S.BUCKET, "syncviz all_reduce", "all_reduce", 0, 300, 8, "float32", 2, bucket=2)
    pending.cuda = [_Done(6_700), None, "cuda:0"]           # its end event never came: host times stay
    cols = _cols([(S.BUCKET, 0, 100), (S.BUCKET, 1, 200), (S.BUCKET, 2, 300), (S.COLLECTIVE, 1, 200)])
    clock = GpuClock(lambda: 0)
    clock.ref = (_Done(0), 0)
    apply_cuda_times(cols, [ddp, eng, pending], (6_000, _Done(6_000)), clock)
    # launch_ns ← the start event (recorded at the collective call); start_ns keeps the host's
    # hook-entry → call gap before it (0 here: _cols sets start = launch)
    assert cols["launch_ns"] == [6_500, 6_600, 300, 200] and cols["start_ns"] == [6_500, 6_600, 300, 200]
    assert cols["end_ns"] == [7_000, 8_000, -1, -1]
