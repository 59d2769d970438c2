"""``tvm-canary conformance``: the same seeded cases on every device, compared digest by digest.

Each kernel runs its golden cases (pinned to SPEC 1.5's hash vectors), ``--cases`` differential cases (valid plans,
seeds ``S..S+N-1``) and ``--cases`` garbage plans between guard bands (seeds ``GARBAGE_SEED_BASE+S..``) on each device
and the torch reference (CPU). A case's digest is the SHA-256 of its tensors' SHA-256s after the launch (a real-KV
source's: of its whole storage). A case fails on a device if its digest differs from the reference's (plan's LUT indices
past the end clamped as SPEC D4 pins, ``cases.reference_launch``), a guard band or input was written, write or verify
left ring scratch flags non-zero, the launch raised, or a golden case's pinned value is wrong.

Under ``torchrun`` each process runs its own device (``cuda:LOCAL_RANK``, else the CPU) and the reference;
every rank gathers and compares all results (one exit status); rank 0 prints the table, writes the JSON.

``--against EARLIER.json`` (an earlier ``--json``: another GPU, host, driver or version): rank 0 reads and checks it
(``report_problem``), refuses a run of other case sets before running (``against_problem``), then compares every row's
case digests with its reference's (``against``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import hashlib
import json
import os
import pathlib
import platform
import socket
import sys

import torch

from . import cases as C
from . import checks
from .argtypes import fits_int64
from .cliargs import duration, int_at_least, output_file, require_module_builds, seed, summary
from .console import counted
from .runtime import targets, use_backend
from .runtime.compile import error_line
from .tuning.keys import cpu_model

REFERENCE_DEVICE = "reference"


@dataclasses.dataclass
class CaseResult:
    """A case on a device: ``digest`` (hex) of its tensors after the launch, each one's short digest by
    name, ``error`` if the launch raised (``digest`` None) or broke a guard/pinned value."""

    case: str
    digest: str | None
    tensors: dict[str, str]
    error: str | None = None


def tensor_digest(t: torch.Tensor) -> str:
    """SHA-256 (hex) of a tensor's bytes in row-major order."""
    return hashlib.sha256(t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes()).hexdigest()


def case_digest(kernel: str, kw: dict) -> tuple[str, dict[str, str]]:
    """(the case's digest, 16 hex digits of each tensor argument's by name, ``checks.launch_tensors``).
    A real-KV source's is of its whole storage (``cases.storage_bytes``): bytes around a column slice count."""
    written, read = checks.launch_tensors(kernel, kw)
    sources = {id(s.tensor) for s in kw["context"].real_kv_sources} if "context" in kw else set()
    each = {name: tensor_digest(C.storage_bytes(t) if id(t) in sources else t) for t, name in written + read}
    return hashlib.sha256("".join(each.values()).encode()).hexdigest(), {n: d[:16] for n, d in each.items()}


def digest_differs(got: dict[str, str], want: dict[str, str], whose: str = "the reference") -> str:
    """Why a case's digest differs from ``whose`` digest: the tensors (by name) whose digests differ."""
    names = [name for name, d in got.items() if want.get(name) != d] + [name for name in want if name not in got]
    return f"digest differs from {whose}" + (f" in {', '.join(names[:8])}" if names else "")


def case_ids(kernel: str, cases: int, seed: int) -> list[str]:
    """The case ids of a run, in order: ``golden:NAME``, ``diff:SEED``, ``garbage:SEED``."""
    ids = [f"golden:{name}" for name in C.GOLDEN.get(kernel, {})]
    ids += [f"diff:{seed + i}" for i in range(cases)]
    return ids + [f"garbage:{C.GARBAGE_SEED_BASE + seed + i}" for i in range(cases)]


