"""``Geometry`` is plain data (no TVM, no kernels imported; the TensorIR loop helpers live in
``kernels/common.py``), and its fields and ``key()`` stay as cache keys and tuning databases know them."""

from __future__ import annotations

import ast
import dataclasses
import pathlib

from tvm_canary import geometry
from tvm_canary.geometry import Geometry


def test_geometry_imports_only_the_standard_library():
    tree = ast.parse(pathlib.Path(geometry.__file__).read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported == {"__future__", "dataclasses"}


def test_fields_and_key():
    fields = ["gpu", "blocks", "threads", "tile", "unroll", "min_blocks", "thin", "pairs"]
    assert [f.name for f in dataclasses.fields(Geometry)] == fields
    methods = [name for name in vars(Geometry) if callable(vars(Geometry)[name]) and not name.startswith("_")]
    assert methods == ["fold_pairs", "key"]
    assert Geometry(gpu=True, blocks=528, threads=128, tile=256, unroll=8).key() == "cuda-b528-t128-k256-u8-m1"
    assert Geometry(gpu=False, unroll=4).key() == "cpu-b1-t1-k1-u4-m1"
    assert Geometry(gpu=True, blocks=528, threads=128, min_blocks=2, thin=1).key() == "cuda-b528-t128-k1-u1-m2-w1"
    paired = Geometry(gpu=True, blocks=528, threads=128, min_blocks=2, thin=1, pairs=1)
    assert paired.key() == "cuda-b528-t128-k1-u1-m2-w1-p1"


def test_folds_run_in_pairs_where_the_register_cap_allows():
    """``pairs`` asks for paired folds; they run where the cap leaves 128 registers per thread."""
    assert Geometry(gpu=True, threads=128, min_blocks=4, pairs=1).fold_pairs()
    assert not Geometry(gpu=True, threads=128, min_blocks=8, pairs=1).fold_pairs()
    assert not Geometry(gpu=True, threads=512, min_blocks=16, pairs=1).fold_pairs()
    assert not Geometry(gpu=True, threads=128, min_blocks=2).fold_pairs()
    assert Geometry(gpu=False, pairs=1).fold_pairs()
