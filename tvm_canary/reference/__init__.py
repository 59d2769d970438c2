"""Pure-torch reference semantics: the byte-exact oracle every compiled kernel is compared with."""

from .plan import canary_plan_ref
from .scatter import scatter_req_token_ids_ref
from .verify import canary_verify_ref
from .write import canary_write_ref

# kernel name -> its reference; each takes the public launch function's keyword arguments
REFERENCE = {
    "verify": canary_verify_ref,
    "write": canary_write_ref,
    "plan": canary_plan_ref,
    "scatter": scatter_req_token_ids_ref,
}

__all__ = ["REFERENCE", "canary_plan_ref", "canary_verify_ref", "canary_write_ref", "scatter_req_token_ids_ref"]
