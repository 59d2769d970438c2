"""Verify design space: the grid cap (blocks; the launch uses min(blocks, ceil(cap / threads)), at least
one), threads per block, and how many such blocks must fit on one SM (``min_blocks``: a register cap
that trades spills for occupancy). Verify is one launch whose last block also runs the ordered emit
phase with the same ``threads`` lanes, so ``tile`` is not a verify knob. On CPU the kernel runs
serially: no knobs."""

CUDA_KNOBS = {"blocks": [264, 528, 1056, 2112], "threads": [128, 256, 512, 1024], "min_blocks": [1, 2, 4]}
CPU_KNOBS: dict[str, list[int]] = {}
