"""An elastic fleet's run options, checks, faults and Job API surface, before anything starts (issue 44).

``--scale-rollout N@STEP`` and ``--preempt-notice`` are declared once (trainer/app/options.py); each bad use is one
ConfigError naming the flag and the fix: a scale without bounds or outside them, past the run, twice at one step; a
preemption with notice where no elastic fleet acts on it; a notice without a preemption. The ``preempt-engine``
injector reports its notice to the core (news ``preempt_notice`` with the engine's epoch, logged as
``engine.preempt_notice``), then SIGTERMs the server's process group at the deadline and SIGKILLs it later --
shown here on a real process group.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.core import ROLLOUT, Outcome
from lifecycle.decide.errors import ConfigError
from lifecycle.decide.events import PREEMPT_NOTICE, EventLog
from lifecycle.decide.faults import FAULT_FIRED, NOTICE_FAULTS
from rollout.pattern import PatternTask
from trainer.app import Fleet, Job, RunOptions
from trainer.app.checks import check_fleet, check_run
from trainer.app.faults import Fault, FaultInjector, expected, parse_fault
from trainer.app.fleet import Scale, parse_scale
from trainer.app.options import API_NAMES, FLAGS, add_run_arguments

FIXED = LifecycleConfig.from_mapping({"rollout_num_gpus": 2})
ELASTIC = {"rollout_num_gpus": 2, "rollout_min_num_gpus": 1, "rollout_max_num_gpus": 4}


def _elastic(**extra: Any) -> LifecycleConfig:
    return LifecycleConfig.from_mapping({**ELASTIC, **extra})


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    return parser.parse_args(list(argv))


def _refused(config: LifecycleConfig, match: str, **options: Any) -> ConfigError:
    with pytest.raises(ConfigError, match=match) as caught:
        check_fleet(config, RunOptions(**options))
    return caught.value


# -- the flags ---------------------------------------------------------------------------------------------------------
def test_scale_rollout_parses_repeated_and_round_trips_through_run_json() -> None:
    ns = _parse("--scale-rollout", "4@3", "--scale-rollout", "1@6", "--scale-rollout", "3@9", "--preempt-notice", "5")
    opts = RunOptions.from_args(ns)
    assert opts.scale == (Scale(4, 3), Scale(1, 6), Scale(3, 9))
    assert opts.preempt_notice == 5.0
    written = opts.manifest()
    assert written["scale"] == ["4@3", "1@6", "3@9"] and written["preempt_notice"] == 5.0
    back = RunOptions.from_manifest(written, Path("run.json"))
    assert back.scale == opts.scale and back.preempt_notice == 5.0
    old = {k: v for k, v in written.items() if k not in ("scale", "preempt_notice")}  # a run.json written before them
    assert RunOptions.from_manifest(old, Path("run.json")).scale == ()


@pytest.mark.parametrize("spec", ["4", "@3", "0@3", "4@-1", "x@3", "4@3@5", "4 @ 3", "1" + "0" * 50 + "@3"])
def test_a_bad_scale_spec_is_refused_naming_the_flag(spec: str) -> None:
    with pytest.raises(ConfigError, match="--scale-rollout") as caught:
        parse_scale(spec)
    assert "N@STEP" in caught.value.fix or "give" in caught.value.fix
    with pytest.raises(SystemExit):
        _parse("--scale-rollout", spec)


@pytest.mark.parametrize("seconds", ["0", "0.5", "3601", "nan", "inf", "-1"])
def test_preempt_notice_is_bounded_where_it_is_parsed(seconds: str) -> None:
    with pytest.raises(SystemExit):
        _parse("--preempt-notice", seconds)


@pytest.mark.parametrize("value", [0, 0.5, 3601.0, math.nan, math.inf, "30", True])
def test_preempt_notice_from_an_api_caller_is_checked_too(value: object) -> None:
    options = RunOptions(preempt_notice=value, faults=(Fault("preempt-engine", 0, 1),))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"--preempt-notice.*1\.\.3600"):
        check_fleet(FIXED, options)


def test_run_json_with_a_bad_scale_entry_is_refused_naming_resume() -> None:
    written = RunOptions(scale=(Scale(4, 3),)).manifest()
    with pytest.raises(ConfigError, match="--resume"):
        RunOptions.from_manifest({**written, "scale": ["4@x"]}, Path("run.json"))


# -- a fleet of fixed size: nothing scales it, no notice is acted on ---------------------------------------------------
def test_scale_rollout_without_bounds_names_both_bound_flags() -> None:
    error = _refused(FIXED, "--scale-rollout", scale=(Scale(3, 1),))
    assert "fixed size" in error.problem
    assert "--rollout-min-num-gpus" in error.fix and "--rollout-max-num-gpus" in error.fix


@pytest.mark.parametrize("kind", NOTICE_FAULTS)
def test_a_preemption_without_bounds_is_refused(kind: str) -> None:
    error = _refused(FIXED, "--inject", faults=(Fault(kind, 0, 1),))
    assert "elastic" in error.problem and "--rollout-max-num-gpus" in error.fix


def test_a_notice_without_a_preemption_has_no_effect() -> None:
    error = _refused(FIXED, "--preempt-notice", preempt_notice=10.0)
    assert "no effect" in error.problem
    check_fleet(FIXED, RunOptions())  # the default is not a choice the user made


def test_a_bad_scale_value_from_an_api_caller_is_refused() -> None:
    with pytest.raises(ConfigError, match="--scale-rollout"):
        check_fleet(FIXED, RunOptions(scale=[(4, 3)]))  # type: ignore[arg-type]


def test_check_run_runs_the_fleet_checks_for_every_caller(tmp_path: Path) -> None:
    """The CLI's flags, run_loop's RunOptions and a Job's options meet in check_run: the fleet's check is there."""
    options = RunOptions(run_dir=tmp_path / "run", scale=(Scale(3, 1),))
    with pytest.raises(ConfigError, match=r"RunOptions\.scale"):
        check_run(FIXED, options, names=API_NAMES)
    with pytest.raises(ConfigError, match="--scale-rollout"):
        check_run(FIXED, options, names=FLAGS)


def test_a_fixed_jobs_fleet_api_names_the_bound_flags(tmp_path: Path) -> None:
    job = Job(FIXED, PatternTask(seed=0), run_dir=tmp_path / "run")
    try:
        calls = {
            "Job.scale_rollout(n=)": job.scale_rollout(3),
            "Job.add_engines(n=)": job.add_engines(1),
            "Job.retire_engines(ids=)": job.retire_engines(["engine-1"]),
        }
        for name, call in calls.items():
            with pytest.raises(ConfigError) as caught:
                asyncio.run(call)
            assert caught.value.flag == name
            assert "--rollout-min-num-gpus" in caught.value.fix and "--rollout-max-num-gpus" in caught.value.fix
    finally:
        job._dirs.release()


# -- an elastic fleet: bounds, steps, one target per step --------------------------------------------------------------
def test_a_scale_within_the_bounds_passes_and_outside_them_names_the_bound() -> None:
    config = _elastic()
    check_fleet(config, RunOptions(steps=12, scale=(Scale(4, 3), Scale(1, 6), Scale(3, 9))))
    error = _refused(config, "--scale-rollout", steps=12, scale=(Scale(4, 3), Scale(5, 6)))
    assert error.value == "5@6" and "1..4 engines" in error.problem
    assert "--rollout-max-num-gpus" in error.fix


def test_a_scale_counts_engines_of_several_gpus() -> None:
    config = _elastic(rollout_num_gpus=4, rollout_min_num_gpus=2, rollout_max_num_gpus=8, rollout_num_gpus_per_engine=2)
    check_fleet(config, RunOptions(scale=(Scale(4, 1), Scale(1, 2))))
    error = _refused(config, "--scale-rollout", scale=(Scale(5, 1),))
    assert "1..4 engines" in error.problem and "2 GPU(s) per engine" in error.problem


def test_a_scale_past_the_run_or_twice_at_one_step_is_refused() -> None:
    config = _elastic()
    assert "past the run" in _refused(config, "--scale-rollout", steps=12, scale=(Scale(3, 12),)).problem
    assert "twice" in _refused(config, "--scale-rollout", steps=12, scale=(Scale(3, 4), Scale(2, 4))).problem


@pytest.mark.parametrize("kind", NOTICE_FAULTS)
def test_a_preemption_in_an_elastic_fleet_passes(kind: str) -> None:
    check_fleet(_elastic(), RunOptions(faults=(Fault(kind, 1, 2),), preempt_notice=5.0))


def test_an_elastic_fleet_with_kept_engines_is_refused() -> None:
    with pytest.raises(ConfigError, match="--detach-engines"):
        _elastic(detach_engines=True, save="runs/x/ckpt")


def test_job_scale_rollout_names_its_argument_and_the_bound(tmp_path: Path) -> None:
    job = Job(_elastic(), PatternTask(seed=0), run_dir=tmp_path / "run")
    try:
        for bad, why in ((5, "1..4 engines"), (0, "1..4 engines"), ("2", "an int"), (True, "an int")):
            with pytest.raises(ConfigError) as caught:
                asyncio.run(job.scale_rollout(bad))  # type: ignore[arg-type]
            assert caught.value.flag == "Job.scale_rollout(n=)" and why in caught.value.problem
    finally:
        job._dirs.release()


# -- the faults' promise ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", NOTICE_FAULTS)
def test_a_preemption_is_promised_to_recover_under_every_ft_configuration(kind: str) -> None:
    for ft in ("none", "train", "rollout", "both"):
        promise = expected(kind, ft)
        assert promise.outcome == "recovers"
        assert "before it is routed" in promise.text or "before they are routed" in promise.text
        assert "zero failed requests" in promise.text
    assert parse_fault(f"{kind}:1@2") == Fault(kind, 1, 2)


def test_fleet_is_exported_with_the_public_api() -> None:
    fleet = Fleet(target=2, members=("engine-0", "engine-1"), serving=("engine-0",), draining=(), vacant=("engine-2",))
    assert fleet.target == 2 and fleet.vacant == ("engine-2",)


# -- the preempt-engine injector on a real process group ---------------------------------------------------------------
class _Launcher:
    def __init__(self, pid: int) -> None:
        self.pid = pid

    async def server_pid(self) -> int:
        return self.pid


class _Engine:
    def __init__(self, pid: int, epoch: int) -> None:
        self.id, self.epoch, self.launcher, self.server = "engine-1", epoch, _Launcher(pid), None


class _Runner:
    def __init__(self) -> None:
        self.news: list[Outcome] = []

    async def report(self, outcome: Outcome) -> None:
        self.news.append(outcome)


class _Controller:
    def __init__(self, engine: _Engine) -> None:
        self.engines = [_Engine(0, 1), engine]
        self.runner = _Runner()
        self.events: list[dict[str, Any]] = []
        self.log = EventLog([self.events.append], timestamps=False)
        self.config = FIXED
        self.noted: tuple[str, int | None, float] | None = None

    def state_of(self, engine: Any) -> str:
        return "Draining"

    def routing(self) -> None:
        return None

    def note_notice(self, instance: str, epoch: int | None, deadline_s: float) -> None:
        self.noted = (instance, epoch, deadline_s)


def _server(*, ignores_term: bool) -> subprocess.Popen[bytes]:
    """A process group of its own (as a server leads one): a shell and its child."""
    trap = "trap '' TERM; " if ignores_term else ""
    script = f"{trap}sleep 60 & wait"
    return subprocess.Popen(["sh", "-c", script], start_new_session=True)


def _gone(proc: subprocess.Popen[bytes], within: float) -> bool:
    deadline = time.monotonic() + within
    while proc.poll() is None:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


async def _preempt(proc: subprocess.Popen[bytes], wait: float, *, close_early: bool = False) -> _Controller:
    controller = _Controller(_Engine(proc.pid, epoch=7))
    injector = FaultInjector(notice=0.4, term_grace=0.6)
    record = await injector.inject(Fault("preempt-engine", 1, 2), controller, None)  # type: ignore[arg-type]
    assert record.detail["server_pid"] == proc.pid and record.detail["notice_s"] == 0.4
    if close_early:
        await injector.aclose()
    await asyncio.sleep(wait)
    await injector.aclose()
    return controller


def test_the_notice_is_news_with_the_epoch_and_on_the_record_before_anything_is_killed() -> None:
    proc = _server(ignores_term=False)
    try:
        controller = asyncio.run(_preempt(proc, 0.8, close_early=True))
        assert controller.runner.news == [
            Outcome("preempt_notice", ROLLOUT, 1, "preemption notice: taken in 0.4 s (injector)", epoch=7)
        ]
        assert controller.noted == ("engine-1", 7, 0.4)  # the drain is bounded by the deadline
        notice = [e for e in controller.events if e["event"] == PREEMPT_NOTICE]
        assert notice == [
            {"event": PREEMPT_NOTICE, "instance": "engine-1", "epoch": 7, "deadline_s": 0.4, "by": "injector"}
        ]
        assert proc.poll() is None, "a deadline the run outlived struck after it (aclose must cancel it)"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_at_the_deadline_the_server_group_gets_sigterm() -> None:
    proc = _server(ignores_term=False)
    try:
        controller = asyncio.run(_preempt(proc, 1.2))
        assert _gone(proc, 2.0)
        fired = [e for e in controller.events if e["event"] == FAULT_FIRED]
        assert [e["signal"] for e in fired] == ["SIGTERM"], fired  # it left on SIGTERM: no SIGKILL needed
        assert fired[0]["pid"] == proc.pid and fired[0]["state"] == "Draining"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_a_server_that_ignores_sigterm_gets_sigkill_after_the_grace() -> None:
    proc = _server(ignores_term=True)
    try:
        controller = asyncio.run(_preempt(proc, 1.5))
        assert _gone(proc, 2.0)
        fired = [e["signal"] for e in controller.events if e["event"] == FAULT_FIRED]
        assert fired == ["SIGTERM", "SIGKILL"]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_a_server_gone_before_the_deadline_is_not_signalled() -> None:
    proc = _server(ignores_term=False)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    controller = asyncio.run(_preempt(proc, 0.8))
    assert not [e for e in controller.events if e["event"] == FAULT_FIRED]


def test_the_injector_module_does_not_import_the_loop() -> None:
    """The CLI parses --inject and --scale-rollout before the loop's imports (torch, Ray)."""
    code = "import sys, trainer.app.options; print('trainer.app.loop' in sys.modules, 'ray' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ)
    assert out.stdout.split() == ["False", "False"]