def build(kernel: str, case: str, device) -> tuple[dict, object]:
    """(launch kwargs on ``device``, check) for a case id; check(kw) -> list of problems after the launch."""
    kind, _, arg = case.partition(":")
    if kind == "golden":
        kw, pinned = C.GOLDEN[kernel][arg](device)
        return kw, lambda kw: [p for p in (pinned(kw),) if p]
    if kind == "diff":
        return C.CASES[kernel](torch.Generator().manual_seed(int(arg)), device), lambda kw: []
    if kind == "garbage":
        kw, guarded, inputs = C.guarded_case(kernel, device, int(arg))
        return kw, lambda kw: C.guard_violations(guarded, inputs)
    if kind == "long" and kernel == "write":
        return C.write_case(torch.Generator().manual_seed(int(arg)), device, long_chains=True), lambda kw: []
    raise ValueError(f"kv-canary: unknown case id {case!r} for {kernel} (expected golden:NAME, diff:SEED, garbage:SEED "
                     "or, for write, long:SEED)")


def reference_case(kernel: str, case: str) -> tuple[dict, object]:
    """(CPU launch kwargs, check) of a case for the reference: ``build``'s, a garbage plan without guard bands."""
    kind, _, arg = case.partition(":")
    if kind == "garbage":
        return C.CASES[kernel](torch.Generator().manual_seed(int(arg)), "cpu", valid=False), lambda kw: []
    return build(kernel, case, "cpu")


def case_set(kernel: str, ids: list[str]) -> str:
    """What identifies a kernel's cases (16 hex digits of a SHA-256 over each id and its tensors' digest
    before the launch): equal exactly where the cases are (whatever ``cases.py`` or torch did); combined
    digests compare only at equal values."""
    text = "".join(f"{case}={case_digest(kernel, reference_case(kernel, case)[0])[0]};" for case in ids)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def run_reference(kernel: str, case: str) -> tuple[CaseResult, dict]:
    """The torch reference (``cases.reference_launch``) on ``reference_case``, and the finished kwargs.
    A golden case's pinned value applies too."""
    kw, check = reference_case(kernel, case)
    C.reference_launch(kernel, kw)
    return CaseResult(case, *case_digest(kernel, kw), "; ".join(check(kw)) or None), kw


def run_device(kernel: str, case: str, device: str, want: dict, launches: dict | None = None) -> CaseResult:
    """The tvm kernel on ``device``; ``want``: the reference's finished case (settles garbage scatter plans'
    races); ``launches`` (tests only) replaces ``cases.LAUNCH``."""
    launch = (launches or C.LAUNCH)[kernel]
    dev = torch.device(device)
    try:
        kw, check = build(kernel, case, dev)
        with use_backend("tvm"), (torch.cuda.device(dev) if dev.type == "cuda" else contextlib.nullcontext()):
            launch(**kw)
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
        problems = check(kw) + C.scratch_left_dirty(kw)
        if kernel == "scatter" and case.startswith("garbage:"):
            C.settle_scatter_races(kw, want)
    except Exception as e:  # noqa: BLE001 -- a raise fails the case
        return CaseResult(case, None, {}, f"{type(e).__name__}: {e}")
    return CaseResult(case, *case_digest(kernel, kw), "; ".join(problems) or None)


def describe(device: str) -> dict:
    """Device name, model, arch (``sm_90``, ``x86_64``) of a device string."""
    dev = torch.device(device)
    if dev.type == "cuda":
        index = targets.device_index(dev)
        return {"device": device, "model": torch.cuda.get_device_name(index), "arch": targets.cuda_arch(index)}
    return {"device": device, "model": cpu_model(), "arch": platform.machine()}


def run_local(devices: list[str], kernels: list[str], ids: dict[str, list[str]], launches=None) -> dict:
    """This process's results: the reference and each device, per kernel, per case."""
    reference: dict[str, list[CaseResult]] = {}
    results = {d: {} for d in devices}
    for kernel in kernels:
        reference[kernel] = []
        for d in devices:
            results[d][kernel] = []
        for case in ids[kernel]:
            ref, want = run_reference(kernel, case)
            reference[kernel].append(ref)
            for d in devices:
                results[d][kernel].append(run_device(kernel, case, d, want, launches))
    rows = [{**describe(d), "kernels": {k: [dataclasses.asdict(r) for r in v] for k, v in results[d].items()}}
            for d in devices]
    ref_row = {"device": REFERENCE_DEVICE, "model": f"torch {torch.__version__}", "arch": platform.machine(),
               "kernels": {k: [dataclasses.asdict(r) for r in v] for k, v in reference.items()}}
    return {"devices": [ref_row, *rows]}


