"""The reliability matrix: every fault kind of ``lifecycle.decide.faults.FAULT_KINDS`` under the 4 FT configurations
(the broadcast ones in broadcast runs), plus the engine faults a run without a trainer must survive
(``--debug-rollout-only``); each cell a real short run (``reliability_report.CELLS`` lists them).

Every cell runs the real loop (Ray trainer worker, 2 CPU engine processes speaking SGLang's
HTTP API) for 3 steps with the fault injected at the start of step 1, and asserts the outcome
that ``trainer.app.faults.expected`` promises -- recovered with all steps done, or stopped fast with
an error naming the engine/worker, the state and the reason. Inside every run the
``matrix_audit`` rollout function checks weight versions (``/model_info`` of every Serving
engine) and sample accounting; from the event log each cell checks that a restarted engine is
never routed before it loaded the weights and that the fault maps to a transition with a reason.
In a stream (``--fully-async``: the *streaming* modes) no rollout function runs; those cells audit the stream
from the event log, ``metrics.jsonl`` and the job's last checkpoint instead (:func:`check_stream_accounting`).
``lose-node`` and ``preempt-node`` cells run ``lifecycle run --ray-nodes 3`` (2 for ``preempt-node``) in a subprocess
(a process can start Ray only once, and this session already has its local cluster).

The cells run two at a time (:func:`cell_runs`: a cell mostly waits -- on start-ups, a hang's bound, a backoff),
the in-process ones each in a cell runner process that joins the session's Ray cluster (one ``ray.init`` per
process); each test then makes its cell's checks, in order, on what the run left behind. A cell that does not end
within :attr:`CellRunner.TIMEOUT` fails, naming the cell and the end of its runner's log.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import io
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from matrix_audit import AUDIT_ENV, find_problems
from reliability_report import CELLS, DOC, CellResult, contract_rows, parse

from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.errors import ConfigError
from lifecycle.decide.events import (
    DRAINED,
    GROUP_BUFFERED,
    GROUP_DROPPED,
    GROUP_TAKEN,
    PREEMPT_NOTICE,
    TRANSITION,
    read_jsonl,
)
from lifecycle.decide.faults import FAULTS, KINDS, NOTICE_FAULTS
from lifecycle.decide.machines import ENGINE as ENGINE_SPEC
from lifecycle.observe.monitor import EventMonitor
from tests.helpers import short_tmp
from trainer.app.faults import (
    BROADCAST_FAULTS,
    FT_CONFIGS,
    MODES,
    NOTICE_FLEET,
    TRAINER_FAULTS,
    Fault,
    check_faults,
    expected,
    ft_config,
    parse_fault,
)
from trainer.group import TrainerFailed

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
STEPS, AT, ENGINE = 3, 1, 1  # 3 steps, fault at the start of step 1, on engine-1


def steps_for(kind: str) -> int:
    """One more step when recovery lands in the last step's update (so the recovered engine serves again)."""
    return STEPS + 1 if kind in ("crash-during-update", "crash-during-broadcast") else STEPS


CELL = {
    "rollout_num_gpus": 2,
    "rollout_health_check_interval": 2.0,
    "rollout_health_check_timeout": 2.0,
    "rollout_health_check_failure_threshold": 2,
    "rollout_health_check_first_wait": 0.0,
    "engine_restart_backoff": 0.1,
}
# A real vLLM server's health_generate probe is a real completion that queues behind the rollout's requests: it took
# over 2 s on healthy servers during a rollout here. Its /health answers from the API server at once (and not at all
# when the server is stopped), so the vLLM cells probe that.
VLLM_CELL = {"rollout_health_check_endpoint": "health"}
# gateway-checks: the lifecycle's own probes slower than SMG's 1 s checks, so that SMG's verdict is what acts
MODE_CELL = {
    "vllm": VLLM_CELL,
    "streaming-vllm": VLLM_CELL,
    "gateway-checks": {"rollout_health_check_interval": 10.0, "rollout_health_check_timeout": 10.0},
}
REQUEST_TIMEOUT = 8.0  # the engine client's bound: a hung engine is noticed by this (or by the probes)
VLLM_REQUEST_TIMEOUT = 30.0  # a real vLLM server's rollout of 64 samples takes 5-15 s on 2 shared cores
STOP_WITHIN = 90.0  # seconds from injection to the run's error, generous for 2 shared cores
REASON = {  # what the transition's reason must say, per fault (any one of the alternatives)
    "kill-engine": ("actor died",),
    # a bounded wait ran out: a request's or probe's, or (the router in the path) the registration of the hung
    # engine as it entered Serving -- the router could not reach it
    "hang-engine": ("no answer within", "was not ready within"),
    "hang-serving": ("no answer within",),
    "kill-http": ("exit code -9",),
    "fail-update": ("refused the weights",),  # the server's own answer follows
    "lose-node": ("actor died",),
}
# mid-stream the engine is killed with requests in flight: the first to notice may be one of them, failed by SMG
STREAM_REASON = {"kill-engine": ("call_upstream_request_error",)}
# the engine states a weight update runs in (the spec's live and transient ones), and the offloaded one
UPDATE_STATES = ENGINE_SPEC.tagged("live") & ENGINE_SPEC.tagged("transient")


def on_vllm(mode: str) -> bool:
    """The mode runs real vLLM servers (``vllm``, ``streaming-vllm``)."""
    return MODES[mode].get("rollout_backend") == "vllm"


def keeps(mode: str) -> bool:
    """The mode keeps the engines across the driver's death (``--detach-engines``)."""
    return bool(MODES[mode].get("detach_engines"))


def streams(mode: str) -> bool:
    """The mode streams (``--fully-async``): no rollout function runs, so the cell audits the event log, the
    metrics and the job's last checkpoint instead (:func:`check_stream_accounting`)."""
    return bool(MODES[mode].get("fully_async"))


@dataclass
class Run:
    fault: Fault
    ft: str
    mode: str
    error: BaseException | str | None
    seconds: float
    events: list[dict[str, Any]]
    audit: list[dict[str, Any]]
    steps_done: int
    stopped_at: float = field(default_factory=time.time)

    def transitions(self, instance: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("instance") == instance and e.get("event") == "lifecycle.transition"]

    def first(self, event: str) -> dict[str, Any]:
        found = [e for e in self.events if e.get("event") == event]
        assert found, f"no {event} event in the run"
        return found[0]


def cell_config(fault: str, ft: str, mode: str = "normal") -> dict[str, Any]:
    values = {**CELL, **FT_CONFIGS[ft], **MODES[mode], **MODE_CELL.get(mode, {})}
    if fault == "crash-during-offload":
        values["offload_rollout"] = True
    if KINDS[fault].notice:  # a notice is acted on by an elastic fleet only
        values |= NOTICE_FLEET
    return values


