"""Default (untuned) geometries as ``{kernel: {Geometry field: value}}``; unnamed fields keep the
``Geometry`` defaults (1; ``thin`` and ``pairs`` 0). ``CUDA_MODE_DEFAULTS`` overrides fields for one
launch mode of a kernel (verify's or write's real-KV hash mode when it folds sources: 1 = PARTIAL,
2 = ALL; every other launch is mode 0), ``CUDA_SIZE_DEFAULTS`` those of a mode's default from a size
on (below). ``tvm_canary.runtime.targets.default_geometry`` turns them into ``Geometry``.

CUDA grids are grid-stride, so one size serves every GPU; the numbers suit a 132-SM Hopper (8 blocks per SM) and stay
cheap when few entries are active. On the CPU every kernel runs serially (one block, one lane); only write's chain
pipeline depth (``unroll``) matters there.
"""

# Each choice's comment gives the measurement that chose it (interleaved A/Bs, ``benchmarks/ab_kernels.py``); the
# alternatives' numbers, session by session: `git show 2fe5eb7:tvm_canary/schedules/defaults.py` (earlier ones:
# `git show 7a8f031:tvm_canary/schedules/defaults.py`).
CUDA_DEFAULTS = {
    # NONE (no real-KV sources): up to 2112 blocks x 128 threads, grid-stride over the active entries, one launch;
    # one block emits the rows. min_blocks 4 (128 registers) up to 256K entries (above: the size class). Against
    # the 32-register cap (H200, 27th session): random 1K / 4K 0.965 / 0.942x, chain 0.941 / 0.939x.
    "verify": {"blocks": 2112, "threads": 128, "min_blocks": 4},
    # One thread per request (a warp each when few); 64-thread blocks spread a few thousand requests over all SMs;
    # 2 chain entries in flight (long chains: 8, a size class). Against 128 lanes (H200, 21st session): NONE
    # 4096 x 1 0.933x; against 4 in flight (22nd): NONE 0.943x (72 registers, not 119), PARTIAL 0.942x.
    "write": {"blocks": 528, "threads": 64, "unroll": 2},
    # Entries phase 2112 x 512; offsets phase one block of 1024 lanes (fastest of 6 candidates at bs 4096 on the H200,
    # 100.8 us vs 111.7 us with 256 lanes; `git show a9b35e6:docs/PERFORMANCE.md`, "Default geometries").
    "plan": {"blocks": 2112, "threads": 512, "tile": 1024},
    "scatter": {"blocks": 1056, "threads": 256, "tile": 1},
}

CUDA_MODE_DEFAULTS = {
    # verify PARTIAL (a 32-byte prefix of each source folded) up to 16K entries: 2112 x 128 thin, min_blocks 2, the
    # sources' folds paired (the tuner's 4K pick): 0.928-0.978x of 1056 x 128 min_blocks 8 at 1K-4K, 0.999-1.004x
    # from 64K on (H200, 18th session).
    ("verify", 1): {"blocks": 2112, "threads": 128, "min_blocks": 2, "thin": 1, "pairs": 1},
    # verify ALL (every token's whole KV row folded) up to 16K entries: 528 x 32 thin, min_blocks 2, folds split
    # (pairs 2: two lanes an entry, a source each, ``kernels.common.split_fold``; since the 46th session).
    # Against 128 thin lanes paired (H200, same bytes; A/A 0.987-1.016): random 1K / 4K 0.858 / 0.892x, chain
    # 0.900 / 0.887x.
    ("verify", 2): {"blocks": 528, "threads": 32, "min_blocks": 2, "thin": 1, "pairs": 2},
    # write ALL: 32 thin lanes, 1 entry in flight, folds split (since the 45th session). Against 128 thin lanes
    # paired (H200, same bytes; A/A 0.989-1.015): 4096 x 1 0.964x, 256 x 4 0.879x, 128 x 16 1.000x; 2048-byte rows
    # 0.742-0.959x.
    ("write", 2): {"threads": 32, "thin": 1, "pairs": 2, "unroll": 1},
    # write PARTIAL up to 4 tokens a request (a decode step's; from 5: the size classes): 264 x 32, 1 in flight,
    # folds paired (the 32nd session's tuned 4096 x 1 pick). Against 528 x 64 with 2 in flight (H200, 33rd and
    # 36th sessions): 4096 x 1 0.912-0.970x, 256 x 4 0.992-1.015x, 128 x 16 1.067-1.086x, hence the bound of 5.
    ("write", 1): {"blocks": 264, "threads": 32, "unroll": 1, "pairs": 1},
}

