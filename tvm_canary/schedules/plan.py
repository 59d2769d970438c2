"""Plan design space: the entries phase's grid and the offsets phase's block size (rows per lane)."""

CUDA_KNOBS = {"blocks": [264, 1056, 2112], "threads": [128, 256, 512], "tile": [256, 512, 1024]}
CPU_KNOBS: dict[str, list[int]] = {}
