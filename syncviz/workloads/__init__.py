"""The built-in workload: a GPT (gpt.py) trained on synthetic tokens with real data parallelism
(strategies.py: DDP, compression hooks, ZeRO-1, FSDP2), the rank-side training script (train.py,
``python -m syncviz.workloads``), ``syncviz demo`` (demo.py) and ``syncviz sweep`` (sweep.py).
It is an ordinary training script: syncviz instruments it from the outside like any user script."""
