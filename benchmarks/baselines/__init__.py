"""Baselines timed beside tvm_canary's kernels by ``bench_kernels.py``: ``original_cuda`` (clean-room CUDA
with the original's fixed geometry), ``triton_user`` (user-style Triton verify and write); the torch
reference is ``tvm_canary.reference`` itself. ``agreement`` checks each against the reference first."""
