"""Checkpoints of the whole job (miles' ``--save``/``--load``): what a run needs to continue after its driver died.

One checkpoint is a directory ``SAVE/job-<step>`` holding ``state.safetensors`` (every tensor: the trainer's
model and optimizer, RNG states) and ``state.json`` (everything else: the step to continue at, the committed
weight version, the lifecycle's facts, the config it was written under, the sha256 of the tensor file and its
own). It is written whole under a hidden name and renamed into place
(:func:`engines.models.checkpoint.write_directory`),
and ``SAVE/latest`` names it only afterwards, so a half-written checkpoint is never the latest (the hidden leftover
of a driver killed mid-write goes with the next write; no complete checkpoint is ever removed). Reading never
unpickles: tensors come from safetensors, the rest from JSON, and each is checked before it is used.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from engines.models.checkpoint import remove_leftovers, write_directory
from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.errors import ConfigError, bounded_repr
from lifecycle.decide.events import LogFacts, log_facts
from lifecycle.decide.jsonio import JSONFileError, iter_lines, loads, open_regular, read_json, read_text
from rollout.stream import stream_problem

FORMAT = "rl-lifecycle/job-checkpoint@1"
LATEST = "latest"  # SAVE/latest: names the newest job checkpoint
JOB_PREFIX = "job-"  # SAVE/job-<step>
TENSORS, MANIFEST = "state.safetensors", "state.json"
NAME = re.compile(r"^job-(\d{6,})$")
FLAG = "--load"
INTACT = (
    "restore the directory from a copy, or start a new run (its own --run-dir) with --load at a directory whose"
    " latest names an intact job-* checkpoint"
)


@dataclass(frozen=True)
class JobCheckpoint:
    """The job at the end of step ``step - 1``: a resumed run starts at rollout id ``step``."""

    step: int
    weight_version: str
    trainer: Mapping[str, Any]  # the backend's get_state(): nested dicts/lists of tensors and plain values
    lifecycle: Mapping[str, Any] = field(default_factory=dict)  # which engines exist, their restart budgets
    rng: Mapping[str, Any] = field(default_factory=dict)  # {"ranks": [each worker's rng_state(), by rank]}
    path: Path | None = None  # where it was read from
    job_id: str | None = None  # the job that wrote it (run.json's job_id; None: written before jobs had one)

    @property
    def restart_ages(self) -> list[list[float]]:
        """Each rollout engine's counted restarts, as ages in seconds (``lifecycle["restarts"]``, checked when
        the checkpoint was read)."""
        return [[float(a) for a in r] for r in self.lifecycle.get("restarts", [])]

    @property
    def target(self) -> int | None:
        """An elastic fleet's target when the checkpoint was written (checked when it was read); None: the job's
        fleet had a fixed size, or the checkpoint predates the record (the resume starts --rollout-num-gpus)."""
        target = self.lifecycle.get("target")
        return target if isinstance(target, int) and not isinstance(target, bool) else None

    @property
    def stream(self) -> dict[str, Any] | None:
        """A stream's record (``--fully-async``): its prompt cursor, the prompts to send again, its completed
        groups with their versions (checked when the checkpoint was read); None when the job did not stream."""
        record = self.lifecycle.get("stream")
        return dict(record) if isinstance(record, Mapping) else None

    @property
    def ranks(self) -> int:
        """How many trainer workers wrote it (one RNG state each)."""
        return len(self.rng.get("ranks", []))


def _check_facts(checkpoint: JobCheckpoint, config: LifecycleConfig) -> None:
    """What the lifecycle and the workers will be given, checked before anything starts."""
    rows = checkpoint.lifecycle.get("restarts", [])
    if (
        not isinstance(rows, list)
        or len(rows) != config.max_rollout_engines  # one row per engine slot
        or not all(isinstance(r, list) and all(isinstance(a, int | float) and a >= 0 for a in r) for r in rows)
    ):
        raise ConfigError(FLAG, str(checkpoint.path), "records malformed restart budgets", INTACT)
    target = checkpoint.lifecycle.get("target")
    if target is not None and (
        isinstance(target, bool)
        or not isinstance(target, int)
        or not config.min_rollout_engines <= target <= config.max_rollout_engines
    ):
        low, high = config.min_rollout_engines, config.max_rollout_engines
        why = f"records a fleet target of {target!r} engines, outside the fleet's bounds {low}..{high}"
        raise ConfigError(FLAG, str(checkpoint.path), why, INTACT)
    record = checkpoint.lifecycle.get("stream")
    if (record is not None) != bool(config.fully_async):
        has = "records a stream" if record is not None else "records no stream"
        raise ConfigError(
            "--fully-async",
            config.fully_async,
            f"the job checkpoint {checkpoint.path} {has}: it was written by a job that "
            f"{'streamed' if record is not None else 'did not stream'}",
            "resume it with the --fully-async setting it was written with",
        )
    if record is not None:
        problem = stream_problem(record, checkpoint.weight_version)
        if problem:
            raise ConfigError(FLAG, str(checkpoint.path), f"records a malformed stream: {problem}", INTACT)
    ranks = checkpoint.rng.get("ranks")
    if not isinstance(ranks, list) or not ranks or not all(isinstance(r, Mapping) for r in ranks):
        raise ConfigError(FLAG, str(checkpoint.path), "records no RNG state per trainer worker", INTACT)
    for rank, state in enumerate(ranks):
        problem = _rng_problem(state)
        if problem:
            raise ConfigError(
                FLAG, str(checkpoint.path), f"records a malformed RNG state for rank {rank}: {problem}", INTACT
            )


def _rng_problem(state: Mapping[str, Any]) -> str:
    """Why one worker's RNG state is not what ``TrainerWorker.rng_state`` returns ("" where it is): torch's CPU
    generator state (bytes of its own size) and Python's ``random.getstate()`` (version 3, 625 words, a gauss)."""
    unknown = sorted(set(state) - {"torch", "python"})
    if unknown:
        return f"unknown generators {unknown}"
    if "torch" in state:
        t, size = state["torch"], torch.get_rng_state().numel()
        if not isinstance(t, torch.Tensor) or t.dtype != torch.uint8 or t.dim() != 1 or t.numel() != size:
            got = f"{t.dtype} of shape {list(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            return f"torch's is {got}, not {size} bytes"
    if "python" in state:
        py = state["python"]
        if not (
            isinstance(py, list | tuple)
            and len(py) == 3
            and py[0] == 3
            and isinstance(py[1], list | tuple)
            and len(py[1]) == 625
            and all(isinstance(w, int) and not isinstance(w, bool) and 0 <= w < 2**32 for w in py[1])
            and (py[2] is None or isinstance(py[2], float))
        ):
            return "Python's is not random.getstate()'s (version 3, 625 words, a gauss)"
    return ""


