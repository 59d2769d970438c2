"""Pure-torch reference semantics: the byte-exact oracle every compiled kernel is compared with."""

from .plan import canary_plan_ref
from .scatter import scatter_req_token_ids_ref
from .verify import canary_verify_ref
from .write import canary_write_ref

__all__ = ["canary_plan_ref", "canary_verify_ref", "canary_write_ref", "scatter_req_token_ids_ref"]
