"""Verify design space: the grid cap (blocks; the launch uses min(blocks, ceil(cap / threads)), at least one),
threads per block, whether a small plan is spread thin (a warp of entries per block, ``thin``), how many such
blocks must fit on one SM (``min_blocks``: a register cap trading spills for occupancy) and how two sources'
folds run (``pairs``: 1, in lockstep in one lane, a shorter dependent chain for more registers, on the H200
1K-4K ALL entries gain 14-20% and 1M entries in chain order lose 5%; 2, ALL's built-in word counts split
over two lanes an entry, ``kernels.common.split_fold``, 1K-4K ALL entries 0.86-0.90x of pairs 1 in 32-lane
blocks). Verify is one launch, one of whose blocks also runs the ordered emit phase with the same
``threads`` lanes, so ``tile`` is no verify knob. On CPU the kernel runs serially: no knobs."""

# threads 32, min_blocks 2, 8 and 16 and pairs 2 make every default (of each mode and size class) a point of
# the space, so tuning measures them beside the candidates (``tuning.apply`` keeps a default unless a
# candidate clearly beat it). Where threads x min_blocks exceeds an SM's 2048 threads the cap cannot hold:
# such a point fails to build or measures slow, never winning.
CUDA_KNOBS = {"blocks": [264, 528, 1056, 2112], "threads": [32, 128, 256, 512, 1024], "min_blocks": [1, 2, 4, 8, 16],
              "thin": [0, 1], "pairs": [0, 1, 2]}
CPU_KNOBS: dict[str, list[int]] = {}