def check_step(checkpoint: JobCheckpoint) -> None:
    """The step and the weight version, by the rules that wrote them: the directory is ``job-<step>`` and
    ``latest`` names it (a step that disagrees with its own directory was edited), and a version is the decimal
    form of the whole number a loop pushed (``update_weights(version: int)``; "0": the initial weights)."""
    where = checkpoint.path
    match = NAME.match(where.name) if where is not None else None
    if where is not None and (match is None or int(match.group(1)) != checkpoint.step):
        raise _refuse(where / MANIFEST, f"records step {checkpoint.step}, but it is {where.name}", INTACT)
    if checkpoint.step < 0:
        raise _refuse(where or "state.json", f"records step {checkpoint.step}: a step is 0 or more", INTACT)
    version = checkpoint.weight_version
    if not (version.isascii() and version.isdigit() and str(int(version)) == version):
        problem = f"records weight version {version[:40]!r}, not the whole number a weight update pushed"
        raise _refuse(where / MANIFEST if where is not None else "state.json", problem, INTACT)


# Where a job's checkpoints go and come from is not part of the job: a resumed run sets --load, and may save
# elsewhere or at another interval, and is still the same job.
LOCATION = frozenset({"save", "save_interval", "load"})


def job_settings(config: LifecycleConfig | Mapping[str, Any]) -> dict[str, Any]:
    values = config.to_dict() if isinstance(config, LifecycleConfig) else config
    return {k: v for k, v in values.items() if k not in LOCATION}


def _plain(job: Mapping[str, Any] | None) -> dict[str, Any]:
    """A job's loop settings (``RunOptions.job_settings()``) as JSON reads them back, its ``id`` left out."""
    plain: dict[str, Any] = json.loads(json.dumps({k: v for k, v in (job or {}).items() if k != "id"}, default=str))
    return plain


def fingerprint(config: LifecycleConfig, job: Mapping[str, Any] | None = None) -> str:
    """The settings a checkpoint belongs to -- the config's and the loop's (``job``: seed, lr, model, trainer
    workers, ...): a run under other settings is another job's, and its state is never continued."""
    settings, loop = job_settings(config), _plain(job)
    body: dict[str, Any] = {"config": settings, "job": loop} if loop else settings
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


