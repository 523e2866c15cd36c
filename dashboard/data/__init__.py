"""The dashboard's data: runs read with the trace reader (store), per-step views analysed in blocks
(stepview), and synthetic runs for tests and benchmarks (synth)."""
