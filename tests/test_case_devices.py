"""The seeded case builders (``tvm_canary.cases``) keep a case's tensors on the asked-for device, checked
on any machine: each builder runs on ``meta`` under a torch function mode rejecting calls mixing devices.
CUDA rejects them too, but CI has no GPU."""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode

from tvm_canary.cases import CASES, context_for

# Calls that move or copy a tensor to another device on purpose.
CROSSING = {"to", "copy_"}

# (kernel, builder options) of every builder the tests, the fuzzer and conformance use.
BUILDS = [
    ("verify", {}), ("verify", {"valid": False}), ("verify", {"token_units": 8}),
    ("write", {}), ("write", {"valid": False}), ("write", {"token_units": 8}), ("write", {"long_chains": True}),
    ("write", {"shape": (40, 8)}), ("write", {"shape": (3, 1)}),
    ("plan", {}), ("plan", {"valid": False}),
    ("scatter", {}), ("scatter", {"valid": False}),
]


class MixedDevices(AssertionError):
    pass


class RejectMixedDevices(TorchFunctionMode):
    """Raises ``MixedDevices`` on a torch call (other than ``CROSSING``) whose tensor arguments sit on
    more than one device; a 0-dim CPU tensor counts as a scalar, as torch treats it. Stricter than CUDA
    (which accepts CPU index tensors): a case keeps all its tensors on its device."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        if name not in CROSSING:
            found = set()
            stack = [*args, *kwargs.values()]
            while stack:
                item = stack.pop()
                if isinstance(item, torch.Tensor) and not (item.device.type == "cpu" and item.dim() == 0):
                    found.add(item.device.type)
                elif isinstance(item, (list, tuple)):
                    stack.extend(item)
            if len(found) > 1:
                raise MixedDevices(f"{name} mixes tensors on {sorted(found)}")
        return func(*args, **kwargs)


@pytest.mark.parametrize("kernel, options", BUILDS, ids=[f"{k}-{o}" for k, o in BUILDS])
def test_case_builders_keep_their_tensors_on_one_device(kernel, options):
    for seed in range(8):
        with RejectMixedDevices():
            case = CASES[kernel](torch.Generator().manual_seed(seed), "meta", **options)
        assert case, f"{kernel} {options} seed {seed}: an empty case"


def test_a_mixed_store_is_rejected():
    """The check itself: CPU index and values stored into a device tensor."""
    words = torch.zeros(8, 4, dtype=torch.int64, device="meta")
    with pytest.raises(MixedDevices, match="__setitem__"), RejectMixedDevices():
        words[torch.tensor([1, 3]), 1] = torch.tensor([5, 6])


def test_a_context_with_fewer_slots_than_a_page_builds():
    """A source of one row (fewer slots than its page) is never cut shorter: a short source keeps a row."""
    for seed in range(64):
        context = context_for(torch.Generator().manual_seed(seed), "cpu", 2)
        assert all(source.tensor.shape[0] >= 1 for source in context.real_kv_sources)
