"""Default (untuned) CUDA geometries, as functions of the device's SM count."""

from tvm_canary.kernels.common import Geometry


def verify(sms: int) -> Geometry:
    # Persistent grid: 8 blocks of 512 threads per SM, grid-stride over the active entries.
    return Geometry(gpu=True, blocks=8 * sms, threads=512, tile=256)


def write(sms: int) -> Geometry:
    # One thread per request; 128-thread blocks keep many SMs busy for a few thousand requests.
    return Geometry(gpu=True, blocks=4 * sms, threads=128, tile=256, unroll=8)


def plan(sms: int) -> Geometry:
    return Geometry(gpu=True, blocks=8 * sms, threads=128, tile=1024)


def scatter(sms: int) -> Geometry:
    return Geometry(gpu=True, blocks=8 * sms, threads=256, tile=1)


DEFAULTS = {"verify": verify, "write": write, "plan": plan, "scatter": scatter}
