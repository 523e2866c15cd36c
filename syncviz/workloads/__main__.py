"""``torchrun -m syncviz.workloads`` / ``syncviz trace -m syncviz.workloads``: the training script."""
from syncviz.workloads.train import main

main()
