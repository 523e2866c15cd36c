"""Recording inside each rank: the recorder and its hooks (recorder, phases, events, batch), DDP's
timed comm hook (ddp), every torch.distributed collective (collectives), clocks (clock),
torch.profiler windows (profiling), and ``syncviz trace`` (launch → bootstrap in each rank).

Public: ``start``, ``instrument``, ``tracing``, ``get_recorder``, ``Recorder``, ``StepSelection``,
``TraceOptions``. Loaded lazily: ``syncviz trace --help`` and the launcher must not import torch
just to parse options (options.py and launch.py import no torch at module level).
"""
_API = {"start": "api", "instrument": "api", "tracing": "api", "get_recorder": "api",
        "Recorder": "recorder", "StepSelection": "options", "TraceOptions": "options"}


def __getattr__(name):
    if name in _API:
        import importlib
        return getattr(importlib.import_module(f"syncviz.record.{_API[name]}"), name)
    raise AttributeError(f"module 'syncviz.record' has no attribute {name!r}")
