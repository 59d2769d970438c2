"""Decisions made in one place: the public launch functions, their checks, the torch reference and the
argument packing take the same keywords; ``schedules`` is data that imports nothing of the package;
packing names its specializations from the one enumeration."""

from __future__ import annotations

import ast
import inspect
import pathlib

import pytest

import tvm_canary as tc
from tvm_canary import checks, reference
from tvm_canary.runtime import packing, specializations

FAMILIES = {
    "write": (tc.launch_canary_write_kernel, checks.check_write, reference.canary_write_ref, packing.write_call),
    "verify": (tc.launch_canary_verify_kernel, checks.check_verify, reference.canary_verify_ref, packing.verify_call),
    "plan": (tc.launch_canary_plan_kernels, checks.check_plan, reference.canary_plan_ref, packing.plan_call),
    "scatter": (tc.launch_scatter_req_token_ids_kernel, checks.check_scatter, reference.scatter_req_token_ids_ref,
                packing.scatter_call),
}


@pytest.mark.parametrize("kernel", list(FAMILIES))
def test_launch_check_reference_and_packing_take_the_same_keywords(kernel):
    def keywords(fn):
        params = inspect.signature(fn).parameters.values()
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params), fn
        return [p.name for p in params]

    launch, *others = FAMILIES[kernel]
    for fn in others:
        assert keywords(fn) == keywords(launch), fn.__qualname__


def test_schedules_import_nothing_from_the_package():
    folder = pathlib.Path(tc.__file__).parent / "schedules"
    for path in folder.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                outside = node.level > 1 or (node.module or "").startswith("tvm_canary")
                assert not outside, f"{path.name}: {ast.unparse(node)}"
            elif isinstance(node, ast.Import):
                assert not any(a.name.startswith("tvm_canary") for a in node.names), f"{path.name}: {ast.unparse(node)}"


def test_specializations_are_checked_against_the_enumeration():
    partial = specializations.spec("verify", num_sources=2, partial=True, check_token=True)
    assert partial == (2, True, True) and partial in specializations.all_specs("verify")
    assert len(specializations.all_specs("write")) == 18 and specializations.all_specs("scatter") == [()]
    with pytest.raises(ValueError, match="num_sources=5"):
        specializations.spec("write", num_sources=5, partial=False, input_assert=False)
    with pytest.raises(ValueError, match="folds no source in PARTIAL mode"):
        specializations.spec("verify", num_sources=0, partial=True, check_token=False)
    assert specializations.launch_mode("write", (2, True, False)) == 1
    assert specializations.launch_mode("write", (2, False, False)) == 2
    assert specializations.launch_mode("verify", (0, False, True)) == 0
    with pytest.raises(TypeError, match="has_lut"):
        specializations.spec("plan", has_lut=True)


def test_the_tracked_tree_fits_beside_the_gpu_bundle():
    """The tracked files stay under 2 MiB: a lent GPU call carries at most 64 MiB, and the TVM compiler
    bundle it runs with (``.gpu-bundle``, docs/gpu-validation.md) takes about 61 MiB of them. Old result
    files and session records are retired with a ``git show <commit>:<path>`` pointer."""
    import subprocess

    root = pathlib.Path(__file__).resolve().parents[1]
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    paths = [root / name for name in listed.decode().split("\0") if name]
    size = sum(path.stat().st_size for path in paths if path.is_file())
    assert size < 2 * 1024 * 1024, f"the tracked tree holds {size} bytes, over 2 MiB: retire old data or records"