def combined(records: list[dict]) -> str:
    """SHA-256 over the digests of the cases (first 16 hex digits); a case that raised counts as ``-``."""
    text = "".join(r["digest"] or "-" for r in records)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def replay(device: str, kernel: str, case: str) -> str:
    """The command that reruns ``case`` of ``kernel`` on ``device`` (the reference's: ``cpu``) in one process."""
    name = "cpu" if device == REFERENCE_DEVICE else device
    return f"python -m tvm_canary conformance --devices {name} --kernels {kernel} --case {case}"


def replay_across_ranks(kernel: str, case: str) -> str:
    """The replay of a failure between two processes (a rank's reference vs rank 0's): started as the run
    was, on every host (alone, the row matches itself)."""
    return (f"torchrun <this run's options, on every host> -m tvm_canary conformance <this run's --devices> "
            f"--kernels {kernel} --case {case}")


def other_cases(ranks: list[dict]) -> str | None:
    """The ``kv-canary:`` error if a rank is to run other kernels, case ids or cases (``case_set``) than
    rank 0 (``compare`` matches by position), else None. ``ranks``: each one's ``rank``, ``host``,
    ``cases`` (ids) and ``case_set``, per kernel."""
    def ran(ids: dict[str, list[str]]) -> str:
        """Each kernel's case count and first seeded case (golden ones are the same on every rank)."""
        def first(v: list[str]) -> str:
            return next((c for c in v if not c.startswith("golden:")), v[0])

        return ", ".join(f"{k} {len(v)} cases" + (f" from {first(v)}" if v else "") for k, v in ids.items()) or (
            "no kernel")

    first = ranks[0]
    for rank in ranks[1:]:
        where = f"rank {rank['rank']} ({rank['host']})", f"rank 0 ({first['host']})"
        if rank["cases"] != first["cases"]:
            return (f"kv-canary: {where[0]} runs {ran(rank['cases'])}, {where[1]} {ran(first['cases'])}; start every "
                    "host with the same --kernels, --cases, --seed and --case")
        if rank["case_set"] != first["case_set"]:
            kernels = [k for k in first["case_set"] if rank["case_set"][k] != first["case_set"][k]]
            return (f"kv-canary: {where[0]} generates other {', '.join(kernels)} cases than {where[1]} under the "
                    "same ids (case sets differ: another tvm_canary/cases.py or torch); run the same checkout and "
                    "torch on every host")
    return None


def compare(ranks: list[dict], kernels: list[str]) -> dict:
    """Compare each rank's rows (its reference too) with rank 0's reference, case by case."""
    ref_row = ranks[0]["devices"][0]
    rows, failures = [], []
    for rank in ranks:
        for row in rank["devices"]:
            for kernel in kernels:
                mine, bad = row["kernels"][kernel], 0
                for got, want in zip(mine, ref_row["kernels"][kernel]):
                    why = got["error"]
                    if not why and got["digest"] != want["digest"]:
                        why = digest_differs(got["tensors"], want["tensors"])
                    if why:
                        bad += 1
                        if rank["rank"] != 0 and row["device"] == REFERENCE_DEVICE:
                            command = replay_across_ranks(kernel, got["case"])
                        else:
                            command = replay(row["device"], kernel, got["case"])
                        failures.append({"rank": rank["rank"], "host": rank["host"], "device": row["device"],
                                         "kernel": kernel, "case": got["case"], "why": why, "replay": command})
                rows.append({"rank": rank["rank"], "host": rank["host"], "device": row["device"],
                             "model": row["model"], "arch": row["arch"], "kernel": kernel, "cases": len(mine),
                             "combined": combined(mine), "mismatches": bad})
    return {"rows": rows, "failures": failures}