# Size classes: ``{(kernel, mode): ((at_least, {field: value}), ...)}``, by increasing bound, each reaching the
# previous: a launch whose workload point (``runtime.packing.KernelCall.size``) reaches ``at_least``
# (``runtime.targets.reaches``) overrides these fields of its mode's default, each later class's over those
# (``runtime.targets.size_class``). A bound lies at the log-scale midpoint of two tuning buckets, and a tuned launch
# takes a bucket of its own class (``tuning.apply.tuned_geometry``), so a bucket's default is that of every launch
# it serves. The CPU has none.
CUDA_SIZE_DEFAULTS = {
    # verify ALL above 16K entries: 2112 x 256 min_blocks 4, folds split (one chain per lane: 63 registers, no
    # spills). Against 528 x 128 single-chain (H200, 61st session): random 1M / 16M 0.923 / 0.938x, chain 1.005 /
    # 0.994x; in the 63rd session's run 0.981-1.033x of the gather floor.
    ("verify", 2): (((1 << 14) + 1, {"blocks": 2112, "threads": 256, "min_blocks": 4, "thin": 0, "pairs": 2}),),
    # verify NONE from 256K entries caps registers at 32 (min_blocks 16; 2048 threads per SM resident): chain order
    # 1M-16M from 1.24-1.28x to 1.03-1.12x of the gather floor. Against 128 registers (27th session): chain
    # 0.918-0.957x, random 1.029-1.044x; one geometry serves both orders, so the cap stays.
    ("verify", 0): (((1 << 18) + 1, {"min_blocks": 16}),),
    # verify PARTIAL above 16K entries: 1056 x 128 min_blocks 8, full blocks, single-chain folds (60 registers, no
    # spills; 0.96-1.05x of the floor at 64K-16M); from 256K 2112 x 512 min_blocks 2: against 128 lanes (H200,
    # 56th session) chain 1M-16M 0.920-0.960x, random 0.990-1.011x; 2112 blocks against 1056 (H100, 57th) 0.970-0.998x.
    ("verify", 1): (((1 << 14) + 1, {"blocks": 1056, "min_blocks": 8, "thin": 0, "pairs": 0}),
                    ((1 << 18) + 1, {"blocks": 2112, "threads": 512, "min_blocks": 2})),
    # write from 23 tokens a request (ALL: 128) keeps 8 entries in flight; the class follows tokens per request, the
    # chain length the depth acts on. Against 4 (H200, 18th session): 1 x 32768 0.955-0.980x, 64 x 512
    # 0.957-1.007x; at 4096 x 1 the depth would cost 1.16-1.41x, so short chains keep fewer.
    ("write", 0): (((1, 23), {"unroll": 8}),),
    # write PARTIAL from 5 tokens a request: NONE's 528 x 64, 2 in flight, single-chain folds (the short chains'
    # lanes cost 1.07-1.09x at 128 x 16); from 23 NONE's 8 in flight. 128 thin lanes, before, cost 1.04-2.06x
    # between the benchmark's shapes (H200, 23rd session).
    ("write", 1): (((1, 5), {"blocks": 528, "threads": 64, "unroll": 2, "pairs": 0}), ((1, 23), {"unroll": 8})),
    # write ALL from 128 tokens a request: 256 full lanes, paired (the tuner's 64 x 512 pick): against 128 thin
    # lanes 64 x 512 0.947x, 1 x 32768 1.003x; the short chains' geometry at 128 x 23 0.580x, 64 x 512 1.123x (H200,
    # 21st and 23rd sessions).
    ("write", 2): (((1, 128), {"unroll": 8, "threads": 256, "thin": 0, "pairs": 1}),),
}

# The CPU runs the paired folds at every size (as CUDA's write ALL and its verify PARTIAL and ALL launches
# of up to 16K entries do; no size classes); tests/test_differential.py also checks single-chain folds there.
CPU_DEFAULTS = {kernel: {"unroll": 4, **({"pairs": 1} if kernel in ("verify", "write") else {})}
                for kernel in CUDA_DEFAULTS}
