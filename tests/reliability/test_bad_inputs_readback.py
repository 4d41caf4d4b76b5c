"""What a resume reads back is checked by the rules that wrote it (issue 41, causes 3 and 4).

* ``state.json``: a re-signed checkpoint whose step is not its directory's (``step: -1`` trained rollouts -1
  and 0), whose weight version is not a pushed version or is older than the event log says was checkpointed
  (a log that then fails its own check), or whose RNG states are not the workers' -- refused, before anything
  starts;
* ``engines.json``: read bounded (torn, nested, huge, a FIFO, ``/dev/zero``) and by the schema the driver
  writes (a string, boolean or negative epoch, an unknown key); and a new process's generation lies above every
  one the run directory ever used, even when the ledger was rewound or forgot a slot (the event log says which
  were used);
* ``events.jsonl`` and ``metrics.jsonl``: only regular files, read line by line and bounded (the torn tail
  only: never the whole log) -- a FIFO, a device or a symlink to ``/dev/zero`` is one error, not a hang or a
  ``MemoryError``.

Each is exit 2, one paragraph naming ``--resume``, the file and the fix, nothing written. Each root cause has a
``test_catches_*`` that puts the old code back and fails.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from badinput import Case, check_in_process, in_process_test, subprocess_test

from lifecycle.decide.config import LifecycleConfig

pytestmark = pytest.mark.bad_input

Setup = Callable[[Path], None]
CKPT = "run/ckpt/job-000002"
EVENTS = (
    '{"event": "lifecycle.started", "ts": 1.0}\n'
    '{"epoch": 3, "event": "engine.weights", "instance": "engine-0", "outcome": "loaded", "weight_version": "2"}\n'
    '{"event": "job.checkpointed", "path": "ckpt/job-000002", "resume_at": 2, "weight_version": "2"}\n'
)
ENTRY = {"actor": "job-a-engine-0", "epoch": 3, "server_pid": 4242, "url": "http://127.0.0.1:1", "updating": False}


def _config(tmp: Path, detach: bool) -> LifecycleConfig:
    from lifecycle.cli.args import _embedded

    extra = {"detach_engines": True} if detach else {}
    return LifecycleConfig.from_mapping({**_embedded("cpu"), "save": str(tmp / "run" / "ckpt"), **extra})


def _write_job(tmp: Path, *, detach: bool = False, rng: list[dict[str, Any]] | None = None) -> None:
    """``tmp/run``: a job of 5 steps started with --save ``run/ckpt``, checkpointed after step 2 (version 2),
    its log and metrics as the loop writes them (and, ``detach``, an engine ledger naming engine-0 at epoch 3)."""
    import torch

    from trainer.app.loop import RunOptions
    from trainer.app.run_manifest import write_run_manifest
    from trainer.job_state import JobCheckpoint, save_job_checkpoint

    config = _config(tmp, detach)
    run = tmp / "run"
    run.mkdir(parents=True, exist_ok=True)
    opts = RunOptions(steps=5, run_dir=run)
    write_run_manifest(run, config, opts.manifest(), job_id="job-a")
    facts = {"restarts": [[] for _ in range(config.num_rollout_engines)]}
    ranks = rng if rng is not None else [{"torch": torch.get_rng_state()}]
    job = JobCheckpoint(2, "2", {"w": torch.zeros(4)}, facts, {"ranks": ranks})
    save_job_checkpoint(run / "ckpt", job, config, {**opts.job_settings(), "id": "job-a"})
    (run / "events.jsonl").write_text(EVENTS)
    (run / "metrics.jsonl").write_text('{"step": 0, "reward": 0.5}\n{"step": 1, "reward": 0.5}\n')
    if detach:
        ledger = {"format": 1, "namespace": "rl-lifecycle", "engines": {"engine-0": ENTRY}}
        (run / "engines.json").write_text(json.dumps(ledger))


def _job(**kwargs: Any) -> Setup:
    return lambda tmp: _write_job(tmp, **kwargs)


def _resign(change: Callable[[dict[str, Any]], None]) -> Setup:
    """state.json changed and signed again (its sha256 recomputed): only the range checks can tell."""

    def setup(tmp: Path) -> None:
        from trainer.job_state import _digest

        path = tmp / CKPT / "state.json"
        doc = json.loads(path.read_text())
        change(doc)
        doc["sha256"] = _digest(doc)
        path.write_text(json.dumps(doc, sort_keys=True) + "\n")

    return setup


def _set(key: str, value: Any) -> Setup:
    return _resign(lambda doc: doc.__setitem__(key, value))


def _ledger(text: str | bytes) -> Setup:
    def setup(tmp: Path) -> None:
        path = tmp / "run" / "engines.json"
        path.write_bytes(text if isinstance(text, bytes) else text.encode())

    return setup


def _entry(**change: Any) -> Setup:
    body = {"format": 1, "namespace": "rl-lifecycle", "engines": {"engine-0": {**ENTRY, **change}}}
    return _ledger(json.dumps(body))


def _fifo(name: str) -> Setup:
    def setup(tmp: Path) -> None:
        path = tmp / "run" / name
        path.unlink(missing_ok=True)
        os.mkfifo(path)

    return setup


def _link(name: str, target: str) -> Setup:
    def setup(tmp: Path) -> None:
        path = tmp / "run" / name
        path.unlink(missing_ok=True)
        path.symlink_to(target)

    return setup


def _sparse(name: str, size: int) -> Setup:
    """``size`` bytes of zeros without a newline (sparse: costs no disk)."""

    def setup(tmp: Path) -> None:
        path = tmp / "run" / name
        with path.open("wb") as f:
            f.truncate(size)

    return setup


def _dir(name: str) -> Setup:
    def setup(tmp: Path) -> None:
        path = tmp / "run" / name
        path.unlink(missing_ok=True)
        path.mkdir()

    return setup


RESUME = ("run", "--resume", "{tmp}/run")
# a run whose engines were kept (--detach-engines) resumes on their cluster: joined last, after every file check
RESUME_KEPT = (*RESUME, "--ray-address", "127.0.0.1:1")
STATE = "{tmp}/" + CKPT + "/state.json"
NESTED = '{"format": 1, "namespace": "rl-lifecycle", "engines": ' + "[" * 100_000 + "]" * 100_000 + "}"
HUGE = 17 * 1024 * 1024

CASES: list[Case] = [
    # --- 3: state.json, re-signed: each value by the rule that wrote it -------------------------------------------
    Case(
        "resume-state-step-minus-1",
        RESUME,
        ("--resume", STATE, "step -1", "job-000002"),
        (_job(), _set("step", -1)),
        proc=True,
    ),
    Case("resume-state-step-of-another-dir", RESUME, ("--resume", STATE, "step 1"), (_job(), _set("step", 1))),
    Case("resume-state-step-past-the-end", RESUME, ("--resume", STATE, "step 9"), (_job(), _set("step", 9))),
    Case("resume-state-step-bool", RESUME, ("--resume", STATE, "True"), (_job(), _set("step", True))),
    Case("resume-state-step-string", RESUME, ("--resume", STATE, "'2'"), (_job(), _set("step", "2"))),
    Case(
        "resume-state-version-rewound",
        RESUME,
        ("--resume", STATE, "weight version 1", "{tmp}/run/events.jsonl", "version 2 was checkpointed"),
        (_job(), _set("weight_version", "1")),
    ),
    Case(
        "resume-state-version-not-a-number", RESUME, ("--resume", STATE, "'v2'"), (_job(), _set("weight_version", "v2"))
    ),
    Case("resume-state-version-negative", RESUME, ("--resume", STATE, "'-2'"), (_job(), _set("weight_version", "-2"))),
    Case("resume-state-version-padded", RESUME, ("--resume", STATE, "'02'"), (_job(), _set("weight_version", "02"))),
    Case(
        "resume-state-version-a-number",
        RESUME,
        ("--resume", STATE, "weight version 2"),
        (_job(), _set("weight_version", 2)),
    ),
    Case(
        "resume-state-rng-torch-wrong-size",
        RESUME,
        ("--resume", "{tmp}/" + CKPT, "RNG state for rank 0", "torch"),
        (lambda tmp: _write_job(tmp, rng=[{"torch": __import__("torch").zeros(10, dtype=__import__("torch").uint8)}]),),
    ),
    Case(
        "resume-state-rng-unknown-generator",
        RESUME,
        ("--resume", "{tmp}/" + CKPT, "RNG state for rank 0", "numpy"),
        (lambda tmp: _write_job(tmp, rng=[{"numpy": [1, 2, 3]}]),),
    ),
    Case(
        "resume-state-rng-python-wrong-shape",
        RESUME,
        ("--resume", "{tmp}/" + CKPT, "RNG state for rank 0", "random.getstate"),
        (lambda tmp: _write_job(tmp, rng=[{"python": [3, [1, 2], None]}]),),
    ),
    # --- 3: engines.json, bounded and by its schema -----------------------------------------------------------------
    Case(
        "resume-ledger-torn",
        RESUME_KEPT,
        ("--resume", "{tmp}/run/engines.json", "not valid JSON", "delete the file"),
        (_job(detach=True), _ledger('{"format": 1, "names')),
    ),
    Case(
        "resume-ledger-nested",
        RESUME_KEPT,
        ("--resume", "{tmp}/run/engines.json", "nested deeper"),
        (_job(detach=True), _ledger(NESTED)),
    ),
    Case(
        "resume-ledger-huge",
        RESUME_KEPT,
        ("--resume", "{tmp}/run/engines.json", "larger than"),
        (_job(detach=True), _sparse("engines.json", HUGE)),
    ),
    Case(
        "resume-ledger-dev-zero",
        RESUME_KEPT,
        ("--resume", "{tmp}/run/engines.json", "device"),
        (_job(detach=True), _link("engines.json", "/dev/zero")),
    ),
    Case(
        "resume-ledger-fifo",
        RESUME_KEPT,
        ("--resume", "{tmp}/run/engines.json", "FIFO"),
        (_job(detach=True), _fifo("engines.json")),
    ),
    Case(
        "resume-ledger-a-list",
        RESUME_KEPT,
        ("--resume", "{tmp}/run/engines.json", "format"),
        (_job(detach=True), _ledger("[]")),
    ),
    Case(
        "resume-ledger-string-epoch",
        RESUME_KEPT,
        ("--resume", "{tmp}/run/engines.json", "engine-0", "epoch '3'"),
        (_job(detach=True), _entry(epoch="3")),
        proc=True,
    ),
    Case(
        "resume-ledger-bool-epoch",
        RESUME_KEPT,
        ("--resume", "{tmp}/run/engines.json", "epoch True"),
        (_job(detach=True), _entry(epoch=True)),
    ),
    Case(
        "resume-ledger-negative-epoch",
        RESUME_KEPT,
        ("--resume", "{tmp}/run/engines.json", "epoch -1"),
        (_job(detach=True), _entry(epoch=-1)),
    ),
    Case(
        "resume-ledger-float-epoch",
        RESUME_KEPT,
        ("--resume", "{tmp}/run/engines.json", "epoch 3.0"),
        (_job(detach=True), _entry(epoch=3.0)),
    ),
    Case(
        "resume-ledger-unknown-key",
        RESUME_KEPT,
        ("--resume", "{tmp}/run/engines.json", "unknown keys", "sneaky"),
        (_job(detach=True), _entry(sneaky=1)),
    ),
    Case(
        "resume-ledger-string-updating",
        RESUME_KEPT,
        ("--resume", "{tmp}/run/engines.json", "updating"),
        (_job(detach=True), _entry(updating="no")),
    ),
    Case(
        "resume-ledger-bad-pid",
        RESUME_KEPT,
        ("--resume", "{tmp}/run/engines.json", "server_pid"),
        (_job(detach=True), _entry(server_pid=0)),
    ),
    Case(
        "resume-ledger-bad-url",
        RESUME_KEPT,
        ("--resume", "{tmp}/run/engines.json", "url"),
        (_job(detach=True), _entry(url="file:///etc/passwd")),
    ),
    Case(
        "resume-ledger-empty-actor",
        RESUME_KEPT,
        ("--resume", "{tmp}/run/engines.json", "actor"),
        (_job(detach=True), _entry(actor="")),
    ),
    Case(
        "resume-ledger-unknown-top-level-key",
        RESUME_KEPT,
        ("--resume", "{tmp}/run/engines.json", "keys"),
        (_job(detach=True), _ledger('{"format": 1, "namespace": "rl-lifecycle", "engines": {}, "x": 1}')),
    ),
    Case(
        "resume-ledger-duplicate-key",
        RESUME_KEPT,
        ("--resume", "{tmp}/run/engines.json", "duplicate key"),
        (_job(detach=True), _ledger('{"format": 1, "format": 1, "namespace": "rl-lifecycle", "engines": {}}')),
    ),
    # --- 4: the event log and the metrics, only regular files, never read whole -------------------------------------
    Case(
        "resume-events-fifo",
        RESUME,
        ("--resume", "{tmp}/run/events.jsonl", "FIFO"),
        (_job(), _fifo("events.jsonl")),
        proc=True,
    ),
    Case(
        "resume-events-dev-zero",
        RESUME,
        ("--resume", "{tmp}/run/events.jsonl", "device"),
        (_job(), _link("events.jsonl", "/dev/zero")),
    ),
    Case(
        "resume-events-dev-null",
        RESUME,
        ("--resume", "{tmp}/run/events.jsonl", "device"),
        (_job(), _link("events.jsonl", "/dev/null")),
    ),
    Case(
        "resume-events-a-directory",
        RESUME,
        ("--resume", "{tmp}/run/events.jsonl", "directory"),
        (_job(), _dir("events.jsonl")),
    ),
    Case(
        "resume-events-endless-line",
        RESUME,
        ("--resume", "{tmp}/run/events.jsonl", "longer than"),
        (_job(), _sparse("events.jsonl", HUGE)),
    ),
    Case(
        "resume-metrics-fifo",
        RESUME,
        ("--resume", "{tmp}/run/metrics.jsonl", "FIFO"),
        (_job(), _fifo("metrics.jsonl")),
    ),
    Case(
        "resume-metrics-dev-zero",
        RESUME,
        ("--resume", "{tmp}/run/metrics.jsonl", "device"),
        (_job(), _link("metrics.jsonl", "/dev/zero")),
    ),
]


test_bad_input_in_process = in_process_test(CASES)
test_bad_input_subprocess = subprocess_test(CASES)


def _case(case_id: str) -> Case:
    return next(c for c in CASES if c.id == case_id)


def _got_past(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past every check, --resume would enter the run directory and start Ray: stop right there instead."""
    monkeypatch.setattr("trainer.app.cli._check_run_dir", lambda path: (_ for _ in ()).throw(RuntimeError("got past")))