def report_problem(report: object) -> str | None:
    """Why ``report`` (a parsed earlier ``--json``) cannot be compared with, else None: no report (a field
    read missing or mistyped), or its combined digests and mismatch count not its cases' (edited)."""
    try:
        kernels, ranks = list(report["kernels"]), report["ranks"]
        rows = [row for rank in ranks for row in rank["devices"]]
        cases = [c for row in rows for k in kernels for c in row["kernels"][k]]  # the fields read, typed
        text = [r["host"] for r in ranks] + [row[f] for row in rows for f in ("device", "model", "arch")]
        text += [v for c in cases for v in (c["case"], *c["tensors"].values(), *{c["digest"], c["error"]} - {None})]
        if not all(isinstance(v, str) for v in text) or not all(isinstance(r["rank"], int) for r in ranks):
            raise TypeError
        verdict = compare(ranks, kernels)
        stated = [row for k in kernels for row in report["kernels"][k]["combined"]]
        consistent = (sorted(map(_row_key, verdict["rows"])) == sorted(map(_row_key, stated))
                      and len(verdict["failures"]) == report["mismatches"])
    except (TypeError, KeyError, IndexError, AttributeError, ValueError):  # ValueError: lone surrogates
        return "not a conformance report (the --json of tvm-canary conformance)"
    if not consistent:
        return "its combined digests or mismatch count are not those of its per-case digests (edited?)"
    return None


def _row_key(row: dict) -> tuple:
    return row["rank"], row["device"], row["kernel"], row["cases"], row["combined"], row["mismatches"]


def against_problem(earlier: dict, case_sets: dict[str, str]) -> str | None:
    """The ``kv-canary:`` refusal of a run whose kernels (``case_sets``: per kernel) cannot be compared with
    ``earlier`` (``--against``): one it did not run, another or no case set."""
    for kernel, mine in case_sets.items():
        entry = earlier["kernels"].get(kernel)
        theirs = entry and entry.get("case_set")
        if theirs != mine:
            ran = f"its {kernel} case set is {theirs}" if theirs else f"it ran no {kernel} case" if entry is None else (
                f"it records no {kernel} case set (a version before case sets)")
            return (f"kv-canary: cannot compare with {earlier['path']}: {ran}, this run's {mine} (run with its "
                    "--kernels, --cases, --seed and --case, on the same checkout and torch)")
    return None


def against(ranks: list[dict], kernels: list[str], earlier: dict) -> list[dict]:
    """Each case of this run's rows (``ranks``) whose digest differs from ``earlier``'s rank 0 reference
    (equal case sets): rank, host, device, kernel, case, why. One raising here is not listed (``compare``'s)."""
    want = {k: earlier["ranks"][0]["devices"][0]["kernels"][k] for k in kernels}
    differences = []
    for rank in ranks:
        for row in rank["devices"]:
            for kernel in kernels:
                for got, theirs in zip(row["kernels"][kernel], want[kernel]):
                    if got["digest"] is not None and got["digest"] != theirs["digest"]:
                        differences.append({
                            "rank": rank["rank"], "host": rank["host"], "device": row["device"], "kernel": kernel,
                            "case": got["case"],
                            "why": digest_differs(got["tensors"], theirs["tensors"], f"{earlier['path']}'s reference"),
                        })
    return differences


def earlier_report(text: str) -> dict | None:
    """argparse ``type=`` of ``--against``: an earlier ``--json`` with its ``path``, read and checked on rank 0
    (or outside torchrun); None on other ranks."""
    if world()[0] != 0:
        return None
    try:
        report = json.loads(pathlib.Path(text).read_text())
    except (OSError, ValueError, RecursionError) as e:
        raise argparse.ArgumentTypeError(f"kv-canary: cannot read {text}: {e}") from None
    problem = report_problem(report)
    if problem:
        raise argparse.ArgumentTypeError(f"kv-canary: {text}: {problem}")
    return {**report, "path": text}


def table(rows: list[dict]) -> str:
    head = ("rank", "device", "model", "arch", "kernel", "cases", "combined digest", "mismatches")
    body = [(str(r["rank"]), r["device"], r["model"][:32], r["arch"], r["kernel"], str(r["cases"]), r["combined"],
             str(r["mismatches"])) for r in rows]
    widths = [max(len(x) for x in col) for col in zip(head, *body)]
    return "\n".join("  ".join(x.ljust(w) for x, w in zip(line, widths)).rstrip() for line in (head, *body))


# -- torch.distributed


