"""Bad-input corpus, readers (issue 27, causes 1, 3, 4 and 9 in part): every JSON/JSONL file a command reads
goes through ``lifecycle.decide.jsonio`` -- a line nested 100,000 deep, a 5,000-digit number, bytes that are not UTF-8,
``/dev/zero``, a sparse 5 GB weights file with a garbage header -- and a replay file whose checksum is valid but
whose samples the trainer cannot use is refused when read, naming the file, the sample and the field.

Each case is one line, checked by :func:`badinput.check_in_process` (exit 2, one paragraph naming the input and
the fix, nothing written). The ``test_catches_*`` tests at the end put each old reader back and watch a case fail.
"""

from __future__ import annotations

import json
import os
import stat
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from badinput import (
    R0,
    REPLAY,
    SAMPLE,
    Case,
    _paragraph_problems,
    _replay,
    _write,
    check_in_process,
    in_process_test,
    subprocess_test,
)

import lifecycle.cli as cli
from lifecycle.decide import jsonio

pytestmark = pytest.mark.bad_input

DEEP = "[" * 100_000 + "]" * 100_000  # RecursionError in json.loads
HUGE = "1" * 5000  # ValueError: past Python's 4,300-digit int limit
GOOD = '{"event": "x"}\n'
CHAR_CONFIG = '{"model_type": "rl-lifecycle-char", "model_size": "tiny"}'
FIVE_GB = 5 * 2**30


def _trace_cases(kind: str, content: str | bytes, names: tuple[str, ...] = ()) -> list[Case]:
    """The same bad log through every ``trace`` subcommand (``diff`` with a good left side)."""
    e = "{tmp}/e.jsonl"
    setup = (_write("e.jsonl", content), _write("a.jsonl", GOOD))
    argvs = {
        "show": ("trace", "show", e),
        "diff": ("trace", "diff", "{tmp}/a.jsonl", e),
        "check": ("trace", "check", e),
        "timeline": ("trace", "timeline", e, "-o", "{tmp}/t.html"),
    }
    return [Case(f"trace-{sub}-{kind}", argv, (e, *names), setup) for sub, argv in argvs.items()]


def _dev_zero_cases() -> list[Case]:
    z = "/dev/zero"
    argvs = {
        "show": ("trace", "show", z),
        "diff": ("trace", "diff", z, z),
        "check": ("trace", "check", z),
        "timeline": ("trace", "timeline", z, "-o", "{tmp}/t.html"),
    }
    return [Case(f"trace-{sub}-dev-zero", argv, (z, "character device")) for sub, argv in argvs.items()]


def _config_json(content: str | bytes) -> Callable[[Path], None]:
    """A checkpoint directory whose config.json is ``content`` (its weights file is never reached)."""

    def setup(tmp: Path) -> None:
        _write("ckpt/config.json", content)(tmp)
        _write("ckpt/model.safetensors", b"")(tmp)

    return setup


HF = ("run", "--hf-checkpoint", "{tmp}/ckpt", "--run-dir", "{tmp}/run")
HF_CONFIG = ("--hf-checkpoint", "{tmp}/ckpt/config.json")
COMPARE = ("graph", "--format", "html", "-o", "{tmp}/r.html", "--compare", "{tmp}/ref.json")

