"""The bad-input corpus, config and flags (issue 27, causes 2, 3, 4 and 9): numbers that parse but overflow, a
YAML alias bomb, duplicate keys, settings outside the ``[lifecycle]`` table, blank values read as "not given",
the wrong flag blamed and argparse's usage block. Every case runs through ``lifecycle.cli.main`` with the
harness of ``badinput.py`` (exit 2, one paragraph naming the input and the fix, nothing written); the
``test_catches_*`` tests at the end re-introduce each cause and watch the corpus fail.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from badinput import Case, _write, check_in_process, in_process_test, subprocess_test

import lifecycle.cli as cli
import lifecycle.cli.trace as trace_cli
import lifecycle.decide.config
import lifecycle.decide.errors
import trainer.app.checks
import trainer.app.cli
import trainer.app.faults
import trainer.app.options
from lifecycle.decide.config import MAX_COUNT, LifecycleConfig, load_config_file
from lifecycle.decide.errors import ConfigError

pytestmark = pytest.mark.bad_input


def _bomb(levels: int) -> str:
    """'Billion laughs' as a setting's value: each level a list of nine aliases of the one before, 9**levels items."""
    names = "abcdefghijklmnop"
    parts = ["&a [" + ",".join("x" * 9) + "]"]
    parts += [f"&{names[i]} [" + ",".join([f"*{names[i - 1]}"] * 9) + "]" for i in range(1, levels)]
    return "rollout_num_gpus: [" + ", ".join(parts) + "]\n"


BOMB = _bomb(6)  # ~200 bytes, 9**6 = 531,441 strings: a 3.5 MB "paragraph" when the error echoed repr(value)
BIG_BOMB = _bomb(12)  # 9**12: neither its expansion nor its repr fits anywhere
C = "{tmp}/c"
BIG_INT = "9" * 23
DIGITS_5000 = "9" * 5000