# -- nested state <-> (JSON skeleton, flat tensors) --------------------------------------------------------------
def _flatten(value: Any, path: str, tensors: dict[str, torch.Tensor]) -> Any:
    """JSON for ``value`` with every tensor moved into ``tensors`` under its path (dict keys keep their type)."""
    if isinstance(value, torch.Tensor):
        tensors[path] = value.detach().cpu().contiguous()
        return {"$tensor": path}
    if isinstance(value, Mapping):
        return {"$dict": [[k, _flatten(v, f"{path}/{k}", tensors)] for k, v in value.items()]}
    if isinstance(value, (list, tuple)):
        items = [_flatten(v, f"{path}/{i}", tensors) for i, v in enumerate(value)]
        return {"$tuple" if isinstance(value, tuple) else "$list": items}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"{path}: a {type(value).__name__} cannot go into a job checkpoint (tensors and plain values)")


def _restore(value: Any, tensors: Mapping[str, torch.Tensor], where: str) -> Any:
    if isinstance(value, dict):
        if "$tensor" in value:
            name = value["$tensor"]
            if name not in tensors:
                raise ValueError(f"{where}: tensor {name!r} is not in {TENSORS}")
            return tensors[name]
        if "$dict" in value:
            return {k: _restore(v, tensors, where) for k, v in value["$dict"]}
        if "$list" in value:
            return [_restore(v, tensors, where) for v in value["$list"]]
        if "$tuple" in value:
            return tuple(_restore(v, tensors, where) for v in value["$tuple"])
        raise ValueError(f"{where}: unknown entry {sorted(value)}")
    return value


def _digest(manifest: Mapping[str, Any]) -> str:
    """The sha256 of a manifest's content (its own ``sha256`` entry left out), as JSON reads it back."""
    body = {k: v for k, v in manifest.items() if k != "sha256"}
    return hashlib.sha256(json.dumps(json.loads(json.dumps(body)), sort_keys=True).encode()).hexdigest()


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# -- writing -----------------------------------------------------------------------------------------------------
def save_job_checkpoint(
    save_dir: str | os.PathLike[str],
    checkpoint: JobCheckpoint,
    config: LifecycleConfig,
    job: Mapping[str, Any] | None = None,
) -> Path:
    """Write ``SAVE/job-<step>`` atomically, then point ``SAVE/latest`` at it (also atomically). ``job``: the
    loop's settings it belongs to (``RunOptions.job_settings()``) and the job's ``id`` (run.json's job_id)."""
    root = Path(save_dir)
    tensors: dict[str, torch.Tensor] = {}
    skeleton = {
        "trainer": _flatten(dict(checkpoint.trainer), "trainer", tensors),
        "lifecycle": _flatten(dict(checkpoint.lifecycle), "lifecycle", tensors),
        "rng": _flatten(dict(checkpoint.rng), "rng", tensors),
    }
    name = f"job-{checkpoint.step:06d}"

    def fill(tmp: Path) -> None:
        save_file(tensors, str(tmp / TENSORS), metadata={"format": FORMAT})
        manifest = {
            "format": FORMAT,
            "step": checkpoint.step,
            "weight_version": checkpoint.weight_version,
            "config": config.to_dict(),
            "config_sha256": fingerprint(config, job),
            "files": {TENSORS: _sha256(tmp / TENSORS)},
            "state": skeleton,
        }
        if job:  # the loop's settings and the job's identity (a bare TrainerGroup's checkpoints record none)
            manifest["job"], manifest["job_id"] = _plain(job), job.get("id")
        manifest["sha256"] = _digest(manifest)  # the lifecycle facts and the step are checked like the tensors
        (tmp / MANIFEST).write_text(json.dumps(manifest, sort_keys=True) + "\n")

    final = write_directory(root / name, fill)
    pointer = root / f".{LATEST}.tmp-{os.getpid()}"
    pointer.write_text(name + "\n")
    with pointer.open("rb") as f:
        os.fsync(f.fileno())
    os.replace(pointer, root / LATEST)
    remove_leftovers(root, "job")  # of a driver killed while it wrote one
    return final


# -- reading -----------------------------------------------------------------------------------------------------
def _refuse(path: Path | str, problem: str, fix: str) -> ConfigError:
    return ConfigError(FLAG, str(path), problem, fix)


