"""Verify design space: the persistent grid (blocks, threads per block) of the check phase and the
emit phase's block size. On CPU the kernel runs serially: no knobs."""

CUDA_KNOBS = {"blocks": [132, 264, 528, 1056, 2112], "threads": [128, 256, 512, 1024]}
CPU_KNOBS: dict[str, list[int]] = {}
