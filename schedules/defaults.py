"""Default (untuned) CUDA geometries. Grids are grid-stride, so one size serves every GPU; the
numbers suit a 132-SM Hopper (8 blocks per SM) and stay cheap when few entries are active."""

from tvm_canary.geometry import Geometry

DEFAULTS = {
    # Up to 1056 blocks x 512 threads (fewer for a small plan capacity), grid-stride over the active
    # entries, in one launch; the last block emits the rows with its 512 lanes (tile is unused).
    "verify": Geometry(gpu=True, blocks=1056, threads=512),
    # One thread per request; 128-thread blocks spread a few thousand requests over all SMs; the
    # chain walk keeps 8 entries in flight.
    "write": Geometry(gpu=True, blocks=528, threads=128, tile=256, unroll=8),
    "plan": Geometry(gpu=True, blocks=1056, threads=128, tile=1024),
    "scatter": Geometry(gpu=True, blocks=1056, threads=256, tile=1),
}