CASES: list[Case] = [
    # --- event logs: every trace subcommand ------------------------------------------------------------------
    *_trace_cases("deep-line", GOOD + DEEP + "\n", (":2:", "nested deeper")),
    *_trace_cases("huge-number", '{"event": "x", "n": ' + HUGE + "}\n", (":1:", "digits")),
    *_trace_cases("not-utf8", GOOD.encode() + b'{"event": "\xff\xfe"}\n', (":2:", "UTF-8")),
    *_dev_zero_cases(),
    # --- replay files: a valid checksum, samples the trainer cannot use --------------------------------------
    Case(
        "replay-nan-reward",
        REPLAY,
        ("--load-debug-rollout-data", R0, "sample 0", "'reward'", "nan"),
        (_replay(samples=[{**SAMPLE, "reward": float("nan")}]),),
    ),
    Case(
        "replay-reward-out-of-range",
        REPLAY,
        ("--load-debug-rollout-data", R0, "sample 1", "'reward'", "7.0", "[0, 1]"),
        (_replay(samples=[SAMPLE, {**SAMPLE, "index": 1, "reward": 7.0}]),),
    ),
    Case(
        "replay-empty-output-ids",
        REPLAY,
        ("--load-debug-rollout-data", R0, "sample 0", "'output_ids'", "empty"),
        (_replay(samples=[{**SAMPLE, "output_ids": []}]),),
    ),
    Case(
        "replay-string-ids",
        REPLAY,
        ("--load-debug-rollout-data", R0, "sample 0", "'output_ids'", "token ids"),
        (_replay(samples=[{**SAMPLE, "output_ids": ["3", "4"]}]),),
        proc=True,
    ),
    Case(
        "replay-string-prompt-ids",
        REPLAY,
        ("--load-debug-rollout-data", R0, "sample 0", "'prompt_ids'", "token ids"),
        (_replay(samples=[{**SAMPLE, "prompt_ids": ["1", "2"]}]),),
    ),
    Case(
        "replay-deep-json",
        REPLAY,
        ("--load-debug-rollout-data", R0, "nested deeper"),
        (_replay(damage=lambda p: p.write_text(DEEP)),),
        proc=True,
    ),
    Case(
        "replay-huge-number",
        REPLAY,
        ("--load-debug-rollout-data", R0, "digits"),
        (_replay(damage=lambda p: p.write_text(p.read_text().replace('"reward": 1.0', '"reward": ' + HUGE))),),
    ),
    Case(
        "replay-not-utf8",
        REPLAY,
        ("--load-debug-rollout-data", R0, "UTF-8"),
        (_replay(damage=lambda p: p.write_bytes(p.read_bytes().replace(b'"xy:"', b'"\xff\xfe"'))),),
    ),
    # --- an --hf-checkpoint's config.json ----------------------------------------------------------------------
    Case("hf-config-deep", HF, (*HF_CONFIG, "nested deeper"), (_config_json(DEEP),), proc=True),
    Case(
        "hf-config-huge-number",
        HF,
        (*HF_CONFIG, "digits"),
        (_config_json('{"model_type": "rl-lifecycle-char", "model_size": "tiny", "n": ' + HUGE + "}"),),
    ),
    Case(
        "hf-config-duplicate-keys",
        HF,
        (*HF_CONFIG, "duplicate key 'model_type'"),
        (_config_json('{"model_type": "rl-lifecycle-char", "model_size": "tiny", "model_type": "llama"}'),),
    ),
    Case("hf-config-not-utf8", HF, (*HF_CONFIG, "UTF-8"), (_config_json(b'{"model_type": "\xff"}'),)),
    Case(  # a weights header longer than the file it is in (a small file: the sparse ones are below)
        "hf-weights-header-past-file",
        HF,
        ("--hf-checkpoint", "{tmp}/ckpt/model.safetensors", "runs past the end"),
        (_write("ckpt/config.json", CHAR_CONFIG), _write("ckpt/model.safetensors", struct.pack("<Q", 10**6) + b"{}")),
    ),
    # --- graph --compare ----------------------------------------------------------------------------------------
    Case("graph-compare-deep", COMPARE, ("--compare", "{tmp}/ref.json", "nested deeper"), (_write("ref.json", DEEP),)),
    Case(
        "graph-compare-huge-number",
        COMPARE,
        ("--compare", "{tmp}/ref.json", "digits"),
        (_write("ref.json", '{"schema": ' + HUGE + "}"),),
    ),
]


test_bad_input_in_process = in_process_test(CASES)
test_bad_input_subprocess = subprocess_test(CASES)


def test_corpus_is_distinct_and_covers_every_trace_subcommand() -> None:
    assert len({c.id for c in CASES}) == len(CASES)
    for sub in ("show", "diff", "check", "timeline"):
        assert {f"trace-{sub}-{k}" for k in ("deep-line", "huge-number", "not-utf8", "dev-zero")} <= {
            c.id for c in CASES
        }


# -- a sparse 5 GB model.safetensors: refused from its header, never read whole ------------------------------------
# Not through check_in_process: its snapshot hashes every file whole (5 GB in memory). ``tree_stat`` stands in.
def _sparse_weights(header: bytes, config: str = CHAR_CONFIG) -> Callable[[Path], None]:
    """A checkpoint directory (the char model's by default) whose model.safetensors is 5 GB on paper (a hole:
    nothing big is written)."""

    def setup(tmp: Path) -> None:
        _write("ckpt/config.json", config)(tmp)
        with (tmp / "ckpt" / "model.safetensors").open("wb") as f:
            f.write(header)
            f.truncate(FIVE_GB)

    return setup