def _read(run_dir: Path, audit: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
    events = read_jsonl(run_dir / "events.jsonl") if (run_dir / "events.jsonl").exists() else []
    rows = [json.loads(line) for line in audit.read_text().splitlines()] if audit.exists() else []
    metrics = run_dir / "metrics.jsonl"
    done = len(metrics.read_text().splitlines()) if metrics.exists() else 0
    return events, rows, done


def run_here(fault: Fault, ft: str, mode: str, tmp: Path, vllm_python: str | None = None) -> Run:
    """The cell's run in this process (a cell runner, :func:`run_in_runner`): the real loop,
    ``run_loop``, on the Ray cluster this process joined."""
    from engines.engine import Timeouts
    from trainer.app.loop import RunOptions, run_loop

    audit = tmp / "audit.jsonl"
    os.environ[AUDIT_ENV] = str(audit)  # this process runs this one cell
    values = cell_config(fault.kind, ft, mode)
    if streams(mode):  # the job's last checkpoint records the stream: what the cell's accounting reads
        values |= {"save": str(tmp / "run" / "ckpt"), "save_interval": steps_for(fault.kind)}
    config = LifecycleConfig.from_mapping(values)
    vllm = on_vllm(mode)  # real vLLM servers: their own start-up bound, a Hugging Face model they can serve
    opts = RunOptions(
        steps=steps_for(fault.kind),
        seed=0,
        run_dir=tmp / "run",
        faults=(fault,),
        timeouts=Timeouts(startup=300.0, request=VLLM_REQUEST_TIMEOUT, death=10.0)
        if vllm
        else Timeouts(startup=120.0, request=REQUEST_TIMEOUT, death=10.0),
        rollout_fn=None if streams(mode) else "matrix_audit:factory",  # a stream sends the prompts itself
        quiet=True,
        model="tiny-llama" if vllm else "char",
        vllm_python=vllm_python,
    )
    error: BaseException | None = None
    t0 = time.monotonic()
    try:
        asyncio.run(run_loop(config, opts, io.StringIO()))
    except Exception as exc:  # the outcome under test: which error, and what it says
        error = exc
    seconds, stopped_at = time.monotonic() - t0, time.time()
    return Run(fault, ft, mode, error, seconds, *_read(tmp / "run", audit), stopped_at=stopped_at)


DONE = "matrix-cell-done"  # what a cell runner prints once a cell's result is written


def _runner_main(ray_address: str) -> None:
    """``python test_matrix.py RAY_ADDRESS``: a cell runner. It joins the session's Ray cluster once, then runs the
    cells whose spec files it reads from stdin one after another by :func:`run_here` -- as the test session itself
    ran them before, one Ray job, imports warm -- writing each outcome (the error as its class and text: the parent
    checks both) to the spec's ``result`` file."""
    from engines.actor import init_local_cluster

    # the DONE lines go to a descriptor of their own; anything else printing to stdout lands in the runner's log
    # (nobody reads the pipe between cells: a chatty child must not fill it and block)
    done = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    init_local_cluster(address=ray_address)
    for line in sys.stdin:
        spec = json.loads(Path(line.strip()).read_text())
        fault = Fault(spec["kind"], spec["index"], spec["step"])
        run = run_here(fault, spec["ft"], spec["mode"], Path(spec["tmp"]), spec["vllm_python"])
        error: dict[str, str] | None = None
        if run.error is not None:
            cls = type(run.error)
            error = {"module": cls.__module__, "name": cls.__qualname__, "text": str(run.error)}
        result = {"error": error, "seconds": run.seconds, "stopped_at": run.stopped_at}
        Path(spec["result"]).write_text(json.dumps(result))
        print(DONE, file=done, flush=True)


def _runner_error(error: dict[str, str] | None) -> BaseException | str | None:
    """The runner's error as an instance of its own class with its own text (what the checks look at: its type, its
    message); a class that cannot be rebuilt so comes back as text naming it (and a check of the type fails)."""
    if error is None:
        return None
    with contextlib.suppress(Exception):
        found: Any = importlib.import_module(error["module"])
        for part in error["name"].split("."):
            found = getattr(found, part)
        if isinstance(found, type) and issubclass(found, BaseException):
            rebuilt = found.__new__(found)  # its __init__ may take other arguments than the message
            rebuilt.args = (error["text"],)
            if str(rebuilt) == error["text"]:
                return rebuilt
    return f"{error['module']}.{error['name']}: {error['text']}"


def _child_environ() -> dict[str, str]:
    """This process's environment for a cell's processes, less pytest's per-test variable (a child is no test of
    this session). Read on the session's thread: see :class:`Lane`."""
    env = dict(os.environ)
    env.pop("PYTEST_CURRENT_TEST", None)
    return env


class CellRunner:
    """One cell runner process (:func:`_runner_main`) of a lane of :func:`cell_runs`: a cell at a time."""

    TIMEOUT = 480.0  # a cell that never ends (a hung run) fails, and the runner is replaced (the longest: ~150 s)

    def __init__(self, ray_address: str, where: Path, environ: Mapping[str, str]) -> None:
        env = {**environ, "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT)])}
        env.pop("RAY_ADDRESS", None)
        env.pop(AUDIT_ENV, None)
        self.log = where / "runner.log"
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), ray_address],
                env=env,
                cwd=where,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,  # a killpg on close ends it and any child still in its group
            )

    def run(self, spec: Path) -> str | None:
        """Run one cell; None once its result is written, else what went wrong (the runner is then closed)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(f"{spec}\n".encode())
            self.proc.stdin.flush()
        except OSError as exc:
            return self._failed(f"the cell runner took no cell: {exc!r}")
        out, deadline, fd = b"", time.monotonic() + self.TIMEOUT, self.proc.stdout.fileno()
        while DONE.encode() not in out:
            left = deadline - time.monotonic()
            if left <= 0:
                return self._failed(f"the cell did not end within {self.TIMEOUT:g}s")
            if select.select([fd], [], [], left)[0]:
                chunk = os.read(fd, 65536)
                if not chunk:
                    return self._failed(f"the cell runner exited ({self.proc.wait()})")
                out = out[-1000:] + chunk
        return None

    def _failed(self, why: str) -> str:
        self.close()
        return f"{why}; its log ends: {self.log.read_text(errors='replace')[-3000:]}"

    def close(self) -> None:
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(30)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # whatever of its group is left
        self.proc.wait()


def run_in_runner(fault: Fault, ft: str, mode: str, tmp: Path, runner: CellRunner, vllm_python: str | None) -> Run:
    """The cell's run in a cell runner (:func:`run_here`: the loop in a process of its own on the session's Ray
    cluster, so that two cells can run at once -- a run sets its process's audit variable, owns its asyncio loop
    and its engines); the checks are made here, on what it left in its run directory."""
    spec, result = tmp / "cell.json", tmp / "cell-result.json"
    fields = {"kind": fault.kind, "index": fault.index, "step": fault.step, "ft": ft, "mode": mode, "tmp": str(tmp)}
    spec.write_text(json.dumps({**fields, "vllm_python": vllm_python, "result": str(result)}))
    failed = runner.run(spec)
    events, audit, steps = _read(tmp / "run", tmp / "audit.jsonl")
    if failed is not None or not result.exists():
        raise RuntimeError(f"no result from the cell runner: {failed}")
    done = json.loads(result.read_text())
    error = _runner_error(done["error"])
    return Run(fault, ft, mode, error, done["seconds"], events, audit, steps, stopped_at=done["stopped_at"])


def ray_nodes(kind: str) -> int:
    """The cell's ``--ray-nodes``: a head and 2 worker nodes for a node lost unannounced (``lose-node``: its engine is
    relaunched on the other worker); a head and 1 worker for a drained one (``preempt-node``: both engines are
    noticed at once, and their replacements join on the head -- the issue's node loss with ``--ray-nodes 2``)."""
    return 2 if KINDS[kind].notice else 3


def run_subprocess(fault: Fault, ft: str, tmp: Path, environ: Mapping[str, str]) -> Run:
    """``lifecycle run --ray-nodes N`` (:func:`ray_nodes`), the engines on the worker nodes."""
    audit = tmp / "audit.jsonl"
    cmd = [sys.executable, "-m", "lifecycle.cli", "run", "--config", "none", *_flags(cell_config(fault.kind, ft))]
    cmd += [
        "--steps",
        str(steps_for(fault.kind)),
        "--ray-nodes",
        str(ray_nodes(fault.kind)),
        "--inject",
        str(fault),
        "--run-dir",
        str(tmp / "run"),
    ]
    cmd += ["--rollout-function", "matrix_audit:factory", "--quiet"]
    env = {**environ, AUDIT_ENV: str(audit), "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT)])}
    env.pop("RAY_ADDRESS", None)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=tmp)
    seconds = time.monotonic() - t0
    error = None if proc.returncode == 0 else f"exit {proc.returncode}: {proc.stderr.strip()[-2000:]}"
    return Run(fault, ft, "normal", error, seconds, *_read(tmp / "run", audit))


# kill-driver: 4 steps with a job checkpoint every 2; the driver dies at the start of step 3, so step 2 ran after
# the checkpoint and must run once more after the resume
DRIVER_STEPS, DRIVER_INTERVAL, DRIVER_AT = 4, 2, 3


def _cli(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "lifecycle.cli", "run", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, cwd=cwd)


def run_killed_and_resumed(
    ft: str,
    tmp: Path,
    mode: str,
    ray_address: str | None,
    environ: Mapping[str, str],
) -> Run:
    """``lifecycle run --save`` SIGKILLs itself (the fault), then ``lifecycle run --resume`` finishes the job; in
    the *kept-engines* mode both drivers join one Ray head that outlives them, and the resume adopts the engines."""
    audit = tmp / "audit.jsonl"
    values = {k: v for k, v in cell_config("kill-driver", ft, mode).items() if k != "save"}  # the cell's own, below
    flags = ["--config", "none", *_flags(values), "--steps", str(DRIVER_STEPS)]
    flags += ["--save", str(tmp / "run" / "ckpt"), "--save-interval", str(DRIVER_INTERVAL)]
    flags += ["--inject", f"kill-driver:0@{DRIVER_AT}", "--run-dir", str(tmp / "run")]
    if not streams(mode):  # a stream sends the prompts itself: a rollout function is refused with it
        flags += ["--rollout-function", "matrix_audit:factory"]
    flags += ["--quiet", "--engine-request-timeout", str(REQUEST_TIMEOUT)]
    joined = ["--ray-address", ray_address] if ray_address else []
    env = {**environ, AUDIT_ENV: str(audit), "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT)])}
    env.pop("RAY_ADDRESS", None)
    env["RAY_AUTH_MODE"] = "disabled"  # the private head's setting (engines.actor.ray_head)
    fault = Fault("kill-driver", 0, DRIVER_AT)
    t0 = time.monotonic()
    died = _cli(*flags, *joined, env=env, cwd=tmp)
    if died.returncode != -signal.SIGKILL:
        error: str | None = f"the driver did not die by SIGKILL: exit {died.returncode}: {died.stderr[-2000:]}"
        return Run(fault, ft, mode, error, time.monotonic() - t0, *_read(tmp / "run", audit))
    resumed = _cli("--resume", str(tmp / "run"), "--quiet", *joined, env=env, cwd=tmp)
    error = None if resumed.returncode == 0 else f"resume: exit {resumed.returncode}: {resumed.stderr[-2000:]}"
    seconds = time.monotonic() - t0
    return Run(fault, ft, mode, error, seconds, *_read(tmp / "run", audit))


@pytest.fixture(scope="module")
def kept_head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The Ray head the kept-engines cells' drivers join (it outlives them), started on first use."""
    from engines.actor import ray_head

    with short_tmp() as temp, ray_head(temp) as address:
        yield address


def _flags(values: dict[str, Any]) -> list[str]:
    flags: list[str] = []
    for key, value in values.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif isinstance(value, list):
            flags += [flag, *value]
        else:
            flags += [flag, str(value)]
    return flags


def check_resumed(run: Run, run_dir: Path) -> str:
    """Nothing lost across the driver's death: every step trained exactly once in the job's history, the rows of
    the step run after the checkpoint moved aside, the engines relaunched and loaded the checkpoint's weights
    before any was routed, and the committed version continued from the checkpoint's."""
    assert run.error is None, run.error
    resumed_at = next(i for i, e in enumerate(run.events) if e["event"] == "job.resumed")
    resumed = run.events[resumed_at]
    start = int(resumed["resume_at"])
    assert start == DRIVER_INTERVAL and resumed["discarded_steps"] == list(range(start, DRIVER_AT))
    assert resumed["weight_version"] == str(start)
    assert [e["event"] for e in run.events[:resumed_at]][-1] == "fault.injected"  # nothing ran after the kill
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(DRIVER_STEPS)), "a step lost or repeated in metrics.jsonl"

    def trained(events: list[dict[str, Any]]) -> list[int]:
        return [
            int(e["step"])
            for e in events
            if e.get("event") == "lifecycle.transition" and e.get("machine") == "trainer" and e["trigger"] == "train"
        ]

    before, after = trained(run.events[:resumed_at]), trained(run.events[resumed_at:])
    assert before == list(range(DRIVER_AT)) and after == list(range(start, DRIVER_STEPS))
    history = [k for k in before if k < start] + after  # the dead driver's steps after its checkpoint are void
    assert history == list(range(DRIVER_STEPS)), history
    if not streams(run.mode):  # a stream runs no rollout function (check_stream_accounting audits it)
        audited = [row["rollout_id"] for row in run.audit]
        assert audited == [*range(DRIVER_AT), *range(start, DRIVER_STEPS)], audited
    kept = keeps(run.mode)
    # relaunched (a new process), or re-adopted holding the dead driver's void version: loaded, then routed
    first = ["adopt", "adopted_behind"] if kept else ["start", "ready"]
    for instance in ("engine-0", "engine-1"):
        path = [t["trigger"] for t in run.transitions(instance) if run.events.index(t) > resumed_at]
        assert path[:4] == [*first, "begin_update", "finish_update"], path
    commits = [e["weight_version"] for e in run.events[resumed_at:] if e["event"] == "weights.committed"]
    assert commits == [str(v) for v in range(start, DRIVER_STEPS + 1)], commits
    how = f"both engines relaunched and loaded v{start} before routing"
    if kept:
        adopted = [e for e in run.events[resumed_at:] if e["event"] == "engine.adopted"]
        assert sorted(e["instance"] for e in adopted) == ["engine-0", "engine-1"]
        assert all(e["epoch"] == 1 and e["weight_version"] == str(DRIVER_AT) for e in adopted), adopted
        launched = [t for t in run.events[resumed_at:] if "launch_engine" in t.get("effects", ())]
        assert not launched, launched
        how = (
            f"both engines re-adopted (the same processes, generation 1: no launch), the dead driver's void "
            f"v{DRIVER_AT} reloaded to v{start} before routing"
        )
    return (
        f"recovers: driver SIGKILLed at step {DRIVER_AT}, resumed at step {start} from job-{start:06d} "
        f"(step {start} run again, its first row moved aside); {DRIVER_STEPS}/{DRIVER_STEPS} steps, each trained "
        f"once; {how}; committed {' -> '.join(commits)}"
    )


def _ts(event: dict[str, Any]) -> float:
    return datetime.fromisoformat(str(event["ts"]).replace("Z", "+00:00")).timestamp()


# -- the checks every cell makes ---------------------------------------------------------------------------
def check_nothing_lost(run: Run) -> None:
    """The audit ran in every completed rollout and found nothing (it raises inside the run otherwise)."""
    assert run.audit, "the audited rollout function never ran"
    assert all(not row["problems"] for row in run.audit), run.audit
    assert all(row["samples"] == row["requests"] for row in run.audit)
    assert all(row["serving_versions"] for row in run.audit), "a rollout with no Serving engine"


def check_preempted(run: Run, steps: int) -> str:
    """A preemption with notice is a planned leave: the engine is withdrawn, drained (or stopped at once where nothing
    was routed to it) and confirmed gone -- never marked Unhealthy, never a failed run -- and a replacement joins a
    vacant slot and serves the committed weights, so the fleet ends as large as it began."""
    target = f"engine-{run.fault.index}"
    notices = [e for e in run.events if e.get("event") == PREEMPT_NOTICE]
    assert any(e.get("instance") == target for e in notices), notices
    failed = [t for t in run.events if t.get("event") == TRANSITION and t.get("dst") in ("Unhealthy", "Failed")]
    assert not failed, failed
    left = [t["dst"] for t in run.transitions(target)]
    assert "Retired" in left, left
    leave = left[left.index("Retired") - 2 : left.index("Retired") + 1]
    joined = sorted(
        {str(t["instance"]) for t in run.events if t.get("event") == TRANSITION and t.get("trigger") == "join"}
    )
    assert joined, "no replacement joined"
    if streams(run.mode):
        return f"recovers: {steps}/{steps} steps; {target} {' -> '.join(leave)}; joined {', '.join(joined)}"
    last = run.audit[-1]
    versions = last["serving_versions"]
    assert len(versions) == 2 and set(versions.values()) == {str(steps - 1)}, last  # as many as before, current
    where = ""
    if KINDS[run.fault.kind].needs == "ray-nodes":  # Ray noticed every engine on the drained node; none serves there
        drained = run.first("fault.injected")["node"]
        on_node = {str(e) for e, node in run.audit[0]["nodes"].items() if node == drained}
        by_ray = {str(e["instance"]) for e in notices if e.get("by") == "ray"}
        assert target in on_node and on_node <= by_ray, (on_node, by_ray)
        assert drained not in last["nodes"].values(), (last["nodes"], drained)
        where = f", none on the drained node ({drained[:8]}; Ray noticed {', '.join(sorted(by_ray))} there)"
    return (
        f"recovers: {steps}/{steps} steps; {target} {' -> '.join(leave)}; joined {', '.join(joined)}; "
        f"{len(versions)} engines served v{steps - 1} in the last step{where}; no engine marked Unhealthy"
    )


def check_weights_before_routing(run: Run) -> None:
    """Per engine: after every (re)start -- and, broadcasting, after every aborted update (its weights may be
    a mix of two versions) -- the weights are loaded before it is resumed (routed)."""
    moved = sorted({str(e["instance"]) for e in run.events if e.get("event") == TRANSITION and "instance" in e})
    for instance in moved:  # every engine slot an elastic fleet's joiners took too (only an engine enters Serving)
        loaded = False
        for t in run.transitions(instance):
            # PendingWeights: started, adopted behind, or a failed in-flight update's engine (its weights unpublished)
            if t["dst"] == "PendingWeights" or (t["trigger"] == "abort_update" and run.mode == "broadcast"):
                loaded = False
            elif t["trigger"] == "finish_update" and (t["src"] == "LoadingWeights" or run.mode == "broadcast"):
                loaded = True
            elif t["dst"] == "Serving":
                assert loaded, f"{instance} routed before it loaded the weights: {t}"


def check_trace(run: Run) -> str:
    """``lifecycle trace check`` of the cell's log: the live monitor logged no violation, and judging the whole
    log again (torn or not) finds none."""
    live = [e for e in run.events if e.get("event") == "lifecycle.invariant_violated"]
    assert not live, live
    found = EventMonitor().feed_all(run.events)
    assert not found, [v.describe() for v in found]
    return f"trace check: {len(run.events)} events, no violation"


def server_did(run: Run) -> str:
    """What the real server did, from the injector's record (``fault.injected`` / ``fault.fired``)."""
    injected = run.first("fault.injected")
    kind = run.fault.kind
    if kind == "kill-engine":
        left = str(injected.get("server_group_left", ""))
        assert left.startswith("all server processes gone"), injected  # nothing left holding memory
        return f"actor SIGKILLed: {left}"
    if kind == "hang-engine":
        health = str(injected.get("health_after", ""))
        assert health.startswith("no:"), injected  # a stopped server does not answer its health endpoint
        return f"SIGSTOP: /health {health}"
    if KINDS[kind].notice:  # a planned leave: stopped by the lifecycle, before the deadline's SIGTERM if it can
        target = f"engine-{run.fault.index}"
        path = [t["dst"] for t in run.transitions(target)]
        left = path[path.index("Retired") - 2 : path.index("Retired") + 1]
        drained = [e for e in run.events if e.get("event") == DRAINED and e.get("instance") == target]
        struck = [e.get("signal") for e in run.events if e.get("event") == "fault.fired"]
        how = f"drained in {drained[0]['seconds']:g} s, " if drained else ""
        end = f"then {' and '.join(map(str, struck))} at the deadline" if struck else "gone before the deadline"
        return f"server withdrawn and stopped ({' -> '.join(left)}), {how}{end}"
    fired = run.first("fault.fired")
    assert fired["health_after"] == "ok", fired  # the server lived through the bad load
    served = fired["served_after"]
    assert served == str(AT), fired  # ... and still served the weights it had (the version before the update)
    answer = str(fired["answer"])
    said = re.search(r"(HTTP \d+).*?failed with error '([^']*)'", answer)  # vLLM wraps the worker's error
    answer = f"{said[1]}: {said[2]}" if said else answer[:160]
    return f"the load of the torn checkpoint answered {answer}; /health then ok, /weight_info still v{served}"


def check_fault_maps_to_transition(run: Run) -> dict[str, Any]:
    """The fault became a transition of the target with a reason naming the cause."""
    target = f"engine-{run.fault.index}"
    marks = [t for t in run.transitions(target) if t["trigger"] == "mark_unhealthy"]
    assert marks, f"{target} never marked unhealthy: {[t['dst'] for t in run.transitions(target)]}"
    mark = marks[0]
    reason = str(mark.get("reason", ""))
    kind = run.fault.kind
    if run.mode == "gateway-checks":  # SMG's 1 s checks notice first; its verdict is the reason
        assert "(SMG) reports its worker not_ready" in reason, reason
    elif kind in REASON:
        either = REASON[kind] + (STREAM_REASON.get(kind, ()) if streams(run.mode) else ())
        assert any(text in reason for text in either), reason
    if kind in ("crash-during-update", "fail-update"):
        assert mark["src"] in UPDATE_STATES, mark
        assert run.first("fault.fired")["state"] in UPDATE_STATES
    if kind in BROADCAST_FAULTS:
        check_broadcast_bounded(run)
    if kind == "crash-during-offload":
        assert mark["src"] == "Offloaded", mark
        assert run.first("fault.fired")["state"] == "Offloaded"
    if kind == "kill-http":  # the actor lived: same actor process before and after the server died
        injected = run.first("fault.injected")
        assert injected["actor"]["actor_pid"] == injected["actor_after"]["actor_pid"], injected
        assert injected["actor_after"]["alive"] is False
    return mark


def check_recovered(run: Run) -> str:
    assert run.error is None, f"expected recovery, the run stopped: {run.error}"
    steps = steps_for(run.fault.kind)
    assert run.steps_done == steps
    if run.fault.kind in TRAINER_FAULTS:
        if run.fault.kind in BROADCAST_FAULTS:
            check_broadcast_bounded(run)
        path = [t["trigger"] for t in run.transitions("trainer")]
        assert [p for p in path if p in ("worker_crashed", "heal", "healed")] == ["worker_crashed", "heal", "healed"]
        if run.fault.kind == "crash-trainer-in-broadcast":
            return check_broadcast_redone(run, steps)
        return f"recovers: {steps}/{steps} steps; trainer worker_crashed -> heal -> healed, step retried"
    if run.fault.kind == "kill-router":
        return check_router_recovered(run, steps)
    if KINDS[run.fault.kind].notice:
        return check_preempted(run, steps)
    mark = check_fault_maps_to_transition(run)
    target = f"engine-{run.fault.index}"
    if run.fault.kind == "crash-during-broadcast":  # the next update connected a new group and went through
        syncs = [t["trigger"] for t in run.transitions("weight-sync")]
        after = syncs[syncs.index("broadcast_failed") + 1 :]
        assert after[:4] == ["connect", "connected", "broadcast", "broadcast_done"], syncs
    path = [t["dst"] for t in run.transitions(target)]
    start = path.index("Unhealthy")
    tail = path[start:]
    want = ["Unhealthy", "Recovering", "Starting", "PendingWeights", "LoadingWeights", "Quiesced"]
    assert tail[: len(want)] == want, tail
    if streams(run.mode):
        return check_stream_recovered(run, target, want, mark, steps)
    last = run.audit[-1]
    served = "0" if run.mode == "rollout-only" else str(steps - 1)  # no trainer: the seed's weights throughout
    assert last["serving_versions"].get(target) == served, last  # the recovered engine serves again
    where = ""
    if run.fault.kind == "lose-node":
        lost = run.first("fault.injected")["node"]
        assert last["nodes"][target] != lost, (last["nodes"], lost)
        where = f" on a surviving node ({last['nodes'][target][:8]}, lost {lost[:8]})"
    return (
        f"recovers: {steps}/{steps} steps; {target} {' -> '.join(want)}{where}; "
        f"served v{served} in the last step; reason: {mark.get('reason')}"
    )


def check_stream_recovered(run: Run, target: str, path: list[str], mark: dict[str, Any], steps: int) -> str:
    """Mid-stream: the recovered engine was routed again and loaded the last version the trainer pushed."""
    recovered = next(t for t in run.transitions(target) if t["trigger"] == "recover")
    later = run.events[run.events.index(recovered) :]
    assert any(t.get("instance") == target and t.get("dst") == "Serving" for t in later), f"{target} never served again"
    loads = [e for e in later if e["event"] == "engine.weights" and e.get("instance") == target]
    assert loads and loads[-1]["outcome"] == "loaded" and loads[-1]["weight_version"] == str(steps), loads
    if run.fault.kind == "kill-engine":  # it was killed serving the stream
        injected = run.first("fault.injected")
        assert injected["state_before"] == "Serving", injected
        assert rollout_state(run, injected) == "Streaming", rollout_state(run, injected)
    return (
        f"recovers: {steps}/{steps} steps mid-stream; {target} {' -> '.join(path)} -> Serving, loaded v{steps} in the "
        f"last in-flight update; reason: {mark.get('reason')}"
    )


def rollout_state(run: Run, at: dict[str, Any]) -> str:
    """The rollout manager's state when the event ``at`` was logged."""
    before = run.events[: run.events.index(at)]
    moves = [e for e in before if e.get("machine") == "rollout" and e.get("event") == "lifecycle.transition"]
    return str(moves[-1]["dst"]) if moves else "Init"


def last_stream(save: Path) -> tuple[str, dict[str, Any]]:
    """The job's latest checkpoint (``--save``): its weight version and the stream it recorded."""
    from trainer.job_state import _restore, latest_checkpoint

    state = json.loads((latest_checkpoint(save) / "state.json").read_text())
    lifecycle = _restore(state["state"]["lifecycle"], {}, "lifecycle")
    return str(state["weight_version"]), dict(lifecycle["stream"])


def check_stream_accounting(run: Run, run_dir: Path, bound: int | None = None) -> str:
    """What the matrix's audit checks of a rollout, over a stream (no rollout function runs in one): every group
    taken at most once in the job's history and each within ``--max-weight-staleness`` of the version it was judged
    against (the log's ``stream.group_taken`` and every ``metrics.jsonl`` row), every dropped one staler than the
    bound and sent again, the committed version never going back within a driver -- and, once the run completed,
    nothing lost: the groups trained, the job's last checkpoint's completed groups and its prompts to send again
    are every prompt below its cursor, once each."""
    if bound is None:
        bound = LifecycleConfig.from_mapping(cell_config(run.fault.kind, run.ft, run.mode)).max_weight_staleness
    assert bound is not None
    resumed = [i for i, e in enumerate(run.events) if e["event"] == "job.resumed"]
    start = int(run.events[resumed[0]]["resume_at"]) if resumed else 0
    cut = resumed[0] if resumed else len(run.events)
    drivers = [run.events[:cut], run.events[cut:]]
    for events in drivers:  # versions go forward within a driver (a resume starts again from its checkpoint's)
        commits = [int(e["weight_version"]) for e in events if e["event"] == "weights.committed"]
        assert commits == sorted(set(commits)), f"the committed version went back: {commits}"
    takes = [e for e in run.events if e["event"] == GROUP_TAKEN]
    lag = [int(e["version"]) - int(e["oldest"]) for e in takes]
    assert takes and all(0 <= n <= bound for n in lag), f"trained beyond the bound {bound}: {lag}"
    assert all(int(e["bound"]) == bound for e in takes), takes
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(max(r["staleness"]) == r["staleness_max"] <= bound for r in rows), f"beyond the bound {bound}: {rows}"
    # the job's history: what the dead driver trained after its checkpoint is void (the resume trains it again)
    history = [e for e in drivers[0] if e["event"] == GROUP_TAKEN and (not resumed or int(e["step"]) < start)]
    history += [e for e in drivers[1] if e["event"] == GROUP_TAKEN]
    trained = [str(e["group"]) for e in history]
    assert len(trained) == len(set(trained)), f"a group trained twice: {sorted(trained)}"
    drops = [e for e in run.events if e["event"] == GROUP_DROPPED]
    assert all(int(e["version"]) - int(e["oldest"]) > bound for e in drops), f"dropped within the bound: {drops}"
    batch = len([e for e in history if int(e["step"]) == 0])  # the first take drops none: nothing is older yet
    for r in rows:  # a take trains what it kept of its last batch, after the batches it dropped whole
        assert r["staleness"] and (len(r["staleness"]) + r["dropped"]) % batch == 0, (batch, r)
    pending: list[str] = []
    if run.error is None:  # the run completed: its last checkpoint (after its last step) holds the stream
        version, stream = last_stream(run_dir / "ckpt")
        assert version == str(len(rows)), (version, len(rows))
        pending = [f"{g['rollout_id']}/{g['index']}" for g in stream["groups"]]
        pending += [f"{r}/{i}" for r, i, _, _ in stream["prompts"]]
        every = [f"{r}/{i}" for r in range(int(stream["cursor"])) for i in range(batch)]
        assert sorted(trained + pending) == sorted(every), (
            f"lost or duplicated: trained {sorted(trained)}, pending {sorted(pending)}, cursor {stream['cursor']}"
        )
    for d in drops:  # sent again: completed again after the drop, or still to be sent at the end
        after = run.events[run.events.index(d) + 1 :]
        again = any(e["event"] == GROUP_BUFFERED and e["group"] == d["group"] for e in after)
        assert again or d["group"] in pending or run.error is not None, f"dropped and never sent again: {d}"
    most = max(lag)
    ended = f", {len(pending)} pending in the last checkpoint: none lost" if run.error is None else ""
    return (
        f"stream: {len(trained)} groups trained once, staleness <= {bound} (max {most}), {len(drops)} dropped and "
        f"sent again{ended}"
    )


def check_broadcast_bounded(run: Run) -> None:
    """The fault landed mid-broadcast and the broadcast failed within its stated bound: every bucket's
    collective has ``--update-weight-timeout``, the callers wait ``trainer.app.broadcast.MARGIN`` longer."""
    from trainer.app.broadcast import MARGIN

    fired = run.first("fault.fired")
    assert fired["state"] == "Broadcasting", fired
    failed = [t for t in run.transitions("weight-sync") if t["trigger"] == "broadcast_failed"]
    assert failed, [t["trigger"] for t in run.transitions("weight-sync")]
    bound = float(LifecycleConfig.from_mapping(cell_config(run.fault.kind, run.ft, run.mode)).update_weight_timeout)
    assert _ts(failed[0]) - _ts(fired) <= bound + MARGIN, (_ts(failed[0]) - _ts(fired), bound)


def check_broadcast_redone(run: Run, steps: int) -> str:
    """The crash failed the broadcast; after the heal the update connected a new group and went through."""
    syncs = [t["trigger"] for t in run.transitions("weight-sync")]
    failed = syncs.index("broadcast_failed")
    assert syncs[failed + 1 : failed + 5] == ["connect", "connected", "broadcast", "broadcast_done"], syncs
    last = run.audit[-1]
    assert set(last["serving_versions"].values()) == {str(steps - 1)}, last
    return (
        f"recovers: {steps}/{steps} steps; broadcast_failed, trainer worker_crashed -> heal -> healed, "
        "the update redone over a new group (connect -> broadcast_done)"
    )


def check_router_recovered(run: Run, steps: int) -> str:
    """The router came back (a second start in the log) and every engine entered Serving again after it."""
    injected = _ts(run.first("fault.injected"))
    starts = [e for e in run.events if e.get("event") == "router.started"]
    assert len(starts) == 2 and _ts(starts[1]) > injected, starts
    for i in range(2):
        after = [t for t in run.transitions(f"engine-{i}") if _ts(t) > injected and t["dst"] == "Serving"]
        assert after, f"engine-{i} never served again after the router died"
    last = run.audit[-1]
    assert set(last["serving_versions"].values()) == {str(steps - 1)}, last
    return (
        f"recovers: {steps}/{steps} steps; router restarted (start {len(starts)}), "
        "both engines registered again as they entered Serving"
    )


def check_stopped(run: Run) -> str:
    assert run.error is not None, f"expected the run to stop, it completed {run.steps_done} steps"
    message = str(run.error)
    assert run.steps_done <= AT + 1, f"stopped late: {run.steps_done} steps done"
    injected_at = _ts(run.first("fault.injected"))
    assert run.stopped_at - injected_at < STOP_WITHIN, run.stopped_at - injected_at
    if run.fault.kind == "kill-router":
        assert "router-rollout died" in message and "--ft-components rollout" in message, message
    elif run.fault.kind in TRAINER_FAULTS:
        assert isinstance(run.error, TrainerFailed), repr(run.error)  # trainer cells run in this process
        state = "UpdatingWeights" if run.fault.kind == "crash-trainer-in-broadcast" else "Training"
        if run.fault.kind in BROADCAST_FAULTS:
            check_broadcast_bounded(run)
        assert f"trainer worker {run.fault.index} crashed in state {state}" in message, message
        assert "train fault tolerance is off" in message, message
        path = [t["trigger"] for t in run.transitions("trainer")]
        assert path[-2:] == ["worker_crashed", "fail"], path
    else:
        mark = check_fault_maps_to_transition(run)
        target = f"engine-{run.fault.index}"
        assert f"engine {target} failed in state" in message, message
        assert f"(while {mark['src']})" in message, message  # the state it was in when the fault hit
        assert "rollout fault tolerance is off" in message, message
        states = [t["dst"] for t in run.transitions(target)]
        assert states[-2:] == ["Unhealthy", "Failed"], states  # failed from Unhealthy: not recovered
    name = type(run.error).__name__ if isinstance(run.error, BaseException) else "exit 2"
    return f"stops: after {run.stopped_at - injected_at:.1f}s, {name}: {message.splitlines()[-1][:300]}"


Cell = tuple[str, str, str]  # (fault kind, mode, FT config)


def cell_fault(kind: str) -> Fault:
    index = ENGINE if KINDS[kind].target == "engine" else 0  # a worker rank, the one router: 0
    return Fault(kind, index, AT)


def cell_id(cell: Cell) -> str:
    kind, mode, ft = cell
    return f"{kind}-{ft}" + ("" if mode == "normal" else f"-{mode}")


@dataclass(frozen=True)
class Where:
    """What the cells run on: the session's Ray cluster, the vLLM environment, the kept-engines cells' Ray head."""

    ray_address: str = ""
    vllm_python: str | None = None
    kept_head: str | None = None


class Lane:
    """One of the :data:`CONCURRENT` lanes of :func:`cell_runs`: its cells run one after another, the in-process
    ones in its cell runner (started on first use, again after one failed)."""

    def __init__(self, where: Where, tmp: Path) -> None:
        self.where, self.tmp = where, tmp
        self.runner: CellRunner | None = None
        # read here, on the test session's thread: a lane's thread reading os.environ races pytest setting and
        # removing PYTEST_CURRENT_TEST between tests (a KeyError in CI)
        self.environ = _child_environ()

    def run(self, cell: Cell, tmp: Path) -> Run:
        """One cell's run(s), each in processes of its own: ``lifecycle run`` killed and resumed (``kill-driver``),
        on a 3-node cluster of its own (``lose-node``), else the loop in the cell runner on the session's cluster."""
        kind, mode, ft = cell
        if kind == "kill-driver":  # the driver itself dies: a process of its own (this one must live on)
            kept = self.where.kept_head if keeps(mode) else None
            return run_killed_and_resumed(ft, tmp, mode, kept, self.environ)
        if KINDS[kind].needs == "ray-nodes":
            return run_subprocess(cell_fault(kind), ft, tmp, self.environ)
        if self.runner is None or self.runner.proc.poll() is not None:
            self.runner = CellRunner(self.where.ray_address, self.tmp, self.environ)
        vllm = self.where.vllm_python if on_vllm(mode) else None
        return run_in_runner(cell_fault(kind), ft, mode, tmp, self.runner, vllm)

    def close(self) -> None:
        if self.runner is not None:
            self.runner.close()


CELL_TEST = "test_cell"
# At most this many cells run at once, and of those at most one on real vLLM servers (two servers a cell, their
# rollouts CPU-bound: two such cells would starve each other's bounded requests).
CONCURRENT, HEAVY = 2, ("vllm", "streaming-vllm")


@pytest.fixture(scope="module")
def cell_runs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[Cell, Future[tuple[Run, Path]]]]:
    """Every selected cell's run, two at a time (a cell mostly waits: on engine start-ups, a hang's bound, a
    backoff, a resume), the vLLM cells one at a time beside the others and started first (the longest). A cell's
    own bounds (requests, probes, the stop-within) are unchanged; its checks run in its test, in order."""
    cells = [
        cell_of(item.callspec.params)
        for item in request.session.items
        if getattr(item, "originalname", "") == CELL_TEST
        and hasattr(item, "callspec")
        and item.get_closest_marker("skip") is None  # a recorded cell outside LIFECYCLE_RECORDED=1
    ]
    if importlib.util.find_spec("ray") is None or importlib.util.find_spec("torch") is None:
        cells = []  # the cells' tests skip on their own
    # what the cells need, set up here (fixtures are not for worker threads): only what the selected ones use
    where = Where()
    if any(on_vllm(mode) for _, mode, _ in cells):
        try:
            where = Where(vllm_python=request.getfixturevalue("vllm_python"))
        except pytest.skip.Exception:  # the vLLM cells' tests skip (or fail under LIFECYCLE_REQUIRE_ALL) themselves
            cells = [c for c in cells if not on_vllm(c[1])]
    if any(kind != "kill-driver" and KINDS[kind].needs != "ray-nodes" for kind, _, _ in cells):
        import ray

        request.getfixturevalue("ray_cluster")
        where = Where(ray.get_runtime_context().gcs_address, where.vllm_python)
    if any(keeps(mode) for _, mode, _ in cells):
        where = Where(where.ray_address, where.vllm_python, request.getfixturevalue("kept_head"))
    cells.sort(key=lambda c: c[1] not in HEAVY)  # stable: the heavy first, each group in the tests' order
    tmps = {c: tmp_path_factory.mktemp(cell_id(c)) for c in cells}
    futures: dict[Cell, Future[tuple[Run, Path]]] = {c: Future() for c in cells}
    pending = list(cells)
    heavy_running = [False]
    ready = threading.Condition()

    def take() -> Cell | None:
        with ready:
            while pending:
                for cell in pending:
                    if not (cell[1] in HEAVY and heavy_running[0]):
                        pending.remove(cell)
                        heavy_running[0] |= cell[1] in HEAVY
                        return cell
                ready.wait()
            return None

    def worker(lane: Lane) -> None:
        try:
            while (cell := take()) is not None:
                future = futures[cell]
                try:
                    if future.set_running_or_notify_cancel():
                        future.set_result((lane.run(cell, tmps[cell]), tmps[cell]))
                except BaseException as exc:  # the cell's test re-raises it
                    future.set_exception(exc)
                finally:
                    with ready:
                        if cell[1] in HEAVY:
                            heavy_running[0] = False
                        ready.notify_all()
        finally:
            lane.close()

    lanes = [Lane(where, tmp_path_factory.mktemp(f"lane-{i}")) for i in range(CONCURRENT)]
    threads = [threading.Thread(target=worker, args=(lane,), name=f"cell-lane-{i}") for i, lane in enumerate(lanes)]
    for thread in threads:
        thread.start()
    try:
        yield futures
    finally:
        for future in futures.values():
            future.cancel()  # the ones not started (a -x stop): nothing left running after the module
        with ready:
            pending.clear()
            ready.notify_all()
        for thread in threads:
            thread.join()


