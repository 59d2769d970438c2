"""Default (untuned) geometries as ``{kernel: {Geometry field: value}}``; unnamed fields keep the
``Geometry`` defaults (1; ``thin`` and ``pairs`` 0). ``CUDA_MODE_DEFAULTS`` overrides fields for one
launch mode of a kernel (verify's or write's real-KV hash mode when it folds sources: 1 = PARTIAL,
2 = ALL; every other launch is mode 0), ``CUDA_SIZE_DEFAULTS`` those of a mode's default from a size
on (below). ``tvm_canary.runtime.targets.default_geometry`` turns them into ``Geometry``.

CUDA grids are grid-stride, so one size serves every GPU; the numbers suit a 132-SM Hopper (8 blocks per SM) and stay
cheap when few entries are active. On the CPU every kernel runs serially (one block, one lane); only write's chain
pipeline depth (``unroll``) matters there.
"""

CUDA_DEFAULTS = {
    # NONE (no real-KV sources): up to 2112 blocks x 128 threads (fewer for a small plan capacity), grid-stride
    # over the active entries, one launch; one block emits the rows with its 128 lanes (tile unused). min_blocks
    # 4 (128 registers) up to 256K entries; from there the size class below caps registers at 32. Against that
    # cap (H200, 27th session's call 1, ab_kernels.py --modes NONE, 6 interleaved rounds): random 1K /
    # 4K / 64K 0.965 / 0.942 / 1.008x, chain 0.941 / 0.939 / 0.942x (two arms of the same code differed by
    # 0.970-1.008x); the tuner's 4K and 64K picks ran 1.016-1.031x (528 x 128, min_blocks 4, at 1K-4K) and
    # 0.984-0.998x (264 x 256, min_blocks 2, at 64K) of it.
    "verify": {"blocks": 2112, "threads": 128, "min_blocks": 4},
    # One launch; one thread per request (a warp each when few); 64-thread blocks spread a few thousand requests
    # over all SMs (ALL: ``CUDA_MODE_DEFAULTS`` and the size classes); the chain walk keeps 2 entries in flight
    # (long chains: 8, a size class below). 64 lanes against 128 (H200, 21st session's call 1,
    # ab_kernels.py): NONE 4096 x 1 0.933x (3.94 / 4.22 us), 64 x 512 0.998x, 1 x 32768 1.000x;
    # PARTIAL's short chains 0.946x (4.66 / 4.92 us at 4096 x 1; 20th session's call 3; its long chains:
    # the size class below). 2 in flight against 4 at 4096 x 1 (22nd session's calls 1 and 2, two
    # processes, interleaved): NONE 0.943 / 0.945x (3.68 / 3.90 us; ptxas sm_90: 72 registers, not 119), PARTIAL
    # 0.942 / 0.974x; 1 in flight (call 2): NONE 0.986x, PARTIAL 0.962x. Other depths, grids and launch bounds
    # measured at 2-23 tokens a request (23rd and 33rd sessions; none adopted): `git show
    # 7a8f031:tvm_canary/schedules/defaults.py`.
    "write": {"blocks": 528, "threads": 64, "unroll": 2},
    # Entries phase 2112 x 512; offsets phase one block of 1024 lanes (fastest of 6 candidates at bs 4096 on the H200,
    # 100.8 us vs 111.7 us with 256 lanes; `git show a9b35e6:docs/PERFORMANCE.md`, "Default geometries").
    "plan": {"blocks": 2112, "threads": 512, "tile": 1024},
    "scatter": {"blocks": 1056, "threads": 256, "tile": 1},
}