def test_an_honest_run_directory_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The checks refuse what no driver writes, not what one does: the same job, untouched, gets past them (its
    log's generations, a torn last log line, a ledger naming an engine)."""
    for detach in (False, True):
        base = tmp_path / str(detach)
        _write_job(base, detach=detach)
        with (base / "run" / "events.jsonl").open("a") as f:
            f.write('{"event": "engine.pro')  # the dead driver's torn last line
        _got_past(monkeypatch)
        with pytest.raises(RuntimeError, match="got past"):
            import lifecycle.cli as cli

            cli.main(["run", "--resume", str(base / "run"), *(["--ray-address", "127.0.0.1:1"] if detach else [])])


# -- generations only ever increase ---------------------------------------------------------------------------------
def _launched(ledger: dict[str, Any] | None, log: str, monkeypatch: pytest.MonkeyPatch | None = None) -> list[int]:
    """The generation each rollout slot's next new process gets on a resume that found ``ledger`` (None: none)
    and ``log``, through the ledger's and the log's readers and the core."""
    import tempfile

    from engines.ledger import KEEP_NAMESPACE, EngineLedger
    from lifecycle.decide.core import ROLLOUT, instance_name
    from lifecycle.decide.events import log_facts
    from lifecycle.decide.runner import Runner

    with tempfile.TemporaryDirectory() as d:
        run = Path(d)
        if ledger is not None:
            (run / "engines.json").write_text(json.dumps(ledger))
        (run / "events.jsonl").write_text(log)
        config = LifecycleConfig.from_mapping(
            {"rollout_num_gpus": 2, "save": str(run / "ckpt"), "load": str(run / "ckpt"), "detach_engines": True},
            check_paths=False,
        )
        runner = Runner(config)
        ids = [instance_name(ROLLOUT, i) for i in range(len(runner.state.engines))]
        engines = EngineLedger.read(run / "engines.json", KEEP_NAMESPACE)
        runner.keep(*engines.generations(ids, log_facts(run / "events.jsonl").epochs))
        # a kept slot whose adoption fails is launched; a slot with none is launched at once: either way, epoch + 1
        return [e.epoch + 1 for e in runner.state.engines]


LOG = "".join(
    json.dumps({"event": "engine.weights", "instance": f"engine-{i}", "epoch": epoch, "weight_version": "2"}) + "\n"
    for i, epoch in ((0, 3), (1, 5))
)
HONEST = {
    "format": 1,
    "namespace": "rl-lifecycle",
    "engines": {f"engine-{i}": {**ENTRY, "actor": f"job-a-engine-{i}", "epoch": e} for i, e in ((0, 3), (1, 5))},
}


def _rewound(by: int) -> dict[str, Any]:
    body = json.loads(json.dumps(HONEST))
    for entry in body["engines"].values():
        entry["epoch"] -= by
    return body


def _forgot(engine: str) -> dict[str, Any]:
    body = json.loads(json.dumps(HONEST))
    del body["engines"][engine]
    return body


def _above_every_logged_generation() -> None:
    """Generations fence news per engine: each slot's next process is above every generation that slot ever
    had (a slot launched afresh: above every one of the run directory)."""
    used = [3, 5]  # what the log records, per slot
    for name, ledger in (
        ("rewound by one", _rewound(1)),
        ("rewound to 0", _rewound(3)),
        ("forgot engine-1 (its process died)", _forgot("engine-1")),
        ("deleted", None),
    ):
        launched = _launched(ledger, LOG)
        assert all(new > old for new, old in zip(launched, used, strict=True)), (
            f"ledger {name}: new generations {launched}, used {used}"
        )
        if ledger is None or name.startswith("rewound"):  # nothing adopted: every slot starts above them all
            assert min(launched) > max(used), f"ledger {name}: new generations {launched}, used {used}"


def test_a_new_process_gets_a_generation_above_every_one_the_run_directory_used() -> None:
    _above_every_logged_generation()
    # the honest ledger: its slots are adopted at their own generations (a failed adoption relaunches above them)
    assert _launched(HONEST, LOG) == [4, 6]


def test_a_ledger_behind_the_log_is_not_adopted() -> None:
    """A slot the ledger names below what the log records for it is not the ledger's process: launched, not
    adopted (the kept actor reports its own generation and would refuse that adoption anyway)."""
    from engines.ledger import EngineLedger, Kept

    ledger = EngineLedger(Path("engines.json"), "ns", {"engine-0": Kept("a", 2), "engine-1": Kept("b", 5)})
    assert ledger.generations(["engine-0", "engine-1"], {"engine-0": 3, "engine-1": 5}) == ((None, 5), 5)


def test_the_tail_alone_is_read_and_only_a_torn_line_is_cut(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A log of any length costs one line's bound to continue; nothing but an unended last line is cut."""
    from lifecycle.decide.events import cut_torn_tail

    monkeypatch.setattr(Path, "read_bytes", lambda self: pytest.fail("the whole log was read"))
    log = tmp_path / "events.jsonl"
    with log.open("wb") as f:
        f.truncate(64 * 1024 * 1024)  # 64 MiB of history (sparse)
        f.seek(0, os.SEEK_END)
        f.write(b'\n{"event": "a"}\n{"event": "b", "x')
    assert cut_torn_tail(log, max_line_bytes=1024) == b'{"event": "b", "x'
    assert log.read_text(errors="replace").endswith('{"event": "a"}\n')
    assert cut_torn_tail(log, max_line_bytes=1024) == b""  # a whole last line stays
    assert cut_torn_tail(tmp_path / "none.jsonl") == b""


# -- each cause re-introduced: the checks above fail -------------------------------------------------------------------
def test_catches_a_ledger_read_with_a_bare_json_loads(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("engines.ledger.loads", lambda raw, **kw: json.loads(raw))
    with pytest.raises((AssertionError, RecursionError)):
        check_in_process(_case("resume-ledger-nested"), tmp_path, capsys)


def test_catches_a_ledger_entry_trusted_once_read(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("engines.ledger._entry_problem", lambda entry: "")
    _got_past(monkeypatch)
    with pytest.raises(RuntimeError, match="got past"):  # a string epoch handed on to the core
        check_in_process(_case("resume-ledger-string-epoch"), tmp_path, capsys)


@pytest.mark.parametrize(
    ("check", "case"),
    [
        ("trainer.job_state.check_step", "resume-state-step-minus-1"),
        ("trainer.job_state.check_step", "resume-state-version-not-a-number"),
        ("trainer.job_state.check_against_log", "resume-state-version-rewound"),
        ("trainer.job_state._rng_problem", "resume-state-rng-torch-wrong-size"),
    ],
)
def test_catches_a_checkpoint_trusted_once_read(
    check: str, case: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(check, lambda *args: "")
    _got_past(monkeypatch)
    with pytest.raises(RuntimeError, match="got past"):
        check_in_process(_case(case), tmp_path, capsys)


def test_catches_generations_taken_from_the_ledger_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    from engines.ledger import EngineLedger

    def old(self: EngineLedger, engine_ids: list[str], logged: Any) -> tuple[tuple[int | None, ...], int]:
        return self.epochs(engine_ids), 0  # Core.with_kept's floor: the ledger's latest generation

    monkeypatch.setattr(EngineLedger, "generations", old)
    with pytest.raises(AssertionError, match="rewound by one"):
        _above_every_logged_generation()


def test_catches_a_log_read_whole_or_opened_unchecked(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The old reader: ``open`` on whatever is there, ``read_bytes`` of all of it. A FIFO would hang it and
    ``/dev/zero`` exhaust memory; ``/dev/null`` shows it without either -- taken for an empty log (into which the
    resumed run's events would then vanish)."""
    import lifecycle.decide.events as events
    import lifecycle.decide.jsonio as jsonio

    def old_cut(path: str | os.PathLike[str], **kw: Any) -> bytes:
        p = Path(path)
        data = p.read_bytes() if p.exists() else b""
        return b"" if not data or data.endswith(b"\n") else data[data.rfind(b"\n") + 1 :]

    monkeypatch.setattr(jsonio, "open_regular", lambda path, mode="rb": open(path, mode))  # noqa: SIM115
    monkeypatch.setattr("trainer.job_state.open_regular", lambda path, mode="rb": open(path, mode))  # noqa: SIM115
    monkeypatch.setattr(events, "cut_torn_tail", old_cut)
    _got_past(monkeypatch)
    with pytest.raises(RuntimeError, match="got past"):
        check_in_process(_case("resume-events-dev-null"), tmp_path, capsys)
    monkeypatch.setattr(Path, "read_bytes", lambda self: pytest.fail("the whole log was read"))
    with pytest.raises(pytest.fail.Exception, match="the whole log was read"):
        old_cut(tmp_path / "run" / "metrics.jsonl")
