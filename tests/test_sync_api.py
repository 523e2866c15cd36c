"""syncviz.sync pieces that need no process group: bucket planning and argument errors.
(Training equivalence on 2 gloo ranks is in test_sync.py.)"""
import pytest
import torch
from torch import nn

from syncviz.sync import STRATEGIES, DataParallel, plan_buckets


def _params(*shapes, dtype=torch.float32):
    return [nn.Parameter(torch.zeros(s, dtype=dtype)) for s in shapes]


def test_buckets_reverse_order_cut_at_cap():
    ps = _params(10, 10, 10, 10, 10)            # 40 bytes each
    assert plan_buckets(ps, cap_bytes=80) == [[4, 3], [2, 1], [0]]
    assert plan_buckets(ps, cap_bytes=1) == [[4], [3], [2], [1], [0]]
    assert plan_buckets(ps, cap_bytes=10**9) == [[4, 3, 2, 1, 0]]


def test_buckets_split_at_dtype_change_and_big_tensor_alone():
    ps = _params(4, 4) + _params(4, dtype=torch.bfloat16) + _params(1000, 4)
    assert plan_buckets(ps, cap_bytes=64) == [[4, 3], [2], [1, 0]]


def test_every_parameter_in_exactly_one_bucket():
    ps = _params(*[(i % 7) + 1 for i in range(50)])
    flat = sorted(i for b in plan_buckets(ps, cap_bytes=30) for i in b)
    assert flat == list(range(50))


def test_bad_arguments_are_clear_errors():
    model = nn.Linear(3, 3)
    with pytest.raises(ValueError, match="strategy"):
        DataParallel(model, strategy="zero3")
    with pytest.raises(ValueError, match="bucket_cap_mb"):
        DataParallel(model, bucket_cap_mb=0)
    if not torch.distributed.is_initialized():
        with pytest.raises(RuntimeError, match="init_process_group"):
            DataParallel(model)
    assert STRATEGIES == ("all_reduce", "reduce_scatter")