def cell_of(params: dict[str, Any]) -> Cell:
    return (str(params["kind"]), str(params["mode"]), str(params["ft"]))


# Kept out of CI for its time bound (LIFECYCLE_RECORDED=1 runs them; their rows in docs/reliability.md are from such a
# run): a vLLM engine's failure without FT stops the run as a CPU engine's does (those cells run), and the in-flight
# update that fails on vLLM is also CI's test_vllm_inflight.py and the CPU streaming cell.
RECORDED_CELLS = frozenset(
    {
        ("kill-engine", "vllm", "none"),
        ("hang-engine", "vllm", "none"),
        ("fail-update", "vllm", "none"),
        ("fail-update", "streaming-vllm", "rollout"),
    }
)
# Where a fault runs under all four FT configurations (a sweep), CI runs one cell per outcome the contract gives it
# (``expected``; the one-component configurations first: train-only FT starting rollout recovery was miles' bug), and
# of the sweeps of a mode that stop alike (the same text under the same FT configuration: one decision of the core
# whatever the fault) the first fault's; each fault's own detection stays in CI in its recovery's cell. The explorer
# checks all four configurations, test_expected_follows_the_predicates the contract. The rest are recorded; the
# streaming, elastic (notice) and vLLM cells are no sweep and all run.
PREFERRED_FT = ("train", "rollout", "none", "both")


