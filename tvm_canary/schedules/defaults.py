"""Default (untuned) geometries as ``{kernel: {Geometry field: value}}``; unnamed fields keep the
``Geometry`` defaults (1). ``tvm_canary.runtime.targets.default_geometry`` turns them into ``Geometry``.

CUDA grids are grid-stride, so one size serves every GPU; the numbers suit a 132-SM Hopper (8 blocks
per SM) and stay cheap when few entries are active. On the CPU every kernel runs serially (one block,
one lane); only write's chain pipeline depth (``unroll``) matters there.
"""

CUDA_DEFAULTS = {
    # Up to 1056 blocks x 512 threads (fewer for a small plan capacity), grid-stride over the active
    # entries, in one launch; the last block emits the rows with its 512 lanes (tile is unused).
    "verify": {"blocks": 1056, "threads": 512},
    # One thread per request; 128-thread blocks spread a few thousand requests over all SMs; the
    # chain walk keeps 8 entries in flight.
    "write": {"blocks": 528, "threads": 128, "tile": 256, "unroll": 8},
    "plan": {"blocks": 1056, "threads": 128, "tile": 1024},
    "scatter": {"blocks": 1056, "threads": 256, "tile": 1},
}

CPU_DEFAULTS = {kernel: {"unroll": 4} for kernel in CUDA_DEFAULTS}
