"""A simulated serving engine for exercising the canary: what the demo, ``selftest`` and the tests run.

* ``kv_pool.KvPool``: paged K/V bytes exposed as real-KV sources; ``write`` is the model's forward.
* ``engine.Engine``: random requests with a prefix cache, chunked prefill, decode, slot reuse and an
  optional SWA group, producing each step's ``CanarySession.before_forward`` arguments.
* ``faults``: injectors breaking the engine's KV bookkeeping or the canary buffers, and the
  attribution of violation rows to the faults causing them.
"""

from .engine import Engine, EngineConfig
from .faults import KINDS, PER_GROUP_KINDS, Fault, FaultTracker, inject
from .kv_pool import KvPool

__all__ = ["KINDS", "PER_GROUP_KINDS", "Engine", "EngineConfig", "Fault", "FaultTracker", "KvPool", "inject"]
