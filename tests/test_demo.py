"""``tvm-canary demo`` and ``selftest`` end to end on CPU (short runs)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from tvm_canary import cli, session
from tvm_canary.testing import KINDS, Engine
from tvm_canary.violations import Violation

SHORT = ["--steps", "30", "--slots", "128", "--max-running", "6", "--device", "cpu", "--no-progress"]


@pytest.mark.parametrize("extra", [[], ["--swa", "--window", "4", "--real-kv", "all"]], ids=["full", "swa"])
def test_short_demo_detects_every_fault_kind(capsys, extra):
    assert cli.main(["demo", "--seed", "3", *SHORT, *extra]) == 0
    out = capsys.readouterr().out
    assert f"faults detected: {len(KINDS)}/{len(KINDS)}" in out
    assert "false positives: 0" in out
    for kind in KINDS:
        (line,) = [ln for ln in out.splitlines() if f"  {kind}  " in ln]
        assert "MISSED" not in line


def test_demo_is_repeatable(capsys):
    def table() -> list[str]:
        assert cli.main(["demo", "--seed", "5", *SHORT]) == 0
        return [ln for ln in capsys.readouterr().out.splitlines() if not ln.startswith("canary time")]

    assert table() == table()


def test_selftest_via_python_m():
    done = subprocess.run([sys.executable, "-m", "tvm_canary", "selftest", "--device", "cpu"], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "selftest: 4/4 faults detected" in done.stdout


@pytest.mark.parametrize("after,why", [(0, "on a clean"), (24, "no fault")])
def test_selftest_fails_a_verify_that_over_reports(monkeypatch, capsys, after, why):
    """Verify also flags a launch's first entry if it has over ``after`` (24: the last step's)."""

    def noisy(*, context, plan, _verify=session.launch_canary_verify_kernel, **kw):
        _verify(context=context, plan=plan, **kw)
        if plan.verify_num_valid[0] > after:
            at, kind = context.violation_write_index, int(context.kernel_kind)
            context.violation_ring[at[0]] = torch.tensor([kind, plan.verify_slot_indices[0], *[0] * 5, 1])
            at[0] += 1

    monkeypatch.setattr(session, "launch_canary_verify_kernel", noisy)
    assert cli.main(["selftest", "--device", "cpu"]) == 1
    assert capsys.readouterr().out.splitlines()[-1].startswith(f"selftest: FAILED, 4 rows {why}")


# -- CLI edges


def test_demo_cuda_without_gpu_is_one_line(monkeypatch, capsys):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    with pytest.raises(SystemExit) as done:
        cli.main(["demo", *SHORT[:-3], "--device", "cuda"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "argument --device: cuda: torch sees no CUDA device" in err


@pytest.mark.parametrize("option,value", [("--max-running", "0"), ("--steps", "0"), ("--slots", "1"),
                                          ("--window", "0"), ("--sweep-interval", "0"), ("--faults-per-kind", "-1"),
                                          ("--steps", "many")])
def test_demo_rejects_bad_numbers(capsys, option, value):
    with pytest.raises(SystemExit) as done:
        cli.main(["demo", option, value])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"argument {option}: " in err


def test_demo_help_shows_every_default(capsys):
    with pytest.raises(SystemExit):
        cli.main(["demo", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    parser = cli.build_parser()._subparsers._group_actions[0].choices["demo"]
    valued = [a for a in parser._actions if a.option_strings and a.nargs != 0]
    assert len(valued) >= 8 and all(a.help for a in parser._actions)
    for action in valued:
        shown = parser._get_formatter()._get_help_string(action) % {"default": action.default}
        assert "(default: " in shown and " ".join(shown.split()) in text, action.option_strings


def test_small_pool_counts_only_injected_faults(capsys):
    """In 16 slots some kinds find no target: the demo says why and still exits 0."""
    assert cli.main(["demo", "--seed", "3", "--steps", "30", "--slots", "16", "--device", "cpu", "--no-progress"]) == 0
    out = capsys.readouterr().out
    reasons = [ln for ln in out.splitlines() if "not injected: " in ln or "not counted: " in ln]
    assert reasons, out
    (summary,) = [ln for ln in out.splitlines() if ln.startswith("faults detected: ")]
    detected, counted = summary.split()[2].split("/")
    assert detected == counted and int(counted) + len(reasons) == len(KINDS)
    assert "MISSED" not in out


def test_notice_lands_above_the_progress_bar(capsys):
    """Log notices (e.g. "no tuned schedule") go via tqdm, never inside the bar."""
    import logging

    def noisy_schedule(self, _original=Engine.schedule):
        if self.step == 2:
            logging.getLogger("tvm_canary").warning("tvm_canary: a notice")
        return _original(self)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Engine, "schedule", noisy_schedule)
        assert cli.main(["demo", "--seed", "3", *SHORT[:-1]]) == 0
    err = capsys.readouterr().err
    (line,) = [ln for ln in err.replace("\r", "\n").splitlines() if "a notice" in ln]
    assert line.strip() == "tvm_canary: a notice"


def test_a_demo_that_checked_no_fault_fails(capsys):
    """Two slots: no fault finds a target, nothing is checked."""
    assert cli.main(["demo", "--slots", "2", "--steps", "30", "--device", "cpu", "--no-progress"]) == 1
    assert "no injected fault took effect in time to be checked" in capsys.readouterr().err


def test_a_demo_without_faults_needs_no_spare_steps(capsys):
    assert cli.main(["demo", "--steps", "5", "--faults-per-kind", "0", "--device", "cpu", "--no-progress"]) == 0


def test_a_row_goes_to_the_fault_that_hit_its_slot():
    """Two undetected faults whose victims' chains both hold a slot: the row goes to the fault that
    corrupted it and whose victim still holds it, not the older one (detected by a row it did not cause)."""
    import types

    from tvm_canary.testing.faults import Fault, FaultTracker
    from tvm_canary.violations import ViolationReport

    def holder(*slots):
        return types.SimpleNamespace(live=True, slots=list(slots), held=list(slots))

    older = Fault(kind="kv_flip", group="FULL", injected_at=1, target="", victims=[holder(24, 30)], slot=24)
    stale = Fault(kind="stale_chain", group="FULL", injected_at=2, target="", victims=[holder(30)], slot=30)
    stale.victims[0].held.remove(30)  # the entry keeps the slot in its chain but no longer holds it
    newer = Fault(kind="double_alloc", group="FULL", injected_at=3, target="", victims=[holder(30)], slot=30)
    tracker = FaultTracker()
    tracker.faults = [older, stale, newer]
    row = [1, 30, 5, 0, 0, 0, 0, 2]  # kernel_kind, slot 30, position, ..., fail bits
    report = ViolationReport(records=(Violation.from_row(row),), total=1, dropped=0, ring_capacity=4)
    engine = types.SimpleNamespace(owner_slot=lambda group, slot: slot)
    assert tracker.attribute(report, engine, step=4) == [newer]
    assert older.detected_at is None and stale.detected_at is None and not tracker.false_positives


def test_a_fault_of_a_kind_already_pending_is_not_injected(capsys):
    """The engine holds one pending double_alloc and one wrong_seed: a second one injected between the same two
    steps (faults due pile up at the demo's last injection step) replaced the first, which never acted yet was
    counted and reported MISSED (seed 5 here: two double_allocs at step 39)."""
    assert cli.main(["demo", "--seed", "5", "--max-running", "3", "--faults-per-kind", "5", "--steps", "45",
                     "--slots", "128", "--device", "cpu", "--no-progress"]) == 0
    assert "MISSED" not in capsys.readouterr().out