def world() -> tuple[int, int, int]:
    """(rank, world size, local rank) from torchrun's environment; (0, 1, 0) outside torchrun."""
    env = os.environ
    return int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1)), int(env.get("LOCAL_RANK", 0))


def local_device() -> str:
    """This process's device under torchrun: ``cuda:LOCAL_RANK`` if GPUs are visible (``device_name``
    refuses it if torch sees no such GPU), else ``cpu``."""
    return device_name(f"cuda:{world()[2]}") if torch.cuda.is_available() else "cpu"


DEFAULT_TIMEOUT_SECONDS = 600.0
MAX_TIMEOUT_SECONDS = 1e7  # about 116 days; a datetime.timedelta, torch's timeout, overflows past 8.6e13


def init_distributed(timeout: float = DEFAULT_TIMEOUT_SECONDS):
    """Join torchrun's process group (NCCL between GPUs, gloo on CPU); a gloo group for gathering objects,
    None outside torchrun. ``timeout`` (s) bounds every wait, joining too (torch's default: 30 min)."""
    import torch.distributed as dist

    if world()[1] == 1:
        return None
    limit = datetime.timedelta(seconds=timeout)
    with _group_errors("joining the process group", timeout):
        if torch.cuda.is_available():
            torch.cuda.set_device(world()[2])
            dist.init_process_group("nccl", device_id=torch.device(local_device()), timeout=limit)
            return dist.new_group(backend="gloo", timeout=limit)
        dist.init_process_group("gloo", timeout=limit)
        return dist.group.WORLD


def gather(obj, group) -> list:
    """Every rank's ``obj`` (rank order) on every rank."""
    import torch.distributed as dist

    if group is None:
        return [obj]
    out = [None] * world()[1]
    with _group_errors("gathering the ranks' results", None):
        dist.all_gather_object(out, obj, group=group)
    return out


def finish(group) -> None:
    import torch.distributed as dist

    if group is not None:
        with _group_errors("the closing barrier", None):
            dist.barrier()  # on the default group: NCCL between GPUs
        dist.destroy_process_group()


@contextlib.contextmanager
def _group_errors(what: str, timeout: float | None):
    """A process-group failure (torch's ``RuntimeError``, ``DistError`` too) as one ``kv-canary:`` line
    naming this rank: a run unable to run (status 2), not a failing case (1)."""
    try:
        yield
    except RuntimeError as e:
        rank, size, _ = world()
        limit = f" within --timeout {timeout:g} s" if timeout is not None else ""
        raise ValueError(f"kv-canary: rank {rank} of {size}: {what} failed{limit}: {error_line(e)} (another rank "
                         "stopped, never started, or took longer than --timeout)") from e


# -- command line


def device_name(text: str) -> str:
    """One device of ``--devices``/``--device``, normalised: ``cpu`` (``cpu:0`` too), ``cuda:N`` (``cuda``:
    torch's current). ValueError (``kv-canary:``) otherwise, or for a CUDA index torch does not see."""
    try:
        dev = torch.device(text)
    except RuntimeError:
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise ValueError(f"kv-canary: unsupported device {text!r} (cpu, cuda, cuda:N)")
    if dev.type == "cpu":
        if dev.index not in (None, 0):
            raise ValueError(f"kv-canary: {text}: the CPU is one device (cpu)")
        return "cpu"
    count = torch.cuda.device_count()
    index = torch.cuda.current_device() if dev.index is None and count else dev.index or 0
    if index >= count:
        raise ValueError(f"kv-canary: {text}: torch sees {count} CUDA devices")
    return f"cuda:{index}"


