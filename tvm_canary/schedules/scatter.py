"""Scatter design space: blocks striding over requests, threads over columns."""

CUDA_KNOBS = {"blocks": [264, 1056, 2112], "threads": [128, 256, 512]}
CPU_KNOBS: dict[str, list[int]] = {}
