"""Verify design space: the grid cap (blocks; the launch uses min(blocks, ceil(cap / threads)), at least
one) and threads per block. Verify is one launch whose last block also runs the ordered emit phase
with the same ``threads`` lanes, so ``tile`` is not a verify knob. On CPU the kernel runs serially: no
knobs."""

CUDA_KNOBS = {"blocks": [132, 264, 528, 1056, 2112], "threads": [128, 256, 512, 1024]}
CPU_KNOBS: dict[str, list[int]] = {}