CASES: list[Case] = [
    # --- config files: bounded, strict (cause 3, 4) ------------------------------------------------------------
    Case(
        "yaml-alias-bomb",
        ("explain", "--config", C + ".yaml"),
        (C + ".yaml", "YAML alias *a "),
        (_write("c.yaml", BOMB),),
    ),
    Case(
        "yaml-alias-bomb-big",
        ("run", "--config", C + ".yml"),
        (C + ".yml", "YAML alias *a "),
        (_write("c.yml", BIG_BOMB),),
    ),
    Case(
        "yaml-alias-in-table",
        ("check", "--config", C + ".yaml"),
        ("YAML alias *n ",),
        (_write("c.yaml", "x: &n 2\nlifecycle: {rollout_num_gpus: *n}\n"),),
    ),
    Case(
        "yaml-duplicate-key",
        ("explain", "--config", C + ".yaml"),
        (C + ".yaml", "'rollout_num_gpus'", "twice"),
        (_write("c.yaml", "rollout_num_gpus: 2\nrollout_num_gpus: 4\n"),),
        proc=True,
    ),
    Case(
        "yaml-duplicate-in-table",
        ("graph", "--config", C + ".yaml"),
        (C + ".yaml", "'colocate'", "line 4"),
        (_write("c.yaml", "lifecycle:\n  rollout_num_gpus: 2\n  colocate: true\n  colocate: false\n"),),
    ),
    Case(
        "json-duplicate-key",
        ("explain", "--config", C + ".json"),
        (C + ".json", "duplicate key 'rollout_num_gpus'"),
        (_write("c.json", '{"rollout_num_gpus": 2, "rollout_num_gpus": 4}'),),
        proc=True,
    ),
    Case(
        "json-duplicate-in-table",
        ("check", "--config", C + ".json"),
        (C + ".json", "duplicate key 'save'"),
        (_write("c.json", '{"lifecycle": {"save": "a", "save": "b"}}'),),
    ),
    Case(
        "json-nan",
        ("explain", "--config", C + ".json"),
        (C + ".json", "NaN"),
        (_write("c.json", '{"rollout_health_check_interval": NaN}'),),
    ),
    Case(
        "json-deep",
        ("explain", "--config", C + ".json"),
        (C + ".json", "nested deeper"),
        (_write("c.json", "[" * 100_000 + "]" * 100_000),),
    ),
    Case(
        "toml-key-above-table",
        ("explain", "--config", C + ".toml"),
        (C + ".toml", "'rolout_num_gpus'", "[lifecycle]", "did you mean rollout_num_gpus"),
        (_write("c.toml", "rolout_num_gpus = 4\n[lifecycle]\nrollout_num_gpus = 2\n"),),
        proc=True,
    ),
    Case(
        "toml-setting-above-table",
        ("run", "--config", C + ".toml"),
        (C + ".toml", "'colocate'", "outside the [lifecycle] table"),
        (_write("c.toml", "colocate = true\n[lifecycle]\nrollout_num_gpus = 2\n"),),
    ),
    Case(
        "toml-table-typo",
        ("explain", "--config", C + ".toml"),
        (C + ".toml", "[lifecycl]", "did you mean [lifecycle]"),
        (_write("c.toml", "[model]\nname = 'x'\n[lifecycl]\nrollout_num_gpus = 2\n"),),
    ),
    Case(
        "yaml-key-beside-table",
        ("explain", "--config", C + ".yaml"),
        (C + ".yaml", "'eval_interval'"),
        (_write("c.yaml", "eval_interval: 3\nlifecycle:\n  rollout_num_gpus: 2\n"),),
    ),
    Case(
        "config-too-large",
        ("explain", "--config", C + ".toml"),
        (C + ".toml", "larger than"),
        (_write("c.toml", "# padding\n" * 120_000),),
    ),
    Case("config-a-device", ("explain", "--config", "/dev/zero"), ("--config", "/dev/zero", "not a regular file")),
    Case("config-empty-path", ("explain", "--config", ""), ("--config", "empty")),
    Case(
        "toml-deep",
        ("explain", "--config", C + ".toml"),
        (C + ".toml", "nested too deeply"),
        (_write("c.toml", "a = " + "[" * 5000 + "]" * 5000 + "\n"),),
    ),
    Case(
        "config-huge-value",
        ("explain", "--config", C + ".json"),
        (C + ".json", "--rollout-num-gpus"),
        (_write("c.json", json.dumps({"rollout_num_gpus": [1] * 200_000})),),
    ),
    Case(
        "toml-int-overflow",
        ("explain", "--config", C + ".toml"),
        (C + ".toml", "--rollout-num-gpus", "too large"),
        (_write("c.toml", "rollout_num_gpus = 9223372036854775807\n"),),
    ),
    # --- numbers that parse but overflow, bounded at parse time (cause 2) ---------------------------------------
    Case("run-seed-past-64-bits", ("run", "--seed", BIG_INT), ("--seed", "64-bit", "Fix: give a value in 0..")),
    Case("run-seed-past-torch", ("run", "--seed", str(2**48)), ("--seed", "281474976710655")),
    Case("run-seed-negative", ("run", "--seed=-1"), ("--seed", "0..")),
    Case("run-seed-5000-digits", ("run", "--seed", DIGITS_5000), ("--seed", "too long")),
    Case(
        "run-ray-address-port-23-digits",
        ("run", "--ray-address", "host:" + BIG_INT),
        ("--ray-address", "port", "1..65535"),
        proc=True,
    ),
    Case("run-ray-address-port-zero", ("run", "--ray-address", "127.0.0.1:0"), ("--ray-address", "1..65535")),
    Case(
        "run-ray-address-no-port", ("run", "--ray-address", "localhost"), ("--ray-address", "'localhost'", "HOST:PORT")
    ),
    Case(
        "run-inject-step-5000-digits",
        ("run", "--inject", "kill-engine:0@" + DIGITS_5000),
        ("--inject", "STEP", "too long"),
        proc=True,
    ),
    Case(
        "run-inject-index-overflow",
        ("run", "--inject", f"kill-engine:{BIG_INT}@1"),
        ("--inject", "INDEX", f"0..{MAX_COUNT}"),
    ),
    Case("run-inject-unicode-digits", ("run", "--inject", "kill-engine:\u0661@1"), ("--inject", "FAULT:INDEX@STEP")),
    Case("run-steps-overflow", ("run", "--steps", BIG_INT), ("--steps", f"1..{MAX_COUNT}")),
    Case("run-engines-overflow", ("run", "--engines", BIG_INT), ("--engines",)),
    Case("run-trainer-workers-past-ranks", ("run", "--trainer-workers", "70000"), ("--trainer-workers", "65536")),
    Case("run-ray-nodes-too-many", ("run", "--ray-nodes", "100000"), ("--ray-nodes", "1..64")),
    Case("run-keep-checkpoints-overflow", ("run", "--keep-checkpoints", BIG_INT), ("--keep-checkpoints",)),
    Case("run-metrics-port-overflow", ("run", "--metrics-port", BIG_INT), ("--metrics-port", "0..65535")),
    Case(
        "run-request-timeout-overflow",
        ("run", "--engine-request-timeout", "1e12"),
        ("--engine-request-timeout", "2592000"),
    ),
    Case("run-startup-timeout-nan", ("run", "--engine-startup-timeout", "nan"), ("--engine-startup-timeout", "finite")),
    Case("explain-gpus-overflow", ("explain", "--rollout-num-gpus", BIG_INT), ("--rollout-num-gpus", "too large")),
    Case(
        "explain-gpus-5000-digits", ("explain", "--rollout-num-gpus", DIGITS_5000), ("--rollout-num-gpus", "too long")
    ),
    Case(
        "explain-window-overflow",
        ("explain", "--engine-restart-window", "1e300"),
        ("--engine-restart-window", "seconds"),
    ),
    Case(
        "explain-buffer-overflow", ("explain", "--update-weight-buffer-size", BIG_INT), ("--update-weight-buffer-size",)
    ),
    Case("check-jobs-overflow", ("check", "--jobs", "99999999999999"), ("--jobs", "1..256")),
    Case("check-faults-overflow", ("check", "--faults", BIG_INT), ("--faults",)),
    Case("check-engines-23-digits", ("check", "--engines", BIG_INT), ("--engines", "1..4")),
    # --- garbage that was accepted: blank values (cause 4) --------------------------------------------------------
    Case("run-ray-address-empty", ("run", "--ray-address", ""), ("--ray-address", "empty"), proc=True),
    Case("run-ray-address-blank", ("run", "--ray-address", "  "), ("--ray-address", "empty")),
    Case("run-run-dir-empty", ("run", "--run-dir", ""), ("--run-dir", "empty")),
    Case("run-rollout-function-empty", ("run", "--rollout-function", ""), ("--rollout-function", "empty")),
    Case("run-data-source-empty", ("run", "--data-source", ""), ("--data-source", "empty")),
    Case("run-hf-checkpoint-empty", ("run", "--hf-checkpoint", ""), ("--hf-checkpoint", "empty")),
    Case("run-resume-empty", ("run", "--resume", ""), ("--resume", "empty")),
    Case("run-metrics-host-empty", ("run", "--metrics-port", "0", "--metrics-host", ""), ("--metrics-host", "empty")),
    Case("run-metrics-host-without-port", ("run", "--metrics-host", "0.0.0.0"), ("--metrics-host", "--metrics-port")),
    Case("graph-output-empty", ("graph", "-o", ""), ("--output", "empty")),
    Case("graph-write-empty", ("graph", "--write", ""), ("--write", "empty")),
    Case("graph-check-empty", ("graph", "--check", " "), ("--check", "empty")),
    Case("graph-compare-empty", ("graph", "--format", "html", "--compare", ""), ("--compare", "empty")),
    Case("trace-show-empty", ("trace", "show", ""), ("FILE", "empty")),
    Case("trace-check-config-empty", ("trace", "check", "{tmp}/e.jsonl", "--config", ""), ("--config", "empty")),
    Case("run-launcher-5000-chars", ("run", "--launcher", "x" * 5000), ("--launcher", "'ray', 'local'")),
    # --- weak messages: the right flag, no usage block (cause 9) ----------------------------------------------------
    Case(
        "run-metrics-host-not-local",
        ("run", "--metrics-port", "0", "--metrics-host", "192.0.2.1"),
        ("--metrics-host", "192.0.2.1"),
    ),
    Case("no-command", (), ("no command", "explain", "run"), proc=True),
    Case("trace-no-subcommand", ("trace",), ("lifecycle trace", "show", "timeline"), proc=True),
    Case("unknown-command", ("nosuch",), ("'nosuch'", "explain")),
    Case("graph-check-and-write", ("graph", "--check", "a", "--write", "b"), ("--check", "--write")),
    Case("trace-diff-one-side", ("trace", "diff", "{tmp}/a.jsonl"), ("B",)),
]


