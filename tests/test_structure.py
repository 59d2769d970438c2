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
    partial = specializations.spec("verify", num_sources=2, partial=True, check_token=True, fold_words=0)
    assert partial == (2, True, True, 0) and partial in specializations.all_specs("verify")
    # 18 without a built-in ALL fold word count, and 2 x 5 with one (two sources, input assert on or off)
    assert len(specializations.all_specs("write")) == 28 and specializations.all_specs("scatter") == [()]
    with pytest.raises(ValueError, match="num_sources=5"):
        specializations.spec("write", num_sources=5, partial=False, input_assert=False, fold_words=0)
    with pytest.raises(ValueError, match="PARTIAL mode needs a source"):
        specializations.spec("verify", num_sources=0, partial=True, check_token=False, fold_words=0)
    for num_sources, partial_fold in ((1, False), (2, True), (0, False)):  # built in only in ALL mode with a pair
        with pytest.raises(ValueError, match="built-in fold word count needs ALL mode with 2 sources"):
            specializations.spec("write", num_sources=num_sources, partial=partial_fold, input_assert=False,
                                 fold_words=32)
    with pytest.raises(ValueError, match="fold_words=48"):
        specializations.spec("verify", num_sources=2, partial=False, check_token=False, fold_words=48)
    assert specializations.launch_mode("write", (2, True, False, 0)) == 1
    assert specializations.launch_mode("write", (2, False, False, 32)) == 2
    assert specializations.launch_mode("verify", (0, False, True, 0)) == 0


def test_all_mode_builds_in_its_sources_common_fold_word_count_where_a_kernel_has_it():
    """``specializations.fold_words``: a pair of sources of one listed word count in ALL mode; anything
    else (PARTIAL, other source counts, counts that differ or are not listed) folds each source's own."""
    choose = specializations.fold_words
    assert [choose(2, False, [w, w]) for w in (16, 32, 64, 128, 256)] == [16, 32, 64, 128, 256]
    assert choose(2, False, [32, 64]) == 0 and choose(2, False, [48, 48]) == 0 and choose(2, False, [512, 512]) == 0
    assert choose(2, True, [2, 2]) == 0 and choose(1, False, [32]) == 0 and choose(3, False, [32] * 3) == 0
    assert choose(0, False, []) == 0
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
