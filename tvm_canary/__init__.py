"""tvm_canary: the sglang KV-cache canary (kv-canary) re-created on Apache TVM (docs/SPEC.md section 0)."""

from . import _sources, consts  # noqa: F401 -- _sources first: it reads the sources before any is imported
from .context import CanaryLaunchTag, RealKvSource, VerifyOrWriteContext
from .launch import (
    launch_canary_plan_kernels,
    launch_canary_verify_kernel,
    launch_canary_write_kernel,
    launch_scatter_req_token_ids_kernel,
)
from .plans import VerifyPlan, WritePlan
from .session import CanaryGroup, CanarySession, CanaryViolationError, CanaryViolationWarning
from .violations import Violation, ViolationReport

__all__ = [
    "CanaryGroup",
    "CanaryLaunchTag",
    "CanarySession",
    "CanaryViolationError",
    "CanaryViolationWarning",
    "RealKvSource",
    "VerifyOrWriteContext",
    "VerifyPlan",
    "Violation",
    "ViolationReport",
    "WritePlan",
    "consts",
    "launch_canary_plan_kernels",
    "launch_canary_verify_kernel",
    "launch_canary_write_kernel",
    "launch_scatter_req_token_ids_kernel",
]
