"""The parts of benchmarks/gpu_check.py: one module per check, plus the rank-side scripts they
launch (ddp_train.py, engine_train.py; the overhead check runs benchmarks/overhead.py) and the
shared report/launch helpers."""
