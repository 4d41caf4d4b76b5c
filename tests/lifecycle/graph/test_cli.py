"""``lifecycle graph`` on the command line, and the golden graphs in docs/graphs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from lifecycle.cli import main
from lifecycle.decide.machines import MACHINES
from lifecycle.decide.presets import PRESETS
from lifecycle.graph import SCHEMA, golden_files

NOT_EXTERNAL = "!external_engines (external_engines=false)"  # the second guard of recover

GOLDEN = Path(__file__).resolve().parents[3] / "docs" / "graphs"


def run(capsys, *argv):
    code = main(["graph", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_default_is_mermaid_markdown_of_every_machine(capsys):
    code, out, _ = run(capsys)
    assert code == 0
    for name in MACHINES:
        assert f"## {name}\n\n```mermaid\nstateDiagram-v2\n" in out


def test_config_flags_decide_the_guard_values(capsys):
    code, out, _ = run(capsys, "--machine", "engine", "--use-fault-tolerance", "--ft-components", "train")
    assert code == 0
    assert out.startswith("stateDiagram-v2\n")
    assert "✗ recover [rollout_ft=false, " + NOT_EXTERNAL + "]" in out
    code, out, _ = run(capsys, "--machine", "engine", "--use-fault-tolerance")
    assert "Unhealthy --> Recovering : recover [rollout_ft=true, " + NOT_EXTERNAL + "]" in out


def test_replay_flag_does_not_need_the_file_to_exist(capsys):
    code, out, _ = run(
        capsys, "--machine", "rollout", "--format", "json", "--load-debug-rollout-data", "/nope/{rollout_id}.json"
    )
    assert code == 0
    doc = json.loads(out)
    assert doc["config"]["predicates"]["replay"] is True
    assert doc["config"]["preset"] is None


def test_json_to_file_with_preset(capsys, tmp_path):
    target = tmp_path / "g.json"
    code, out, _ = run(capsys, "--format", "json", "--preset", "replay", "--prune", "-o", str(target))
    assert code == 0 and out == ""
    doc = json.loads(target.read_text())
    assert doc["schema"] == SCHEMA and doc["pruned"] is True and doc["config"]["preset"] == "replay"
    assert [s["name"] for s in doc["machines"]["rollout"]["states"]] == ["Init", "Replay", "Disposed"]


def test_preset_and_config_flags_exclude_each_other(capsys):
    code, _, err = run(capsys, "--preset", "ft-train", "--use-fault-tolerance")
    assert code == 2
    assert "--preset" in err and "--use-fault-tolerance" in err


def test_compare_needs_html(capsys, tmp_path):
    code, _, err = run(capsys, "--format", "json", "--compare", str(tmp_path / "x.json"))
    assert code == 2 and "--compare only applies to --format html" in err


@pytest.mark.determinism
def test_committed_golden_graphs_match_the_specs(capsys):
    """CI catches a spec change whose graphs were not regenerated (`lifecycle graph --write docs/graphs`)."""
    code, out, _ = run(capsys, "--check", str(GOLDEN))
    assert code == 0, out


@pytest.mark.determinism
def test_golden_has_a_mermaid_section_per_machine_and_preset():
    for name in MACHINES:
        text = (GOLDEN / f"{name}.md").read_text(encoding="utf-8")
        for p in PRESETS:
            assert f"\n## {p}\n" in text
        assert text.count("```mermaid\nstateDiagram-v2\n") == len(PRESETS)


def test_check_fails_with_a_readable_diff_after_an_edit(capsys, tmp_path):
    copy = tmp_path / "graphs"
    shutil.copytree(GOLDEN, copy)
    engine = copy / "engine.md"
    text = engine.read_text(encoding="utf-8")
    edited = text.replace(
        "recover [rollout_ft=true, " + NOT_EXTERNAL + "]", "recover [rollout_ft=maybe, " + NOT_EXTERNAL + "]", 1
    )
    assert edited != text
    engine.write_text(edited, encoding="utf-8")
    (copy / "monitor.md").unlink()

    code, out, _ = run(capsys, "--check", str(copy))
    assert code == 1
    assert f"--- {engine} (committed)" in out and f"+++ {engine} (generated from the specs)" in out
    assert "-    Unhealthy --> Recovering : recover [rollout_ft=maybe, " + NOT_EXTERNAL + "]" in out
    assert "+    Unhealthy --> Recovering : recover [rollout_ft=true, " + NOT_EXTERNAL + "]" in out
    assert "monitor.md (committed) (missing)" in out
    assert f"lifecycle graph --write {copy}" in out

    code, out, _ = run(capsys, "--write", str(copy))
    assert code == 0 and "2 file(s) rewritten" in out
    assert run(capsys, "--check", str(copy))[0] == 0
    assert engine.read_text(encoding="utf-8") == golden_files()["engine.md"]


@pytest.mark.parametrize("fmt", ["svg", "png"])
def test_images_to_file(capsys, tmp_path, fmt):
    if shutil.which("dot") is None:
        pytest.skip("graphviz `dot` not installed (apt-get install graphviz)")
    target = tmp_path / f"g.{fmt}"
    machine = "monitor" if fmt == "png" else "all"  # PNG is slow to rasterise: one small machine
    code, _, _ = run(capsys, "--format", fmt, "--machine", machine, "--preset", "ft-both", "-o", str(target))
    assert code == 0
    data = target.read_bytes()
    assert data.startswith(b"\x89PNG") if fmt == "png" else b'id="lifecycle"' in data
