import sys, subprocess, os
code = r'''
import sys, torch, tvm
sys.path.insert(0, ".")
kernel = sys.argv[1]
from tvm_canary.runtime import compile as C
from tvm_canary.runtime import targets
dev = torch.device("cuda", 0)
tgt = targets.target_for(dev)
geom = targets.geometry_for(kernel, tgt, 132)
spec = {"verify": (0, False), "write": (0, False), "plan": (False, False), "scatter": ()}[kernel]
ex = C.build(kernel, spec, tgt, geom)
print("imports", [m.kind if hasattr(m,'kind') else type(m) for m in ex.mod.imports], flush=True)
mode = sys.argv[2]
if mode == "direct":
    f = ex.mod["canary_" + kernel] if hasattr(ex, "mod") else ex["canary_" + kernel]
    fn = ex["canary_" + kernel]
else:
    fn = C.get_kernel(kernel, spec, dev)
print("got fn", flush=True)
import tvm_canary as tc
if kernel == "scatter":
    flat = torch.arange(10, device=dev); off = torch.tensor([0, 3, 10], device=dev); rpi = torch.tensor([1, 2], device=dev)
    pool = torch.zeros(4, 8, dtype=torch.int32, device=dev)
    fn(flat, off, rpi, pool); torch.cuda.synchronize(); print(pool.cpu())
if kernel == "verify":
    from tvm_canary.runtime.packing import canary_words, flags_for, source_args
    S=64; buf = torch.zeros(S, 32, dtype=torch.uint8, device=dev)
    vp = tc.VerifyPlan.allocate(verify_capacity=16, device=dev); vp.zero_for_testing_(); vp.enable.fill_(1); vp.verify_num_valid.fill_(5)
    vp.verify_slot_indices.copy_(torch.arange(16)); vp.verify_prev_slot_indices.fill_(-1)
    ring = torch.zeros(8, 8, dtype=torch.int64, device=dev); wi = torch.zeros(1, dtype=torch.int32, device=dev)
    sc = torch.zeros(1, dtype=torch.int64, device=dev); kc = torch.zeros(1, dtype=torch.int64, device=dev)
    ctx = tc.VerifyOrWriteContext(canary_buf=buf, kernel_kind=tc.CanaryLaunchTag.HEAD_K_FULL, violation_ring=ring, violation_write_index=wi, slot_run_counter=sc, kernel_run_counter=kc, real_kv_sources=(), real_kv_hash_mode=tc.consts.RealKvHashMode.NONE, enable_chain_position_assert=torch.ones(1, dtype=torch.int32, device=dev))
    args = [canary_words(buf), vp.verify_slot_indices, vp.verify_expected_tokens, vp.verify_expected_positions, vp.verify_prev_slot_indices, vp.verify_num_valid, vp.enable, ring, wi, sc, kc, flags_for(ring, 16), 0, *source_args(ctx)]
    print([ (type(a).__name__, getattr(a,'device',None), getattr(a,'shape',None)) for a in args], flush=True)
    fn(*args); torch.cuda.synchronize(); print(ring.cpu(), wi, sc, kc)
print("OK", kernel, mode, flush=True)
'''
open("/tmp/diag_inner.py", "w").write(code)
for k in ("scatter", "verify"):
    for mode in ("direct", "cached"):
        r = subprocess.run([sys.executable, "-X", "faulthandler", "/tmp/diag_inner.py", k, mode], capture_output=True, text=True, timeout=200)
        print("=====", k, mode, "rc", r.returncode); print(r.stdout[-3000:]); print(r.stderr[-2500:])
