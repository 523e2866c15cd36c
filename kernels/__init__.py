"""Fused gradient-bucket kernels (installed as ``syncviz.kernels``).

``flatten_scale(grads, bucket, scale, out_dtype=None)`` writes many gradients into one flat bucket,
times ``scale`` (e.g. 1/world size), optionally cast to bf16/fp16, in one kernel launch;
``unflatten(bucket, grads, scale=1.0)`` is its inverse. See dispatch.py for which backend runs.
"""
from syncviz.kernels.dispatch import BACKENDS, SUPPORTED_DTYPES, choose_backend, flatten_scale, unflatten
from syncviz.kernels.reference import bucket_offsets, flatten_scale_reference, unflatten_reference

__all__ = ["flatten_scale", "unflatten", "choose_backend", "bucket_offsets", "flatten_scale_reference",
           "unflatten_reference", "BACKENDS", "SUPPORTED_DTYPES"]
