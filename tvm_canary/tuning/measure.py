"""MetaSchedule builder and runner hooks (run in MetaSchedule's worker processes).

* ``build_candidate``: reads the geometry a candidate's trace annotated on the stand-in workload and
  builds the real kernel with it.
* ``alloc_case`` / ``run_case``: the runner allocates valid inputs for the bucket once per worker
  (random valid plans, a clean canary), checks every candidate's outputs against the torch reference
  byte for byte (a mismatch is a failed measurement, so it can never win) and then times it.
"""

from __future__ import annotations

import functools

import torch

from ..runtime import compile as C
from ..runtime.targets import default_geometry
from ..schedules.space import geometry_from
from . import workloads


def build_candidate(mod, target, _params):
    cuda = target.kind.name == "cuda"
    tag = f"cuda-{target.attrs['arch']}" if cuda else "llvm"
    kernel = str(mod["main"].attrs["canary.kernel"])
    bucket = workloads.bucket_of(mod["main"])
    geom = geometry_from(mod, default_geometry(kernel, tag, workloads.mode_of(kernel, bucket)))
    return C.build(kernel, workloads.tuned_spec(kernel, bucket), tag, geom).mod


@functools.lru_cache(maxsize=1)  # one bucket at a time: a 16M-entry ALL case holds ~35 GB
def _case(kernel: str, bucket: tuple, device_type: str):
    device = torch.device("cuda", 0) if device_type == "cuda" else torch.device("cpu")
    return workloads.make_case(kernel, bucket, device)


def alloc_case(kernel: str, bucket: tuple, device, _args_info, alloc_repeat: int):
    case = _case(kernel, bucket, "cuda" if device.dlpack_device_type() == 2 else "cpu")
    return [[case]] * alloc_repeat


def run_case(kernel: str, rt_mod, device, config, repeated_args):
    case = repeated_args[0][0]
    name = f"canary_{kernel}"
    case.reset()
    rt_mod[name](*case.args)
    if case.args[0].is_cuda:
        torch.cuda.synchronize()
    if not case.matches():
        raise RuntimeError(f"candidate output of {name} differs from the torch reference")
    timer = rt_mod.time_evaluator(name, device, number=config.number, repeat=config.repeat, min_repeat_ms=config.min_repeat_ms)
    return list(timer(*case.args).results)