CUDA_MODE_DEFAULTS = {
    # verify in PARTIAL mode (a 32-byte prefix of each source folded), up to 16K entries (above: the size class below):
    # 2112 x 128, min_blocks 2, thin, the sources' folds paired, the tuner's 4K-bucket pick, which ran the H200
    # benchmark's 1K-4K rows 0.916-0.988x the time of 1056 x 128 with min_blocks 8 (seventeenth session's complete run,
    # its interleaved A/B; the 16th's 264 x 128 thin paired 0.940-0.991; thin alone, unpaired, was 1.16x at chain 1K-4K:
    # the 11th's); as the default against that one, 0.928-0.978x at 1K-4K and 0.999-1.004x from 64K on (18th session's
    # call 1, ab_kernels.py, benchmarks/results/h200-2026-12-02-session18-ab).
    ("verify", 1): {"blocks": 2112, "threads": 128, "min_blocks": 2, "thin": 1, "pairs": 1},
    # verify in ALL mode (every token's whole KV row folded), up to 16K entries (above: the size class below):
    # 528 x 32 thin, min_blocks 2, the sources' folds split (pairs 2: two lanes an entry, a source each,
    # ``kernels.common.split_fold``) since the 46th session. Thin (a warp of entries per block) ran 1K-4K
    # 0.82-0.91x of full blocks' time (11th session's call 1). Against 128 thin lanes paired (H200, call B,
    # ab_kernels.py, same bytes; A/A 0.987-1.016): 256-byte rows random 1K / 4K 0.858x / 0.892x, chain
    # 0.900x / 0.887x; split in 128 thin lanes 0.874-0.936x; 2048-byte rows split in 128 lanes 0.869-1.003x.
    # The grids, register caps and paired folds measured before: `git show 7a8f031:tvm_canary/schedules/defaults.py`.
    ("verify", 2): {"blocks": 528, "threads": 32, "min_blocks": 2, "thin": 1, "pairs": 2},
    # write in ALL mode: thin, 4096 one-token requests run 0.90x of full blocks' time, the 64 x 512 and
    # 1 x 32768 shapes 0.99-1.00x (11th session's call 1). Short chains keep 1 entry in flight: at 4096 x 1
    # 0.879 / 0.874x the time of 4, 2 in flight 0.932 / 0.917x (22nd session's calls 1 and 2, interleaved;
    # ptxas sm_90: 112 registers and no spill). Since the 45th session they fold split (pairs 2: two sources
    # of a built-in word count, a lane per source, ``kernels.common.split_fold``) in 32-lane blocks. Against
    # 128 thin lanes paired (H200, call D, ab_kernels.py, same bytes; A/A 0.989-1.015): 256-byte rows 4096 x 1
    # 0.964x, 1024 x 1 in a 4096 plan 0.829x, 2048 x 2 0.952x, 256 x 4 0.879x, 128 x 16 1.000x, 128 x 64
    # 0.991x; 2048-byte rows 0.742-0.959x. Long chains (the class below) stay paired: split there 0.996x at
    # 64 x 512. The lanes, pairs and row widths measured before: `git show 7a8f031:tvm_canary/schedules/defaults.py`.
    ("write", 2): {"threads": 32, "thin": 1, "pairs": 2, "unroll": 1},
    # write in PARTIAL mode (a 32-byte prefix of each source folded) with up to 4 tokens per request (a decode step's;
    # from 5 on: the size classes below): 264 x 32 lanes, 1 entry in flight, the sources' folds paired, the 32nd
    # session's tuned 4096 x 1 pick. Against 528 x 64 with 2 in flight, single-chain (H200, interleaved): 4096 x 1,
    # 2048 x 2, 1024 x 4, 64 x 1, 16 x 1 0.947-0.970x, 256 x 4 0.992x, 128 x 16 / 128 x 22 1.067 / 1.074x (33rd
    # session's call 2); 4096 x 1 0.912x, 256 x 4 1.015x, 128 x 16 1.086x (36th session's call 2). The class bound, 5
    # tokens, lies between the measured shapes: 4 tokens per request gained (1024 x 4) or broke even (256 x 4), 16 lost.
    ("write", 1): {"blocks": 264, "threads": 32, "unroll": 1, "pairs": 1},
}