def latest_checkpoint(save_dir: str | os.PathLike[str]) -> Path:
    """The directory ``SAVE/latest`` names (raises one ConfigError naming --load and the fix)."""
    root = Path(save_dir)
    if not root.is_dir():
        raise _refuse(root, "no such directory", "pass the --save directory of an earlier run")
    pointer = root / LATEST
    if not pointer.is_file():
        fix = "pass the --save directory of a run that saved one"
        raise _refuse(root, f"holds no job checkpoint (no {LATEST} file)", fix)
    try:
        name = read_text(pointer, max_bytes=256).strip()
    except JSONFileError as exc:
        raise _refuse(pointer, f"cannot be read ({exc.problem})", INTACT) from None
    if not NAME.match(name) or not (root / name).is_dir():
        raise _refuse(pointer, f"names {name!r}, which is not a checkpoint here", INTACT)
    return root / name


def _manifest(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise _refuse(path, "is missing (the checkpoint is incomplete)", INTACT)
    try:  # NaN allowed: the trainer's state holds numbers a run computed (the sha256 below guards the rest)
        manifest = read_json(path, allow_nan=True)
    except JSONFileError as exc:
        raise _refuse(path, f"cannot be read ({exc.problem}): truncated or not a job checkpoint", INTACT) from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        got = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise _refuse(path, f"is not a {FORMAT} manifest (format {got!r})", "pass a directory lifecycle run wrote")
    return manifest


def load_job_checkpoint(
    save_dir: str | os.PathLike[str], config: LifecycleConfig, job: Mapping[str, Any] | None = None
) -> JobCheckpoint:
    """The latest checkpoint under ``save_dir``, checked whole before anything of it is used: its format, the
    sha256 of its tensors, that it was written under ``config`` and the loop settings ``job``, and (``job["id"]``)
    by that job (a foreign job's state is never resumed). A checkpoint that records no loop settings (written
    before they were recorded) is matched on the config alone."""
    where = latest_checkpoint(save_dir)
    manifest_path, tensors_path = where / MANIFEST, where / TENSORS
    manifest = _manifest(manifest_path)
    if manifest.get("sha256") != _digest(manifest):
        raise _refuse(manifest_path, "does not match the sha256 it records: changed since written", INTACT)
    if not tensors_path.is_file():
        raise _refuse(tensors_path, "is missing (the checkpoint is incomplete)", INTACT)
    files = manifest.get("files")
    if not isinstance(files, dict) or _sha256(tensors_path) != files.get(TENSORS):
        raise _refuse(tensors_path, "does not match the sha256 its manifest records: changed since written", INTACT)
    recorded_job = manifest.get("job")
    ours_job = _plain(job) if "job" in manifest else {}
    if manifest.get("config_sha256") != fingerprint(config, ours_job):
        recorded = manifest.get("config")
        theirs = {**job_settings(recorded if isinstance(recorded, dict) else {})}
        theirs.update(recorded_job if isinstance(recorded_job, dict) else {})
        ours = {**job_settings(config), **ours_job}
        changed = sorted(k for k in set(theirs) | set(ours) if theirs.get(k) != ours.get(k))
        raise _refuse(
            where,
            f"was written by a run with other settings (differing: {', '.join(changed) or 'unknown'})",
            "resume with the settings of the run that wrote it, or start a new run without --load",
        )
    expected, recorded_id = (job or {}).get("id"), manifest.get("job_id")
    if expected is not None and recorded_id is not None and expected != recorded_id:
        raise _refuse(
            where,
            f"was written by another job (job {str(recorded_id)[:40]!r}, not {str(expected)[:40]!r}): its save "
            "directory was given to another run",
            "resume the run directory whose run.json names that job, or restore this job's checkpoints there",
        )
    try:
        tensors = load_file(str(tensors_path))
    except (SafetensorError, OSError) as exc:
        raise _refuse(tensors_path, f"cannot be read as safetensors ({exc})", INTACT) from None
    try:
        state = {k: _restore(v, tensors, str(manifest_path)) for k, v in manifest["state"].items()}
        step, version = manifest["step"], manifest["weight_version"]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise _refuse(manifest_path, f"is malformed ({exc})", INTACT) from None
    if not isinstance(step, int) or isinstance(step, bool) or not isinstance(version, str):  # as they were written
        problem = f"records step {bounded_repr(step)} and weight version {bounded_repr(version)}: not an int and a str"
        raise _refuse(manifest_path, problem, INTACT)
    job_id = recorded_id if isinstance(recorded_id, str) else None
    checkpoint = JobCheckpoint(step, version, state["trainer"], state["lifecycle"], state["rng"], where, job_id)
    check_step(checkpoint)
    _check_facts(checkpoint, config)
    return checkpoint


def check_against_log(checkpoint: JobCheckpoint, facts: LogFacts, log: Path) -> None:
    """The checkpoint a resume continues from, against what the job's own event log recorded: a weight version
    older than one the log says was checkpointed would have the resumed run commit versions backwards -- the
    log's own rule (``weight_version_never_goes_backwards``), applied before anything starts, not after."""
    last = facts.checkpointed
    version = checkpoint.weight_version
    if last is None or not (last[1].isdigit() and version.isdigit()) or int(version) >= int(last[1]):
        return
    where = checkpoint.path / MANIFEST if checkpoint.path is not None else "state.json"
    raise _refuse(
        where,
        f"records weight version {checkpoint.weight_version}, but {log} says version {last[1]} was checkpointed "
        f"(at step {last[0]}): the checkpoint is older than the log it continues",
        INTACT,
    )


def continue_metrics(path: Path, step: int) -> tuple[list[dict[str, Any]], list[int]]:
    """A resumed run's ``metrics.jsonl``: the rows of the steps before ``step`` stay; the rows of later steps
    (the dead driver ran them after its checkpoint, and they are run again) move to ``metrics.superseded.jsonl``.
    Returns the kept rows and the superseded steps."""
    kept: list[dict[str, Any]] = []
    superseded: list[bytes] = []  # as they were, whatever they hold: nothing of the dead driver's is lost
    steps: list[int] = []
    try:
        if path.exists() or path.is_symlink():
            with open_regular(path):
                pass  # a FIFO would block the read below for ever, a device never ends
        lines = list(iter_lines(path)) if path.exists() else []
    except JSONFileError as exc:
        raise ConfigError(FLAG, str(exc), exc.problem, "move that file aside (one row of JSON per step)") from None
    for line in lines:
        if not line.raw.strip():
            continue
        try:
            row = loads(line.raw, source=path, line=line.number, allow_nan=True)
        except JSONFileError as exc:
            if line is lines[-1]:  # a torn last line: the driver died writing it; its step is run again
                superseded.append(line.raw)
                continue
            raise ConfigError(
                FLAG,
                f"{path}:{line.number}",
                f"is not a metrics row ({exc.problem})",
                "remove that line (one row of JSON per step)",
            ) from None
        if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] < step:
            kept.append(row)
        else:
            superseded.append(line.raw)
            if isinstance(row, dict) and isinstance(row.get("step"), int):
                steps.append(row["step"])
    if superseded:
        with path.with_name("metrics.superseded.jsonl").open("ab") as f:
            f.writelines(raw + b"\n" for raw in superseded)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text("".join(json.dumps(row) + "\n" for row in kept))
    os.replace(tmp, path)
    return kept, steps