def _ci_cells() -> frozenset[Cell]:
    sweeps: dict[tuple[str, str], list[Cell]] = {}
    for cell in CELLS:
        sweeps.setdefault(cell[:2], []).append(cell)
    keep: set[Cell] = {c for c in CELLS if len(sweeps[c[:2]]) < len(FT_CONFIGS)}
    stops: set[tuple[str, str, str]] = set()
    for cells in sweeps.values():
        if len(cells) < len(FT_CONFIGS):
            continue
        outcomes: dict[str, Cell] = {}
        for cell in sorted(cells, key=lambda c: PREFERRED_FT.index(c[2])):
            outcomes.setdefault(str(expected(cell[0], cell[2], cell[1])), cell)
        for text, (kind, mode, ft) in outcomes.items():
            if text.startswith("stops"):
                if (mode, ft, text) in stops:
                    continue
                stops.add((mode, ft, text))
            keep.add((kind, mode, ft))
    return frozenset(keep - RECORDED_CELLS)


CI_CELLS = _ci_cells()


def recorded(cell: Cell) -> bool:
    """Whether ``cell`` runs only with LIFECYCLE_RECORDED=1."""
    return cell not in CI_CELLS


CELL_PARAMS = [pytest.param(*c, marks=pytest.mark.recorded) if recorded(c) else c for c in CELLS]


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "mode", "ft"), CELL_PARAMS, ids=[cell_id(c) for c in CELLS])
def test_cell(
    kind: str,
    mode: str,
    ft: str,
    request: pytest.FixtureRequest,
    matrix_results: dict[tuple[str, str, str], CellResult],
    cell_runs: dict[Cell, Future[tuple[Run, Path]]],
) -> None:
    pytest.importorskip("ray")
    pytest.importorskip("torch")
    if on_vllm(mode):
        request.getfixturevalue("vllm_python")  # skips without the vLLM environment
    run, tmp = cell_runs[(kind, mode, ft)].result()
    check_weights_before_routing(run)
    judged = check_trace(run)
    if streams(mode):  # no rollout function runs in a stream: the log, the metrics and the last checkpoint
        judged += f"; {check_stream_accounting(run, tmp / 'run')}"
    else:
        check_nothing_lost(run)  # step 0's rollout ran before the fault (at step 1's start), whatever the outcome
    if kind == "kill-driver":
        observed = check_resumed(run, tmp / "run")
        assert observed.startswith(expected(kind, ft, mode).outcome)
        matrix_results[(kind, mode, ft)] = CellResult(kind, mode, ft, f"{observed}; {judged}", run.seconds)
        return
    outcome = expected(kind, ft, mode).outcome
    observed = check_recovered(run) if outcome == "recovers" else check_stopped(run)
    assert observed.startswith(outcome)
    if on_vllm(mode):
        observed += f"; real server: {server_did(run)}"
    if mode == "rollout-only":  # no trainer: nothing of it may appear, whatever the fault did
        assert not [e for e in run.events if e.get("machine") == "trainer" and e.get("event") == "lifecycle.transition"]
    matrix_results[(kind, mode, ft)] = CellResult(kind, mode, ft, f"{observed}; {judged}", run.seconds)