test_bad_input_in_process = in_process_test(CASES)
test_bad_input_subprocess = subprocess_test(CASES)


SHORT = [
    "yaml-alias-bomb",
    "config-huge-value",
    "explain-gpus-5000-digits",
    "run-inject-step-5000-digits",
    "run-launcher-5000-chars",
]


@pytest.mark.parametrize("case_id", SHORT)
def test_an_error_echoes_a_bounded_value(case_id: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The paragraph stays short however big the input: ConfigError echoes a bounded repr of the value."""
    argv, _ = _case(case_id).materialise(tmp_path)
    capsys.readouterr()
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert len(err) < 1000, f"{case_id}: a {len(err):,}-character paragraph"


def test_the_bounds_are_what_torch_takes() -> None:
    """--seed's bound is exactly what the trainer's torch.manual_seed(seed * 65536 + rank) accepts."""
    torch = pytest.importorskip("torch")
    from trainer.app.options import BOUNDS
    from trainer.backend import worker_seed

    top = worker_seed(int(BOUNDS["seed"].hi), int(BOUNDS["workers"].hi) - 1)
    torch.Generator().manual_seed(int(top))  # the largest seed, with the largest rank
    with pytest.raises((RuntimeError, ValueError, OverflowError)):
        torch.Generator().manual_seed(int(top) + 1)


def test_good_input_still_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Not simply 'everything fails': anchors of other tools' tables, a [lifecycle] table beside them, big but
    valid numbers and an explicit host are accepted."""
    (tmp_path / "c.toml").write_text("[model]\nname = 'x'\n[lifecycle]\nrollout_num_gpus = 2\n")
    assert cli.main(["explain", "--config", str(tmp_path / "c.toml")]) == 0
    (tmp_path / "c.yaml").write_text("rollout_num_gpus: 2\nengine_restart_window: 86400\n")
    (tmp_path / "bom.toml").write_bytes(b"\xef\xbb\xbfrollout_num_gpus = 2\n")  # a byte-order mark is no setting
    assert cli.main(["explain", "--config", str(tmp_path / "bom.toml")]) == 0
    assert cli.main(["explain", "--config", str(tmp_path / "c.yaml")]) == 0
    assert cli.main(["explain", "--rollout-num-gpus", str(MAX_COUNT - 1), "--update-weight-buffer-size", "4e9"]) == 0
    assert "Traceback" not in capsys.readouterr().err
    ns = cli.build_parser().parse_args(["run", "--seed", str(2**48 - 1), "--ray-address", "ray://h:10001"])
    assert ns.seed == 2**48 - 1 and ns.ray_address == "ray://h:10001"
    assert (
        cli.build_parser().parse_args(["run", "--ray-address", "auto", "--inject", "kill-engine:1@3"]).inject[0].step
        == 3
    )


def test_load_config_file_refuses_in_the_library_too(tmp_path: Path) -> None:
    (tmp_path / "d.yaml").write_text("save: a\nsave: b\n")
    with pytest.raises(ConfigError, match="given twice"):
        load_config_file(tmp_path / "d.yaml")
    with pytest.raises(ConfigError, match="too large"):
        LifecycleConfig.from_mapping({"rollout_num_gpus": 10**5000})


# -- the corpus can fail: re-introduce each cause and watch it catch it -----------------------------------------------
def _case(case_id: str) -> Case:
    return next(c for c in CASES if c.id == case_id)


def _stop_after_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a check let through must not go on to start Ray: stop right after the command line is parsed."""
    monkeypatch.setattr(
        trainer.app.cli, "config_from_args", lambda ns: (_ for _ in ()).throw(RuntimeError("past parse"))
    )


def test_catches_an_unbounded_echo(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(lifecycle.decide.errors, "bounded_repr", repr)  # ConfigError echoes repr(value), as before
    with pytest.raises(AssertionError, match="-character paragraph"):
        test_an_error_echoes_a_bounded_value("config-huge-value", tmp_path, capsys)


def test_catches_an_unbounded_usage_message(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(lifecycle.decide.errors, "ECHO_CHARS", 10**9)  # argparse's message kept whole, as before
    with pytest.raises(AssertionError, match="-character paragraph"):
        test_an_error_echoes_a_bounded_value("run-launcher-5000-chars", tmp_path, capsys)


def _safe_load(text: str, path: str) -> Any:
    import yaml

    return yaml.safe_load(text)


def test_catches_yaml_aliases(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(lifecycle.decide.config, "_yaml_load", _safe_load)
    with pytest.raises(AssertionError, match="YAML alias"):
        check_in_process(_case("yaml-alias-bomb"), tmp_path, capsys)


def test_catches_yaml_aliases_and_an_unbounded_echo_together(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both causes back: the 225-byte file makes a paragraph of megabytes."""
    monkeypatch.setattr(lifecycle.decide.config, "_yaml_load", _safe_load)
    monkeypatch.setattr(lifecycle.decide.errors, "bounded_repr", repr)
    with pytest.raises(AssertionError, match="-character paragraph"):
        test_an_error_echoes_a_bounded_value("yaml-alias-bomb", tmp_path, capsys)


def test_a_big_bomb_is_never_expanded(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The alias is refused while the file is composed: no Python value of it is ever constructed."""
    import yaml

    class Built(BaseException):  # not an Exception: the loader's own handler must not wrap it
        pass

    def built(self: Any, node: Any) -> Any:
        raise Built("the loader constructed the document")

    monkeypatch.setattr(yaml.constructor.BaseConstructor, "construct_document", built)
    path = tmp_path / "c.yaml"
    path.write_text(BIG_BOMB)
    with pytest.raises(ConfigError, match=r"alias \*a"):
        load_config_file(path)
    monkeypatch.setattr(lifecycle.decide.config, "_yaml_load", _safe_load)  # the old loader builds it
    with pytest.raises(Built):
        load_config_file(path)


def test_catches_yaml_duplicate_keys(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(lifecycle.decide.config, "_yaml_load", _safe_load)
    with pytest.raises(AssertionError, match="exit 0"):
        check_in_process(_case("yaml-duplicate-key"), tmp_path, capsys)


def test_catches_json_duplicate_keys(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import lifecycle.decide.jsonio

    monkeypatch.setattr(lifecycle.decide.jsonio, "loads", lambda text, source: json.loads(text))  # the old json.loads
    with pytest.raises(AssertionError, match="exit 0"):
        check_in_process(_case("json-duplicate-key"), tmp_path, capsys)


def test_catches_keys_outside_the_table(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def old(data: dict[str, Any], path: str) -> dict[str, Any]:
        return data["lifecycle"] if isinstance(data.get("lifecycle"), dict) else data

    monkeypatch.setattr(lifecycle.decide.config, "_settings_table", old)
    with pytest.raises(AssertionError, match="exit 0"):
        check_in_process(_case("toml-key-above-table"), tmp_path, capsys)


def test_catches_an_unbounded_seed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:

    monkeypatch.setitem(trainer.app.options.BOUNDS, "seed", int)  # `type=int`, as before
    _stop_after_parsing(monkeypatch)
    with pytest.raises(RuntimeError, match="past parse"):
        check_in_process(_case("run-seed-past-64-bits"), tmp_path, capsys)


def test_catches_an_unbounded_setting(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(lifecycle.decide.config, "MAX_COUNT", 10**100)
    with pytest.raises(AssertionError, match="exit 0"):
        check_in_process(_case("explain-gpus-overflow"), tmp_path, capsys)


def test_catches_an_unbounded_fault_step(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(trainer.app.faults, "parse_number", lambda text, kind, lo, hi: kind(text))  # plain int()
    with pytest.raises(AssertionError, match="does not name"):
        check_in_process(_case("run-inject-step-5000-digits"), tmp_path, capsys)


def test_catches_an_unchecked_ray_address(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(trainer.app.options, "parse_ray_address", lambda text: text)
    _stop_after_parsing(monkeypatch)
    with pytest.raises(RuntimeError, match="past parse"):
        check_in_process(_case("run-ray-address-empty"), tmp_path, capsys)


def test_catches_a_blank_value_read_as_not_given(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(trainer.app.options, "nonblank", str)
    _stop_after_parsing(monkeypatch)
    with pytest.raises(RuntimeError, match="past parse"):
        check_in_process(_case("run-rollout-function-empty"), tmp_path, capsys)


def _old_check_metrics(port: int | None, host: str) -> None:
    """_check_metrics before issue 27: every bind failure blamed on --metrics-port."""
    import socket

    if port is None:
        return
    try:
        with socket.create_server((host, port)):
            pass
    except OSError as exc:
        raise ConfigError(
            "--metrics-port", port, f"cannot listen on {host}:{port} ({exc})", "pick a free port"
        ) from None


def test_catches_the_wrong_flag_blamed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(trainer.app.checks, "check_metrics", _old_check_metrics)
    with pytest.raises(AssertionError, match="does not name '--metrics-host'"):
        check_in_process(_case("run-metrics-host-not-local"), tmp_path, capsys)


def test_catches_the_help_page_for_no_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli, "_no_command", lambda parser: (parser.print_help(), 2)[1])  # as before
    with pytest.raises(AssertionError, match="nothing on stderr"):
        check_in_process(_case("no-command"), tmp_path, capsys)
    monkeypatch.setattr(trace_cli, "_no_subcommand", lambda p: (p.print_help(), 2)[1])
    with pytest.raises(AssertionError, match="nothing on stderr"):
        check_in_process(_case("trace-no-subcommand"), tmp_path, capsys)