# Size classes: ``{(kernel, mode): ((at_least, {field: value}), ...)}``, by increasing bound, each reaching the
# previous: a launch whose workload point (``runtime.packing.KernelCall.size``) reaches ``at_least``
# (``runtime.targets.reaches``) overrides these fields of its mode's default, each later class's over those
# (``runtime.targets.size_class``). The CPU has none.
CUDA_SIZE_DEFAULTS = {
    # verify ALL above 16K entries: 2112 x 256 min_blocks 4 with split folds (pairs 2: two lanes an entry, a
    # source each, one chain per lane, so the 64-register cap costs no spills: ptxas sm_90 63 registers) since
    # the 61st session; until then 528 x 128 thin, the sources folded one after another. 16K is the log-scale
    # midpoint of the 4K and 64K tuning buckets, and a tuned launch takes a bucket of its own class
    # (``tuning.apply.tuned_geometry``), so a bucket's default is that of every launch it serves. Against
    # 528 x 128 single-chain (H200, ab_kernels.py, same host start as the 60th session's run; A/A
    # 0.999-1.000x): random 1M / 16M 0.923 / 0.938x, chain 1M / 16M 1.005 / 0.994x; 2112 x 512 min_blocks 2
    # split 0.926 / 0.948 / 1.030 / 0.995x; 528 x 128 split 0.971 / 0.969 / 1.008 / 1.013x. On an H100 (61st
    # session, against the old default): random 64K / 256K / 1M 0.984 / 0.920 / 0.926x, chain 1.013 / 1.029 /
    # 0.997x; against this class, 2112 x 512 split ran 1.009-1.033x everywhere, 528 x 128 split 0.971x at chain
    # 256K alone (random 256K / 1M 1.059 / 1.051x). In the 63rd session's H200 run: random 1M / 4M / 16M
    # 1.033 / 0.995 / 0.981x the gather floor, chain 1M-16M 1.010-1.027x. The paired and single-chain folds
    # and grids measured before (13th and 57th sessions): `git show 7a8f031:tvm_canary/schedules/defaults.py`.
    ("verify", 2): (((1 << 14) + 1, {"blocks": 2112, "threads": 256, "min_blocks": 4, "thin": 0, "pairs": 2}),),
    # verify NONE from 256K entries (the log-scale midpoint of the 64K and 1M tuning buckets) caps registers at
    # 32 (min_blocks 16) so 2048 threads per SM are resident: in chain order (each entry's previous slot is its
    # neighbour's) that occupancy takes 1M-16M entries from 1.24-1.28x to 1.03-1.12x of the gather floor; random
    # order stays within 1.03x (the H200 candidate sweeps of 2026-11-30, session 3, `git show
    # a9b35e6:docs/PERFORMANCE.md` "Default geometries"). Against the mode's 128 registers (min_blocks 4;
    # 27th session's call 1, interleaved): chain 1M / 4M / 16M 0.957 / 0.944 / 0.918x, random 1.044 /
    # 1.033 / 1.029x; one geometry serves both orders, so the cap stays.
    ("verify", 0): (((1 << 18) + 1, {"min_blocks": 16}),),
    # verify PARTIAL above 16K entries (the same boundary): 1056 x 128 with min_blocks 8, full blocks,
    # single-chain folds. NONE's 32-register cap costs 1.2-1.5x at 1M-16M entries; this grid (64 registers, 1024
    # threads per SM) is within 0.96-1.01x of the floor there (5th-session H200 run) and 1.00-1.05x in the
    # 17th session's at 64K-16M; ptxas sm_90 (55th session): 60 registers, no spills with 2 sources. From 256K
    # entries on (NONE's boundary) 512-lane blocks, two an SM (min_blocks 2): against 128 lanes (H200, 56th
    # session's call 1, ab_kernels.py, class scope from 16K) chain 1M / 4M / 16M 0.943 / 0.920 / 0.960x, random
    # 0.990 / 1.004 / 1.011x, but 64K 1.027 / 1.017x (chain / random), hence the bound; on an H100 (call 5)
    # chain 0.935 / 0.940 / 0.971x, random 1.005 / 1.013 / 1.018x. Since the 57th session 2112 such blocks, not
    # 1056 (a launch takes at most one per 512 entries, so up to 512K entries the grid is the same): against
    # 1056 (H100, its calls 4 and 5, ab_kernels.py, two processes; A/A 0.999-1.005x) chain 1M / 2M / 4M / 16M
    # 0.970 / 0.975 / 0.977-0.978 / 0.979-0.981x, random 0.993-0.995 / 0.987 / 0.993-0.994 / 0.998x. The
    # other grids measured (thin paired, min_blocks 1): `git show 7a8f031:tvm_canary/schedules/defaults.py`.
    ("verify", 1): (((1 << 14) + 1, {"blocks": 1056, "min_blocks": 8, "thin": 0, "pairs": 0}),
                    ((1 << 18) + 1, {"blocks": 2112, "threads": 512, "min_blocks": 2})),
    # write with chains of 23 tokens per request or more (23: the log-scale midpoint of the 1-token and
    # 512-token tuning buckets' tokens per request; ALL: 128, below) keeps 8 entries of each chain in flight, in
    # every mode. The class follows tokens per request alone, the chain length the pipeline depth acts on; a
    # tuned launch takes the nearest bucket of its own class (as above), so 64 x 4 takes the 4096 x 1 bucket,
    # not the long chains' nearer 64 x 512. Against 4 (H200, 18th session's call 2, interleaved,
    # benchmarks/results/h200-2026-12-02-session18-ab-write): 1 x 32768 0.955 / 0.976 / 0.980x (NONE / PARTIAL /
    # ALL), 64 x 512 0.957 / 0.967 / 1.007x; at one token per request the deeper pipeline costs 1.16 / 1.41 /
    # 1.21x (4096 x 1), so short chains keep fewer (NONE and PARTIAL 2, ALL 1, above). 16 in flight: 1 x 32768
    # 0.943 / 0.964 / 0.989x, but 64 x 512 0.956 / 1.005 / 1.057x.
    ("write", 0): (((1, 23), {"unroll": 8}),),
    # PARTIAL from 5 tokens per request runs NONE's 528 x 64 with 2 entries in flight and single-chain folds
    # (its short chains' 264 x 32 paired lanes cost 1.07-1.09x at 128 x 16: above), from 23 on NONE's 8 in
    # flight on the same 64 full lanes. The 128 thin lanes its long chains ran before (64 x 512 and 1 x 32768 at
    # 0.987 / 1.001x of 64 full lanes, 20th session's call 3) cost 1.04-2.06x between the benchmark's
    # shapes: 64 full lanes against them 128 x 23 0.906x, 256 x 32 0.779x, 512 x 32 0.486x (10.20 / 21.00 us),
    # 64 x 64 0.922x, 32 x 128 0.958x, 64 x 512 1.006x, 1 x 32768 0.998x (H200, 23rd session's call 3,
    # ab_kernels.py).
    ("write", 1): (((1, 5), {"blocks": 528, "threads": 64, "unroll": 2, "pairs": 0}), ((1, 23), {"unroll": 8})),
    # ALL's long chains run 256 full lanes, the tuner's 64 x 512 pick: against 128 thin lanes 64 x 512 0.947x
    # (63.32 / 66.86 us), 1 x 32768 1.003x (3656.3 / 3644.3 us); at 4096 x 1 they would cost 1.68x, so short
    # chains keep 128 thin lanes (H200, 21st session's call 1, ab_kernels.py). ALL's class
    # starts at 128 tokens per request: the short chains' geometry (128 thin lanes, 1 in flight) against this
    # one 128 x 23 0.580x (8.44 / 14.56 us), 256 x 32 0.647x, 64 x 64 0.803x, 512 x 32 0.957x, 32 x 128 1.001x,
    # 16 x 256 1.009x, 64 x 512 1.123x, 1 x 32768 1.020x (23rd session's call 4, interleaved). They fold
    # paired (split, above: 0.996x, an A/A's spread).
    ("write", 2): (((1, 128), {"unroll": 8, "threads": 256, "thin": 0, "pairs": 1}),),
}

# The CPU runs the paired folds at every size (as CUDA's write ALL and its verify PARTIAL and ALL launches
# of up to 16K entries do; no size classes); tests/test_differential.py also checks single-chain folds there.
CPU_DEFAULTS = {kernel: {"unroll": 4, **({"pairs": 1} if kernel in ("verify", "write") else {})}
                for kernel in CUDA_DEFAULTS}