@pytest.mark.slow
def test_stream_update_failed_whole(tmp_path: Path) -> None:
    """Mid-stream, a whole in-flight update fails (the trainer worker dies between two buckets of its broadcast,
    under train and rollout FT): every engine it paused hands its requests back and waits for the committed
    weights -- none resumes on the failed refit, none is marked Unhealthy (the fault struck the trainer) -- the
    worker is healed, the update goes through on the reloaded engines, and the stream loses nothing. Beside the
    matrix (`lifecycle run` in a process of its own, ~60 s): the one fault that reaches ``hand_back_requests``."""
    pytest.importorskip("ray")
    pytest.importorskip("torch")
    fault = Fault("crash-trainer-in-broadcast", 0, AT)
    values = {**cell_config(fault.kind, "both", "streaming"), **MODES["broadcast"]}
    flags = ["--config", "none", *_flags(values), "--steps", str(STEPS), "--inject", str(fault)]
    flags += ["--run-dir", str(tmp_path / "run"), "--save", str(tmp_path / "run" / "ckpt")]
    flags += ["--save-interval", str(STEPS), "--quiet", "--engine-request-timeout", str(REQUEST_TIMEOUT)]
    env = {**_child_environ(), "PYTHONPATH": os.pathsep.join([str(HERE), str(ROOT)])}
    env.pop("RAY_ADDRESS", None)
    t0 = time.monotonic()
    done = _cli(*flags, env=env, cwd=tmp_path)
    run = Run(fault, "both", "streaming", None, time.monotonic() - t0, *_read(tmp_path / "run", tmp_path / "none"))
    assert done.returncode == 0, done.stderr[-2000:]
    check_weights_before_routing(run)
    check_trace(run)
    check_stream_accounting(run, tmp_path / "run", bound=1)
    assert run.first("fault.fired")["state"] == "Broadcasting"
    for engine in ("engine-0", "engine-1"):
        moves = run.transitions(engine)
        aborted = [i for i, t in enumerate(moves) if t["trigger"] == "abort_update"]
        assert aborted, [t["trigger"] for t in moves]
        abort = moves[aborted[0]]
        assert (abort["src"], abort["dst"]) == ("UpdatingInFlight", "PendingWeights"), abort
        assert "hand_back_requests" in abort.get("effects", ()), abort
        after = moves[aborted[0] + 1 :]
        why = [t.get("reason", "") for t in after if t["trigger"] == "mark_unhealthy"]
        path = [t["trigger"] for t in after]
        assert path[:3] == ["begin_update", "finish_update", "resume"], f"{engine} after it: {path} {why}"
    healed = [t["trigger"] for t in run.transitions("trainer")]
    assert [p for p in healed if p in ("worker_crashed", "heal", "healed")] == ["worker_crashed", "heal", "healed"]