SPARSE: list[Case] = [
    Case(
        "hf-weights-sparse-absurd-header-length",
        HF,
        ("--hf-checkpoint", "{tmp}/ckpt/model.safetensors", "header length", "absurd"),
        (_sparse_weights(struct.pack("<Q", 2**60) + b"{}"),),
    ),
    Case(
        "hf-weights-sparse-garbage-header",
        HF,
        ("--hf-checkpoint", "{tmp}/ckpt/model.safetensors", "header is not valid JSON"),
        (_sparse_weights(struct.pack("<Q", 64) + b"\x00garbage" * 8),),
    ),
    Case(  # a Hugging Face model_type: the header is checked before the model is built (transformers)
        "hf-weights-sparse-llama-garbage-header",
        HF,
        ("--hf-checkpoint", "{tmp}/ckpt/model.safetensors", "header is not valid JSON"),
        (_sparse_weights(struct.pack("<Q", 64) + b"\x00garbage" * 8, '{"model_type": "llama"}'),),
    ),
    Case(
        "hf-weights-sparse-deep-header",
        HF,
        ("--hf-checkpoint", "{tmp}/ckpt/model.safetensors", "nested deeper"),
        (_sparse_weights(struct.pack("<Q", len(DEEP)) + DEEP.encode()),),
    ),
    Case(  # a well-formed header whose tensors end far before the file does: not a safetensors file either
        "hf-weights-sparse-header-short-of-file",
        HF,
        ("--hf-checkpoint", "{tmp}/ckpt/model.safetensors", "tensors hold 4 bytes"),
        (
            _sparse_weights(
                (lambda h: struct.pack("<Q", len(h)) + h)(
                    json.dumps({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
                )
            ),
        ),
    ),
]
BOUND = 64 * 2**20  # no single read of a file larger than this may ask for all of it


def tree_stat(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every path under ``root`` with its mode, size and mtime (a 5 GB file is not hashed)."""
    return {
        str(p.relative_to(root)): (p.lstat().st_mode, p.lstat().st_size, p.lstat().st_mtime_ns) for p in root.rglob("*")
    }


@pytest.fixture
def bounded_reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Fails any whole-file read of a file larger than :data:`BOUND` (``Path.read_bytes``, ``read()`` without a
    size), and records the size of every bounded one: a sparse file reads as zeros, so reading it whole would
    take 5 GB of memory before its header is looked at."""
    asked: list[int] = []
    whole = Path.read_bytes

    def read_bytes(self: Path) -> bytes:
        if self.is_file() and self.stat().st_size > BOUND:
            raise AssertionError(f"{self} ({self.stat().st_size:,} bytes) read whole")
        return whole(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)

    real_open = open

    class Counted:
        def __init__(self, f: Any) -> None:
            self._f = f

        def read(self, n: int = -1) -> bytes:
            if n is None or n < 0 or n > BOUND:
                size = os.fstat(self._f.fileno()).st_size
                if size > BOUND:
                    raise AssertionError(f"read({n}) of a {size:,}-byte file")
            data: bytes = self._f.read(n)
            asked.append(len(data))
            return data

        def __getattr__(self, name: str) -> Any:
            return getattr(self._f, name)

        def __enter__(self) -> Counted:
            return self

        def __exit__(self, *exc: object) -> None:
            self._f.close()

    def counted_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        f = real_open(file, mode, *args, **kwargs)
        return Counted(f) if "b" in mode else f

    import engines.models.weights

    monkeypatch.setattr(engines.models.weights, "open", counted_open, raising=False)
    yield asked


def _check_sparse(case: Case, tmp: Path, capsys: pytest.CaptureFixture[str]) -> str:
    argv, names = case.materialise(tmp)
    weights = tmp / "ckpt" / "model.safetensors"
    assert weights.stat().st_size == FIVE_GB and weights.stat().st_blocks * 512 < BOUND, "not a sparse file"
    before = tree_stat(tmp)
    capsys.readouterr()
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 2, f"{case.id}: exit {code}, stderr {err!r}"
    assert not _paragraph_problems(err, names), f"{case.id}: {_paragraph_problems(err, names)}: {err!r}"
    assert tree_stat(tmp) == before, f"{case.id}: wrote something"
    return err


@pytest.mark.parametrize("case", SPARSE, ids=[c.id for c in SPARSE])
def test_sparse_weights_refused_from_the_header(
    case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str], bounded_reads: list[int]
) -> None:
    _check_sparse(case, tmp_path, capsys)
    assert bounded_reads and sum(bounded_reads) < BOUND, f"read {sum(bounded_reads):,} bytes of a 5 GB file"


def test_a_good_checkpoint_still_loads_through_the_header_check(tmp_path: Path, bounded_reads: list[int]) -> None:
    from engines.models import TinyCausalLM
    from engines.models.weights import read_safetensors_header

    directory = TinyCausalLM("tiny", seed=0).save_pretrained(tmp_path / "ok")
    header = read_safetensors_header(directory / "model.safetensors")
    assert "tok_emb.weight" in header and header["tok_emb.weight"]["dtype"] == "F32"
    model = TinyCausalLM("tiny", seed=1)
    assert model.load_pretrained(directory).sha256  # the whole (small) file, through the same reader


# -- the corpus can fail: put each old reader back and watch a case fail -------------------------------------------
def _case(case_id: str) -> Case:
    return next(c for c in [*CASES, *SPARSE] if c.id == case_id)


def _old_loads(data: str | bytes, **_: Any) -> Any:
    """What every reader did before: ``json.loads``, with only ``JSONDecodeError`` caught by its caller."""
    return json.loads(data)


@pytest.mark.parametrize(
    "case_id",
    [
        "trace-show-deep-line",
        "trace-timeline-huge-number",
        "replay-deep-json",
        "hf-config-deep",
        "hf-config-duplicate-keys",
        "graph-compare-deep",
    ],
)
def test_catches_a_reader_that_is_plain_json_loads(
    case_id: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(jsonio, "loads", _old_loads)
    with pytest.raises((AssertionError, RecursionError, ValueError)):
        check_in_process(_case(case_id), tmp_path, capsys)


def test_catches_an_event_log_read_whole(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The old ``events.read_jsonl`` read the file whole: on ``/dev/zero`` it never ends. A guard in its place
    of ``Path.read_bytes`` (refusing a device) turns that into an AssertionError instead of a hang."""
    import lifecycle.decide.events as events

    whole = Path.read_bytes

    def guarded(self: Path) -> bytes:
        if stat.S_ISCHR(self.stat().st_mode):
            raise AssertionError(f"{self}: a device read whole")
        return whole(self)

    def old_read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
        return [json.loads(raw) for raw in Path(path).read_bytes().split(b"\n") if raw.strip()]

    monkeypatch.setattr(Path, "read_bytes", guarded)
    monkeypatch.setattr(events, "read_jsonl", old_read_jsonl)
    import lifecycle.observe.timeline
    import lifecycle.observe.trace

    monkeypatch.setattr(lifecycle.observe.trace, "read_jsonl", old_read_jsonl)
    monkeypatch.setattr(lifecycle.observe.timeline, "read_jsonl", old_read_jsonl)
    for sub in ("show", "timeline"):
        with pytest.raises(AssertionError, match="a device read whole"):
            check_in_process(_case(f"trace-{sub}-dev-zero"), tmp_path, capsys)


def test_catches_weights_read_whole_before_the_header(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str], bounded_reads: list[int]
) -> None:

    import engines.models.weights

    monkeypatch.setattr(engines.models.weights, "read_safetensors_header", lambda path: {})  # the header check gone
    with pytest.raises(AssertionError, match="read whole"):
        _check_sparse(_case("hf-weights-sparse-garbage-header"), tmp_path, capsys)


@pytest.mark.parametrize("case_id", ["replay-nan-reward", "replay-string-ids", "replay-empty-output-ids"])
def test_catches_the_old_replay_field_check(
    case_id: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The old check looked at each field's JSON type only: a NaN or 7.0 reward, ``[]`` or ``["3"]`` passed,
    and the run went on to start Ray and the trainer."""
    import rollout.replay

    kinds: dict[str, Any] = {
        **dict.fromkeys(("index", "group"), int),
        **dict.fromkeys(("prompt", "response"), str),
        **dict.fromkeys(("prompt_ids", "output_ids"), list),
        "reward": (int, float),
    }

    def old_check(path: Path, rollout_id: int, samples: list[dict[str, Any]]) -> None:  # the JSON types only
        for index, sample in enumerate(samples):
            for name, kind in kinds.items():
                value = sample.get(name)
                if value is None or isinstance(value, bool) or not isinstance(value, kind):
                    problem = f"sample {index} has no usable {name!r} (got {value!r})"
                    raise rollout.replay.ReplayDataError(path, rollout_id, problem, "re-create it")

    monkeypatch.setattr(rollout.replay, "_check_trainable", old_check)
    monkeypatch.setattr(
        "trainer.app.cli._check_run_dir", lambda path: (_ for _ in ()).throw(RuntimeError("got past replay"))
    )
    with pytest.raises(RuntimeError, match="got past replay"):
        check_in_process(_case(case_id), tmp_path, capsys)