def parse_devices(text: str | None) -> list[str]:
    """``--devices``: comma-separated ``cpu``/``cuda``/``cuda:N`` (``device_name``), each device once.
    Default: the process's own device under torchrun, else the CPU and every visible GPU."""
    if text is None:
        if world()[1] > 1:
            return [local_device()]
        return ["cpu"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    out = []
    for name in filter(None, (s.strip() for s in text.split(","))):
        device = device_name(name)
        if device in out:
            raise ValueError(f"kv-canary: device {device!r} named twice")
        out.append(device)
    if not out:
        raise ValueError(f"kv-canary: no device in {text!r} (cpu, cuda, cuda:N)")
    return out


def device_list(text: str) -> list[str]:
    """argparse ``type=`` of a device list (usage error on garbage)."""
    try:
        return parse_devices(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def rank0_output_file(text: str) -> pathlib.Path:
    """argparse ``type=`` of a file rank 0 writes (``--json``, fuzz's ``--out``): ``cliargs.output_file`` on
    rank 0 (or outside torchrun); other ranks' hosts need not have its folder (a rank stops there)."""
    return output_file(text) if world()[0] == 0 else pathlib.Path(text)


def add_timeout(p) -> None:
    """``--timeout`` of a command that joins torchrun's group (``init_distributed``)."""
    p.add_argument("--timeout", type=duration(zero=False, most=MAX_TIMEOUT_SECONDS), default=DEFAULT_TIMEOUT_SECONDS,
                   metavar="SECONDS",
                   help="under torchrun: how long a rank waits for the others (joining, gathering) before it "
                        "stops with torch's error")


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("conformance",
                              help="compare every kernel's output bytes across devices and the reference",
                              description=summary(__doc__))
    p.add_argument("--devices", type=device_list, default=None,
                   help="comma-separated cpu,cuda:0,... (default: the CPU and every visible GPU; under torchrun each "
                        "process's own GPU, or the CPU)")
    p.add_argument("--cases", type=int_at_least(0), default=20,
                   help="differential and garbage cases per kernel (0: the golden cases only)")
    p.add_argument("--seed", type=seed, default=0, help="first differential seed")
    p.add_argument("--kernels", type=kernel_list, default=",".join(C.KERNELS),
                   help="comma-separated subset of " + ",".join(C.KERNELS))
    p.add_argument("--case", type=case_id, default=None,
                   help="run only this case id (replay), e.g. diff:17 or garbage:50017")
    p.add_argument("--json", type=rank0_output_file, default=None, metavar="OUT",
                   help="write the results as JSON (rank 0)")
    p.add_argument("--against", type=earlier_report, default=None, metavar="EARLIER",
                   help="also compare every case with the reference of an earlier run's --json (another GPU, "
                        "host or version; same case sets), read by rank 0")
    add_timeout(p)
    p.set_defaults(func=run)


def case_id(text: str) -> str:
    """argparse ``type=`` of ``--case``: ``golden:NAME``, ``diff:SEED``, ``garbage:SEED``, ``long:SEED`` (write's)."""
    kind, _, arg = text.partition(":")
    golden = {name for by_name in C.GOLDEN.values() for name in by_name}
    seeded = kind in ("diff", "garbage", "long") and arg.lstrip("-").isdigit()
    if seeded and not fits_int64(int(arg)):
        raise argparse.ArgumentTypeError(f"kv-canary: case id {text!r}: the seed must fit in int64 (torch's seeds)")
    if not ((kind == "golden" and arg in golden) or seeded):
        raise argparse.ArgumentTypeError(
            f"kv-canary: case id {text!r}: expected golden:NAME (NAME in {', '.join(sorted(golden))}), diff:SEED, "
            "garbage:SEED or long:SEED (write)"
        )
    return text


def kernel_list(text: str) -> list[str]:
    """argparse ``type=`` of ``--kernels``: a comma-separated subset of ``cases.KERNELS``."""
    kernels = list(dict.fromkeys(k for k in text.split(",") if k))  # each once, in order
    unknown = sorted(set(kernels) - set(C.KERNELS))
    if unknown or not kernels:
        raise argparse.ArgumentTypeError(f"kv-canary: unknown kernels {unknown} (choose from {', '.join(C.KERNELS)})")
    return kernels


def run(args: argparse.Namespace, launches: dict | None = None) -> int:
    """Run, gather, compare; rank 0 prints and writes JSON. ``launches``: tests only (see run_device)."""
    kernels = args.kernels
    if args.case and args.case.startswith(("golden:", "long:")):
        if args.case.startswith("golden:"):
            kernels = [k for k in kernels if args.case[len("golden:"):] in C.GOLDEN.get(k, {})]
        else:
            kernels = [k for k in kernels if k == "write"]  # long cases are write's
        if not kernels:
            raise ValueError(f"kv-canary: no kernel of --kernels {','.join(args.kernels)} has the case {args.case}")
    devices = args.devices if args.devices is not None else parse_devices(None)  # refused before joining
    require_module_builds()
    group = init_distributed(args.timeout)
    rank, size, local_rank = world()
    ids = {k: [args.case] if args.case else case_ids(k, args.cases, args.seed) for k in kernels}
    if not any(ids.values()):
        raise ValueError(f"kv-canary: no case to run: --cases 0 and no golden case for {','.join(kernels)}")
    plan = {"rank": rank, "host": socket.gethostname(), "cases": ids,
            "case_set": {k: case_set(k, ids[k]) for k in kernels}}
    earlier = args.against
    plans = gather({**plan, "against": earlier and against_problem(earlier, plan["case_set"])}, group)
    refused = plans[0]["against"] or other_cases(plans)
    if refused:  # before running; every rank gathered the same plans: all leave the group, raise it
        finish(group)
        raise ValueError(refused)
    ranks = gather({**plan, "local_rank": local_rank, **run_local(devices, kernels, ids, launches)}, group)
    verdict = compare(ranks, kernels)
    mismatches = len(verdict["failures"])
    differences = against(ranks, kernels, earlier) if earlier else []
    differ = gather(len(differences), group)[0]  # rank 0's count: every rank exits with one status
    if rank == 0:  # the JSON first: a reader gone by the table leaves it whole
        if args.json:
            report = {
                "devices": [{"rank": r["rank"], "host": r["host"], **{k: d[k] for k in ("device", "model", "arch")}}
                            for r in ranks for d in r["devices"]],
                "kernels": {k: {"cases": ids[k], "case_set": plan["case_set"][k],
                                "combined": [row for row in verdict["rows"] if row["kernel"] == k]} for k in kernels},
                "mismatches": mismatches,
                "failures": verdict["failures"],
                "ranks": ranks,
                **({"against": {"file": earlier["path"], "differences": differences}} if earlier else {}),
            }
            with open(args.json, "w") as f:
                json.dump(report, f, indent=1)
        print(table(verdict["rows"]))
        print("case sets (combined digests compare between runs of equal case sets): "
              + ", ".join(f"{k} {v}" for k, v in plan["case_set"].items()))
        if mismatches:
            first = verdict["failures"][0]
            print(f"conformance: FAILED, {counted(mismatches, 'mismatching case')}; first: rank {first['rank']} "
                  f"{first['device']} {first['kernel']} {first['case']}: {first['why']}\n  replay: {first['replay']}",
                  file=sys.stderr)
        else:
            total = sum(len(v) for v in ids.values())
            devices = sum(len(r['devices']) - 1 for r in ranks)
            print(f"conformance: OK, {counted(total, 'case')} x {counted(devices, 'device')} on "
                  f"{counted(size, 'process')} match the reference")
        if earlier:
            print_against(earlier, differences, sum(len(r["devices"]) for r in ranks), sum(map(len, ids.values())))
    finish(group)
    return 1 if mismatches or differ else 0


def print_against(earlier: dict, differences: list[dict], rows: int, cases: int) -> None:
    """``--against``'s verdict: all cases equal the earlier reference, or the first that differs (stderr)."""
    hosts = sorted({rank["host"] for rank in earlier["ranks"]})  # the ranks: what report_problem checked
    models = sorted({row["model"] for rank in earlier["ranks"] for row in rank["devices"]
                     if row["device"] != REFERENCE_DEVICE})
    where = f"{earlier['path']} ({', '.join(hosts)}: {', '.join(models) or 'the reference only'})"
    if earlier["mismatches"]:
        print(f"against: {where} had {counted(earlier['mismatches'], 'mismatching case')} of its own")
    if differences:
        first = differences[0]
        print(f"against: FAILED, {counted(len(differences), 'case')} differ from {where}; first: rank {first['rank']} "
              f"{first['device']} {first['kernel']} {first['case']}: {first['why']}", file=sys.stderr)
    else:
        print(f"against: OK, {counted(cases, 'case')} x {counted(rows, 'row')} (the references included) equal "
              f"the reference of {where}")
