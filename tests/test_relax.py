"""Relax: a toy serving step (plan -> verify -> KV append -> write) in one Relax function.

Canary kernels from ``tvm_canary.relax``, called in place; the KV append is this test's TensorIR function. Built (llvm;
cuda on a GPU host) and run twice in the Relax VM on torch tensors: every tensor byte-equal to the torch reference's.
"""

from __future__ import annotations

import errno
import os

import pytest
import torch
import tvm
from tvm import relax
from tvm.script import tirx as T

import tvm_canary as tc
from tvm_canary import reference
from tvm_canary import relax as canary_relax
from tvm_canary.consts import RealKvHashMode
from tvm_canary.runtime import compile as compile_cache
from tvm_canary.runtime import packing, targets

from tree import assert_same_bytes, devices, require

SLOTS, ROWS, MAX_LEN, BS, EXTEND, RING, WORDS = 128, 4, 16, 3, 2, 32, 8  # WORDS: int64 words of a KV strip
TOKENS = BS * EXTEND
TAG = tc.CanaryLaunchTag.TAIL_K_FULL


def kv_append_kernel(gpu: bool):
    """The toy model: ``kv[ocl[i]] = new[i]`` for every token with a slot (one thread per token)."""
    threads = 64

    # fmt: off
    @T.prim_func(private=False)
    def kv_append(kv_h: T.handle, ocl_h: T.handle, new_h: T.handle):
        s = T.int64()
        w = T.int64()
        n = T.int64()
        kv = T.match_buffer(kv_h, (s, w), "int64")
        ocl = T.match_buffer(ocl_h, (n,), "int64")
        new = T.match_buffer(new_h, (n, w), "int64")
        for b in (T.thread_binding((n + threads - 1) // threads, thread="blockIdx.x") if gpu else T.serial(1)):
            for t in (T.thread_binding(threads, thread="threadIdx.x") if gpu else T.serial(n)):
                i = b * threads + t if gpu else t
                if i < n and ocl[i] >= T.int64(0) and ocl[i] < s:
                    for j in T.serial(w):
                        kv[ocl[i], j] = new[i, j]
    # fmt: on

    return kv_append.with_attr("tirx.is_scheduled", True)


def build_step(tag: str) -> tuple[tvm.IRModule, list[str]]:
    """The Relax module, whose ``main`` returns every tensor the step writes, and its parameter names."""
    bb = relax.BlockBuilder()
    plan = canary_relax.add_kernel(bb, "plan", (False, False), tag)
    verify = canary_relax.add_kernel(bb, "verify", (1, False, False, 0), tag)
    write = canary_relax.add_kernel(bb, "write", (1, False, False, 0), tag)
    append = bb.add_func(kv_append_kernel(tag != "llvm"), "kv_append")
    i64 = "int64"
    p = dict(
        kv=(SLOTS, WORDS, i64), new_kv=(TOKENS, WORDS, i64), canary=(SLOTS, 4, i64), ring=(RING, 8, i64),
        write_index=(1, "int32"), slot_counter=(1, i64), kernel_counter=(1, i64), flags=(None, "int32"),
        vslots=(SLOTS, i64), vtoks=(SLOTS, i64), vpos=(SLOTS, i64), vprev=(SLOTS, i64), v_num_valid=(1, "int32"),
        v_enable=(1, "int32"), woff=(BS + 1, i64), wseeds=(BS, i64), w_num_valid_reqs=(1, "int32"),
        rpi=(BS, i64), prefix=(BS, i64), ext=(BS, i64), r2t=(ROWS, MAX_LEN, "int32"), scratch=(BS + 1, i64),
        ids=(TOKENS, i64), pos=(TOKENS, i64), ocl=(TOKENS, i64), cpa=(1, "int32"),
    )
    params = {}
    for name, (*shape, dtype) in p.items():
        shape = [tvm.tirx.Var("nf", "int64")] if shape == [None] else shape
        params[name] = relax.Var(name, relax.TensorType(shape, dtype))
    x = params
    with bb.function("main", list(params.values())):
        planned = canary_relax.call_kernel(
            bb, plan, vslots=x["vslots"], vtoks=x["vtoks"], vpos=x["vpos"], vprev=x["vprev"],
            v_num_valid=x["v_num_valid"], v_enable=x["v_enable"], woff=x["woff"], wseeds=x["wseeds"],
            w_num_valid_reqs=x["w_num_valid_reqs"], rpi=x["rpi"], prefix=x["prefix"], ext=x["ext"], r2t=x["r2t"],
            lut=x["prefix"], pool=x["r2t"], vlens=x["prefix"], scratch=x["scratch"], window=0, token_offset=0,
        )
        source = dict(src0=x["kv"], ps0=1, tw0=WORDS, fw0=WORDS)  # ALL mode: the whole strip
        verified = canary_relax.call_kernel(
            bb, verify, buf=x["canary"], slots=planned["vslots"], etoks=planned["vtoks"], epos=planned["vpos"],
            prevs=planned["vprev"], num_valid=planned["v_num_valid"], enable=planned["v_enable"], ring=x["ring"],
            write_index=x["write_index"], slot_counter=x["slot_counter"], kernel_counter=x["kernel_counter"],
            flags=x["flags"], kind=int(TAG), **source,
        )
        kv = bb.emit(relax.call_tir_inplace(append, [x["kv"], x["ocl"], x["new_kv"]], [0], x["kv"].ty))
        written = canary_relax.call_kernel(
            bb, write, buf=x["canary"], offsets=planned["woff"], seeds=planned["wseeds"],
            num_valid_reqs=planned["w_num_valid_reqs"], ids=x["ids"], pos_in=x["pos"], ocl=x["ocl"], etoks=x["ids"],
            epos=x["pos"], cpa=x["cpa"], ring=verified["ring"], write_index=verified["write_index"],
            slot_counter=verified["slot_counter"], kernel_counter=verified["kernel_counter"], flags=verified["flags"],
            kind=int(TAG), **dict(source, src0=kv),
        )
        bb.emit_func_output(relax.Tuple([kv, *planned.values(), *written.values()]))
    return bb.finalize(), list(params)


def make_state(device: str) -> dict[str, torch.Tensor]:
    """Everything the step reads or writes, zero plans, a KV pool of random bytes."""
    gen = torch.Generator().manual_seed(3)
    r2t = (torch.randperm(SLOTS - 1, generator=gen)[: ROWS * MAX_LEN] + 1).to(torch.int32).view(ROWS, MAX_LEN)

    def z(*shape, dtype=torch.int64):
        return torch.zeros(shape, dtype=dtype)

    s = dict(
        kv=torch.randint(0, 256, (SLOTS, 8 * WORDS), generator=gen, dtype=torch.uint8),
        canary=z(SLOTS, 32, dtype=torch.uint8), ring=torch.full((RING, 8), -7, dtype=torch.int64),
        write_index=z(1, dtype=torch.int32), slot_counter=z(1), kernel_counter=z(1),
        vslots=z(SLOTS), vtoks=z(SLOTS), vpos=z(SLOTS), vprev=z(SLOTS), v_num_valid=z(1, dtype=torch.int32),
        v_enable=z(1, dtype=torch.int32), woff=z(BS + 1), wseeds=z(BS), w_num_valid_reqs=z(1, dtype=torch.int32),
        r2t=r2t, rpi=torch.arange(1, BS + 1), cpa=torch.ones(1, dtype=torch.int32),
    )
    return {k: v.to(device) for k, v in s.items()}


def step_inputs(s: dict[str, torch.Tensor], step: int) -> dict[str, torch.Tensor]:
    """Step ``step`` (0, 1, ...): every row writes positions [EXTEND * step, EXTEND * (step + 1))."""
    dev = s["kv"].device
    prefix = torch.full((BS,), EXTEND * step, device=dev)
    pos = (prefix[:, None] + torch.arange(EXTEND, device=dev)).flatten()
    rows = s["rpi"].repeat_interleave(EXTEND)
    gen = torch.Generator().manual_seed(100 + step)
    return dict(
        prefix=prefix, ext=torch.full((BS,), EXTEND, device=dev), pos=pos, ids=1000 * rows + pos,
        ocl=s["r2t"][rows, pos].long(), new_kv=torch.randint(0, 256, (TOKENS, 8 * WORDS), generator=gen,
                                                            dtype=torch.uint8).to(dev),
    )


def reference_step(s: dict[str, torch.Tensor], x: dict[str, torch.Tensor]) -> None:
    context = tc.VerifyOrWriteContext(
        canary_buf=s["canary"], kernel_kind=TAG, violation_ring=s["ring"], violation_write_index=s["write_index"],
        slot_run_counter=s["slot_counter"], kernel_run_counter=s["kernel_counter"],
        real_kv_sources=(tc.RealKvSource(tensor=s["kv"], page_size=1, num_bytes_per_token=8 * WORDS,
                                         read_bytes=8 * WORDS),),
        real_kv_hash_mode=RealKvHashMode.ALL, enable_chain_position_assert=s["cpa"],
    )
    vplan = tc.VerifyPlan(verify_slot_indices=s["vslots"], verify_expected_tokens=s["vtoks"],
                          verify_expected_positions=s["vpos"], verify_prev_slot_indices=s["vprev"],
                          verify_num_valid=s["v_num_valid"], enable=s["v_enable"])
    wplan = tc.WritePlan(write_offsets=s["woff"], write_seed_slot_indices=s["wseeds"],
                         write_num_valid_reqs=s["w_num_valid_reqs"])
    reference.canary_plan_ref(
        verify_plan_out=vplan, write_plan_out=wplan, req_pool_indices=s["rpi"], prefix_lens=x["prefix"],
        extend_seq_lens=x["ext"], req_to_token=s["r2t"], swa_window_size=0, full_to_swa_index_mapping=None,
        verify_capacity=SLOTS, req_to_verify_expected_tokens=None, req_to_verify_expected_tokens_valid_lens=None,
        kv_token_id_vs_position_offset=0,
    )
    reference.canary_verify_ref(context=context, plan=vplan, check_verify_expected_token=False)
    s["kv"][x["ocl"]] = x["new_kv"]
    reference.canary_write_ref(
        context=context, plan=wplan, input_ids=x["ids"], positions=x["pos"], out_cache_loc=x["ocl"],
        enable_write_input_assert=False, expected_input_tokens=None, expected_input_positions=None,
    )


def relax_step(vm, names: list[str], s: dict[str, torch.Tensor], x: dict[str, torch.Tensor], flags=None) -> None:
    words = {"kv", "new_kv", "canary"}  # passed as their int64 views
    flags = packing.flags_for(s["ring"], SLOTS, seed_saves=BS) if flags is None else flags
    args = dict(s, **x, flags=flags, scratch=torch.empty(BS + 1, dtype=torch.int64, device=s["kv"].device))
    vm["main"](*[args[n].view(torch.int64) if n in words else args[n] for n in names])


def corrupt(s: dict[str, torch.Tensor]) -> None:
    """Between steps: a canary field of row 1's first slot, and a KV byte of row 2's second slot."""
    s["canary"].view(torch.int64)[int(s["r2t"][1, 0]), 1] += 5
    s["kv"][int(s["r2t"][2, 1]), 9] ^= 0x10


@pytest.mark.parametrize("device", devices())
def test_relax_serving_step_equals_the_reference(device):
    require(device)
    tag = targets.tag_for(torch.device(device))
    target = targets.target_from_tag(tag)
    mod, names = build_step(tag)
    if device == "cuda":
        compile_cache.ensure_cuda_runtime()
    with target:  # device code compiled for the tag's arch (as runtime.compile.build does)
        executable = tvm.compile(mod, target=target)
    vm = relax.VirtualMachine(executable, tvm.cpu() if device == "cpu" else tvm.cuda(0))
    want, got = make_state("cpu"), make_state(device)
    for step in range(3):
        x = step_inputs(want, step)
        reference_step(want, x)
        relax_step(vm, names, got, {k: v.to(device) for k, v in x.items()})
        if device == "cuda":
            torch.cuda.synchronize()
        if step == 0:
            corrupt(want)
            corrupt(got)
    assert int(want["write_index"][0]) > 0  # the corruptions were found
    assert_same_bytes(list(got.values()), list(want.values()))
    # No launch check runs on a Relax call: kernels check their own shape relations (SPEC D4). A one-word
    # flags scratch lacks room for the chunk marks verify (its first user in the step) would store past its end.
    short = torch.zeros(1, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="kv-canary: verify: flags is shorter than the launch's marks need"):
        relax_step(vm, names, got, {k: v.to(device) for k, v in step_inputs(want, 3).items()}, flags=short)


def test_relax_ir_cache_survives_damage_and_a_read_only_cache(tmp_path, monkeypatch, caplog):
    """The kept TensorIR (``<key>.tir.json``) is a cache: a damaged file is re-parsed and rewritten, one
    that cannot be stored costs a parse, a stored file is readable by others (not ``tempfile``'s 0600)."""
    monkeypatch.setenv("TVM_CANARY_CACHE", str(tmp_path))
    geom = targets.default_geometry("scatter", "llvm", 0, None)
    umask = os.umask(0o022)
    try:
        want = tvm.ir.save_json(canary_relax._default_ir("scatter", (), "llvm", geom))
    finally:
        os.umask(umask)
    path = next(tmp_path.rglob("*.tir.json"))
    assert path.stat().st_mode & 0o777 == 0o644
    path.write_text(path.read_text()[:100])
    with caplog.at_level("WARNING", logger="tvm_canary"):
        assert tvm.ir.save_json(canary_relax._default_ir("scatter", (), "llvm", geom)) == want
    assert "does not load" in caplog.text and path.read_text() == want
    path.unlink()

    def read_only(*args, **kwargs):  # a cache on a read-only file system
        raise OSError(errno.EROFS, "Read-only file system", str(tmp_path))

    monkeypatch.setattr(canary_relax.tempfile, "NamedTemporaryFile", read_only)
    assert tvm.ir.save_json(canary_relax._default_ir("scatter", (), "llvm", geom)) == want
    assert not path.exists()


def test_relax_add_kernel_rejects_a_tuple_that_is_not_a_specialization():
    """A spec of another arity or value (e.g. one written before the ``fold_words`` axis) is named in a clear
    error before any parsing."""
    bb = relax.BlockBuilder()
    with pytest.raises(ValueError, match=r"kv-canary: verify has no specialization \(1, False, False\)"):
        canary_relax.add_kernel(bb, "verify", (1, False, False), "llvm")
    with pytest.raises(ValueError, match="fold_words"):
        canary_relax.add_kernel(bb, "write", (1, False, False, 32), "llvm")  # built in only with 2 sources
    with pytest.raises(ValueError, match=r"no specialization None"):
        canary_relax.add_kernel(bb, "verify", None)
    with pytest.raises(ValueError, match="unknown target tag 'cuda'"):  # would give CPU TensorIR
        canary_relax.add_kernel(bb, "verify", (1, False, False, 0), "cuda")


def verify_tensor_vars(bb, verify, sources: dict) -> dict:
    """Relax variables for an added verify kernel's tensor parameters (no source but ``sources``, a
    name -> shape map)."""
    shapes = {"buf": (SLOTS, 4), "ring": (RING, 8), **sources}
    dtypes = {"num_valid": "int32", "enable": "int32", "write_index": "int32", "flags": "int32"}
    vectors = ("slots", "etoks", "epos", "prevs", "slot_counter", "kernel_counter")
    return {n: relax.Var(n, relax.TensorType(shapes.get(n, (SLOTS,)), dtypes.get(n, "int64")))
            for n in canary_relax.parameters(bb, verify) if n in shapes or n in dtypes or n in vectors}


def test_relax_call_needs_the_parameters_of_a_given_source():
    """An unused source slot's four parameters may be left out; a given ``src<i>`` needs its ``ps<i>``,
    ``tw<i>`` and ``fw<i>`` (left-out ones would take the unused slot's values and fold nothing)."""
    bb = relax.BlockBuilder()
    verify = canary_relax.add_kernel(bb, "verify", (1, False, False, 0), "llvm")
    x = verify_tensor_vars(bb, verify, {"src0": (SLOTS, WORDS)})
    with bb.function("main", list(x.values())):
        with pytest.raises(TypeError, match="kv-canary: missing argument 'ps0'"):
            canary_relax.call_kernel(bb, verify, kind=int(TAG), **x)
        bb.emit_func_output(relax.Tuple([x["ring"]]))


def test_relax_call_needs_the_sources_its_specialization_folds():
    """Left out, such a slot took the unused slot's placeholder: every entry was reported INVALID_INDEX."""
    bb = relax.BlockBuilder()
    verify = canary_relax.add_kernel(bb, "verify", (1, False, False, 0), "llvm")
    x = verify_tensor_vars(bb, verify, {})
    with bb.function("main", list(x.values())):
        with pytest.raises(TypeError, match="kv-canary: missing argument 'src0'"):
            canary_relax.call_kernel(bb, verify, kind=int(TAG), **x)
        bb.emit_func_output(relax.Tuple([x["ring"]]))


def test_relax_one_specialization_in_two_geometries_is_two_functions():
    """Two sizes whose default CUDA geometries differ give two functions, each its own symbol; the same
    geometry again (the spec's mode, ALL, by default) is the existing function; another mode is refused.
    No GPU needed."""
    bb = relax.BlockBuilder()
    spec = (1, False, False, 0)
    small = canary_relax.add_kernel(bb, "verify", spec, "cuda-sm_90", size=1024)
    large = canary_relax.add_kernel(bb, "verify", spec, "cuda-sm_90", size=2**20)
    assert canary_relax.add_kernel(bb, "verify", spec, "cuda-sm_90", mode=2, size=1024).same_as(small)
    with pytest.raises(ValueError, match=r"kv-canary: verify \(1, False, False, 0\) runs in mode 2 .*, not 1"):
        canary_relax.add_kernel(bb, "verify", spec, "cuda-sm_90", mode=1)
    mod = bb.finalize()
    symbols = sorted(str(f.attrs["global_symbol"]) for f in mod.functions.values())
    assert len(symbols) == 2 and symbols[0] == "canary_verify_1_0_0_0", symbols
    assert symbols[1].startswith("canary_verify_1_0_0_0_cuda_b"), symbols
    assert not small.same_as(large)
    with pytest.raises(ValueError, match="kv-canary: no kernel 'nosuch'"):
        canary_relax.add_kernel(bb, "nosuch")