# -- fast checks -------------------------------------------------------------------------------------------
def test_committed_doc_is_current() -> None:
    """docs/reliability.md has one row per cell whose expected column is the contract, and observed agrees."""
    assert DOC.exists(), "docs/reliability.md is missing: run pytest tests/reliability/test_matrix.py"
    rows = parse(DOC.read_text())
    want = contract_rows()
    assert [r[:3] for r in rows] == [w[:3] for w in want], "cells differ"
    for (fault, mode, ft, exp, observed), (*_, contract) in zip(rows, want, strict=True):
        where = f"{fault}/{mode}/{ft}"
        assert exp == contract, f"{where}: doc says {exp!r}, the contract says {contract!r}: re-run the matrix"
        assert observed.split(":", 1)[0] == contract.split(":", 1)[0], f"{where}: observed {observed!r}"


def test_doc_check_catches_a_changed_contract(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above can fail: change one expected outcome and it does."""
    import reliability_report

    import trainer.app.faults as faults

    real = faults.expected

    def changed(kind: str, ft: str, mode: str = "normal") -> faults.Expected:
        if (kind, ft) == ("kill-engine", "none"):
            return faults.Expected("recovers", "changed")
        return real(kind, ft, mode)

    monkeypatch.setattr(reliability_report, "expected", changed)
    with pytest.raises(AssertionError, match="kill-engine/normal/none"):
        test_committed_doc_is_current()


def test_expected_follows_the_predicates() -> None:
    """Rollout faults recover exactly under rollout FT (with or without a trainer), trainer crashes exactly under
    train FT, a dead driver and a preemption with notice under any."""
    for kind, mode, ft in CELLS:
        comps = set(FT_CONFIGS[ft].get("ft_components", []))
        heals = ("train" in comps) if kind in TRAINER_FAULTS else ("rollout" in comps)
        if kind == "kill-driver":  # the job's state is on disk: every FT configuration resumes
            heals = True
        if KINDS[kind].notice:  # a planned leave, drained by the elastic fleet: never a failure
            heals = True
        assert expected(kind, ft, mode).outcome == ("recovers" if heals else "stops"), (kind, mode, ft)


def test_fault_specs_and_refusals() -> None:
    assert [str(parse_fault(f"{k}:1@2")) for k in FAULTS] == [f"{k}:1@2" for k in FAULTS]
    with pytest.raises(ConfigError, match="--inject"):
        parse_fault("melt-engine:1@2")
    config = ft_config("rollout")
    two = LifecycleConfig.from_mapping({**FT_CONFIGS["rollout"], "rollout_num_gpus": 2})
    with pytest.raises(ConfigError, match="--offload-rollout"):
        check_faults([parse_fault("crash-during-offload:0@1")], two)
    with pytest.raises(ConfigError, match="--ray-nodes 2 or more"):
        check_faults([parse_fault("lose-node:0@1")], two)
    with pytest.raises(ConfigError, match="engine index"):
        check_faults([parse_fault("kill-engine:5@1")], two)
    with pytest.raises(ConfigError, match="worker rank"):
        check_faults([parse_fault("crash-trainer:1@1")], config)
    check_faults([parse_fault("lose-node:1@1")], two, ray_nodes=3)
    for kind in BROADCAST_FAULTS:
        with pytest.raises(ConfigError, match="--update-weight-transfer-mode broadcast"):
            check_faults([parse_fault(f"{kind}:0@1")], two)
        check_faults([parse_fault(f"{kind}:0@1")], ft_config("rollout", mode="broadcast"))
    for mode in ("broadcast", "rollout-only"):  # fail-update: no engine loads a checkpoint directory there
        with pytest.raises(ConfigError, match="no engine loads a checkpoint directory"):
            check_faults([parse_fault("fail-update:0@1")], ft_config("rollout", mode=mode))
    check_faults([parse_fault("fail-update:0@1")], ft_config("rollout", mode="vllm"))


def test_audit_catches_loss_duplicates_and_stale_weights() -> None:
    """The in-run audit is able to fail: each violation it exists for is reported."""
    good = [{"index": i, "weight_version": "2"} for i in range(4)]
    assert find_problems("2", "2", {"engine-0": "2"}, good, 4) == []
    assert "Serving engines report" in find_problems("2", "2", {"engine-1": "1"}, good, 4)[0]
    assert "3 samples for 4" in find_problems("2", "2", {"engine-0": "2"}, good[:3], 4)[0]
    dup = [*good[:3], {"index": 2, "weight_version": "2"}]
    assert "indexes [0, 1, 2, 2]" in find_problems("2", "2", {"engine-0": "2"}, dup, 4)[0]
    stale = [*good[:3], {"index": 3, "weight_version": "1"}]
    assert "under versions ['1', '2']" in find_problems("2", "2", {"engine-0": "2"}, stale, 4)[0]
    assert "committed version '1'" in find_problems("2", "1", {"engine-0": "2"}, good, 4)[0]


def _stream_run(tmp: Path, events: list[dict[str, Any]], staleness: list[list[int]]) -> Run:
    """A completed mid-stream cell's leftovers, made up: its log, and its metrics rows (one per take)."""
    rows = [{"step": k, "staleness": lag, "staleness_max": max(lag), "dropped": 0} for k, lag in enumerate(staleness)]
    (tmp / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return Run(Fault("kill-engine", 1, 1), "rollout", "streaming", None, 0.0, events, [], len(rows))


def test_stream_accounting_catches_loss_duplicates_and_staleness(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stream's audit (check_stream_accounting) is able to fail: a group trained twice, one trained beyond the
    bound, one dropped within it or never sent again, a version that went back, and a prompt lost by the stream."""

    def ev(event: str, group: str, oldest: int, step: int, version: int | None = None) -> dict[str, Any]:
        extra = {} if version is None else {"version": str(version)}
        return {"event": event, "group": group, "oldest": str(oldest), "bound": 1, "step": step, **extra}

    def commit(v: int) -> dict[str, Any]:
        return {"event": "weights.committed", "weight_version": str(v)}

    # two takes of two groups (prompts 0/0, 0/1, then 1/0, 1/1); 1/0 dropped once (2 behind), completed again
    good = [commit(0), ev(GROUP_TAKEN, "0/0", 0, 0, 0), ev(GROUP_TAKEN, "0/1", 0, 0, 0), commit(1)]
    good += [ev(GROUP_DROPPED, "1/0", 0, 1, 2), ev(GROUP_BUFFERED, "1/0", 1, 1)]
    good += [ev(GROUP_TAKEN, "1/0", 1, 1, 2), ev(GROUP_TAKEN, "1/1", 1, 1, 2), commit(2)]
    stream: dict[str, Any] = {"cursor": 3, "prompts": [[2, 0, "p", 0]], "groups": [{"rollout_id": 2, "index": 1}]}
    monkeypatch.setattr(sys.modules[__name__], "last_stream", lambda save: ("2", stream))
    lag = [[0, 0], [1, 1]]
    assert "4 groups trained once" in check_stream_accounting(_stream_run(tmp_path, good, lag), tmp_path)
    twice = [*good[:3], ev(GROUP_TAKEN, "0/0", 0, 1, 1), *good[3:]]
    stale = [e if e.get("group") != "1/1" else {**e, "oldest": "0"} for e in good]
    within = [e if e["event"] != GROUP_DROPPED else {**e, "version": "1"} for e in good]
    never = [e for e in good if e["event"] != GROUP_BUFFERED]
    back = [*good, commit(1)]
    bad = {"trained twice": twice, "beyond the bound": stale, "within the bound": within}
    bad |= {"never sent again": never, "went back": back}
    for why, events in bad.items():
        with pytest.raises(AssertionError, match=why):
            check_stream_accounting(_stream_run(tmp_path, events, lag), tmp_path)
    with pytest.raises(AssertionError, match="beyond the bound"):  # a metrics row over it
        check_stream_accounting(_stream_run(tmp_path, good, [[0, 0], [2, 1]]), tmp_path)
    stream["prompts"] = []  # the stream forgot the prompt it had in flight
    with pytest.raises(AssertionError, match="lost or duplicated"):
        check_stream_accounting(_stream_run(tmp_path, good, lag), tmp_path)


@pytest.mark.routing
def test_routing_check_catches_serving_before_weights() -> None:
    """check_weights_before_routing fails when a restarted engine is resumed before it loaded weights."""

    def t(trigger: str, src: str, dst: str) -> dict[str, Any]:
        return {"instance": "engine-1", "event": "lifecycle.transition", "trigger": trigger, "src": src, "dst": dst}

    fine = [t("ready", "Starting", "PendingWeights"), t("begin_update", "PendingWeights", "LoadingWeights")]
    fine += [t("finish_update", "LoadingWeights", "Quiesced"), t("resume", "Quiesced", "Serving")]
    run = Run(Fault("kill-engine", 1, 1), "rollout", "normal", None, 0.0, fine, [], STEPS)
    check_weights_before_routing(run)
    run.events = [*fine, t("ready", "Starting", "PendingWeights"), t("resume", "Quiesced", "Serving")]
    with pytest.raises(AssertionError, match="routed before it loaded the weights"):
        check_weights_before_routing(run)
    # mid-stream: a failed in-flight update leaves the engine on unpublished weights; routed again without a load
    failed = [t("pause", "Serving", "Paused"), t("abort_update", "UpdatingInFlight", "PendingWeights")]
    run.events = [*fine, *failed, t("resume", "Paused", "Serving")]
    with pytest.raises(AssertionError, match="routed before it loaded the weights"):
        check_weights_before_routing(run)


def test_preempt_check_catches_a_leave_taken_for_a_failure() -> None:
    """check_preempted fails when the preempted engine is marked Unhealthy, or no replacement joins."""

    def t(instance: str, trigger: str, src: str, dst: str) -> dict[str, Any]:
        return {"instance": instance, "event": TRANSITION, "trigger": trigger, "src": src, "dst": dst}

    notice = {"event": PREEMPT_NOTICE, "instance": "engine-1", "epoch": 1, "deadline_s": 30.0, "by": "injector"}
    leave = [t("engine-1", "retire", "Quiesced", "Retiring"), t("engine-1", "retired", "Retiring", "Retired")]
    join = [t("engine-2", "join", "Init", "Joining"), t("engine-2", "ready", "Joining", "PendingWeights")]
    audit = [{"serving_versions": {"engine-0": "2", "engine-2": "2"}}]
    run = Run(Fault("preempt-engine", 1, 1), "none", "normal", None, 0.0, [notice, *leave, *join], audit, STEPS)
    assert check_preempted(run, STEPS).startswith("recovers")
    run.events = [notice, t("engine-1", "mark_unhealthy", "Quiesced", "Unhealthy"), *leave, *join]
    with pytest.raises(AssertionError, match="mark_unhealthy"):
        check_preempted(run, STEPS)
    run.events = [notice, *leave]
    with pytest.raises(AssertionError, match="no replacement joined"):
        check_preempted(run, STEPS)


def test_ci_runs_every_fault_mode_and_outcome_of_the_matrix() -> None:
    """What CI leaves to the recorded run is a repeat: each (fault, mode) and each (mode, expected outcome) of the
    whole matrix is one of CI's cells, and every streaming and notice cell is (issue 45 keeps them in CI)."""
    whole = [c for c in CELLS if c not in RECORDED_CELLS]  # the long vLLM runs, recorded before issue 45
    outcome = {c: str(expected(c[0], c[2], c[1])) for c in CELLS}
    assert {c[:2] for c in whole} == {c[:2] for c in CI_CELLS}
    assert {(c[1], outcome[c]) for c in whole} == {(c[1], outcome[c]) for c in CI_CELLS}
    assert {c for c in whole if streams(c[1]) or c[0] in NOTICE_FAULTS} <= CI_CELLS


if __name__ == "__main__":  # a cell runner (CellRunner)
    _runner_main(sys.argv[1])