def check_run_files(
    run_dir: Path, checkpoint: JobCheckpoint, config: LifecycleConfig, flag: str = "--resume"
) -> LogFacts:
    """What a resume reads back from its run directory besides the checkpoint, checked before anything is written
    or started: ``events.jsonl`` and ``metrics.jsonl`` are regular files whose lines are bounded, the
    checkpoint is not older than the log says, and (``--detach-engines``) ``engines.json`` is a ledger as the
    driver writes it. Returns the log's facts. Each problem is one ConfigError naming the file and the fix."""
    from engines.ledger import KEEP_NAMESPACE, LEDGER, EngineLedger, LedgerError

    events = run_dir / "events.jsonl"
    try:
        facts = log_facts(events)
        metrics = run_dir / "metrics.jsonl"
        if metrics.exists() or metrics.is_symlink():
            with open_regular(metrics):
                pass
    except JSONFileError as exc:
        where = f"{exc.path}:{exc.line}" if exc.line is not None else exc.path
        fix = "move that file aside, or restore the one the run wrote (a regular file of JSON lines)"
        raise ConfigError(flag, where, exc.problem, fix) from None
    try:
        check_against_log(checkpoint, facts, events)
        if config.detach_engines:
            EngineLedger.read(run_dir / LEDGER, KEEP_NAMESPACE)
    except ConfigError as exc:
        raise ConfigError(flag, exc.value, exc.problem, exc.fix) from None
    except LedgerError as exc:
        raise ConfigError(flag, str(exc.path), f"is not an engine ledger ({exc.problem})", exc.fix) from None
    return facts
