"""Mermaid, DOT, SVG/PNG and transitions-markup renderings of the graph model."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from transitions.core import MachineError
from transitions.extensions.markup import MarkupMachine

from lifecycle.cli import main
from lifecycle.decide.errors import LifecycleError
from lifecycle.decide.presets import preset
from lifecycle.graph import graph_document, markup_machine, render, require_dot, to_dot, to_markup, to_mermaid

NOT_EXTERNAL = "!external_engines (external_engines=false)"  # the second guard of recover

needs_dot = pytest.mark.skipif(
    shutil.which("dot") is None, reason="graphviz `dot` not installed (apt-get install graphviz)"
)


def _engine(p, **kw):
    return graph_document(preset(p), ["engine"], preset_name=p, **kw)


def test_mermaid_labels_carry_guard_values_and_mark_inactive_edges():
    on = to_mermaid(_engine("ft-rollout")["machines"]["engine"])
    off = to_mermaid(_engine("ft-train")["machines"]["engine"])
    assert on.startswith("stateDiagram-v2\n")
    assert (
        "Unhealthy --> Recovering : recover [rollout_ft=true, " + NOT_EXTERNAL + "] / recover_engine, kill_engine\n"
        in on
    )
    assert (
        "Unhealthy --> Recovering : ✗ recover [rollout_ft=false, " + NOT_EXTERNAL + "] / recover_engine, kill_engine\n"
        in off
    )
    assert "Unhealthy --> Failed : ✗ fail [!rollout_ft (rollout_ft=true)] / report_failure\n" in on
    assert "Unhealthy --> Failed : fail [!rollout_ft (rollout_ft=false)] / report_failure\n" in off


def test_mermaid_marks_terminal_marked_and_unreachable_states():
    text = to_mermaid(_engine("ft-train")["machines"]["engine"])
    assert "    [*] --> Init\n" in text
    assert "    Failed --> [*]\n" in text and "    Disposed --> [*]\n" in text
    assert "    class Failed markedTerminal\n" in text
    assert "    class Recovering unreachableMarked\n" in text  # marked, and unreachable without rollout FT
    assert "    classDef unreachableMarked " in text
    rollout = to_mermaid(graph_document(preset("replay"), ["rollout"])["machines"]["rollout"])
    assert "class Replay marked" in rollout


def test_mermaid_prune_drops_inactive_edges():
    text = to_mermaid(_engine("ft-train", prune=True)["machines"]["engine"])
    assert "✗" not in text
    assert "Recovering" not in text


def test_dot_styles_inactive_edges_and_states():
    dot = to_dot(_engine("ft-train"))
    recover = next(line for line in dot.splitlines() if '"Unhealthy" -> "Recovering"' in line)
    assert "style=dashed" in recover and f'label="recover [rollout_ft=false, {NOT_EXTERNAL}]' in recover
    failed = next(line for line in dot.splitlines() if line.strip().startswith('"Failed" ['))
    assert "peripheries=2" in failed and "filled" in failed
    active = next(line for line in to_dot(_engine("ft-rollout")).splitlines() if '"Unhealthy" -> "Recovering"' in line)
    assert "style=" not in active


def test_dot_of_all_machines_uses_one_cluster_each():
    dot = to_dot(graph_document(preset("no-ft")))
    for name in ("engine", "monitor", "rollout", "eval_fleet", "trainer"):
        assert f'subgraph "cluster_{name}"' in dot
    assert '"engine/Init" -> "engine/Starting"' in dot


@needs_dot
def test_svg_and_png_render_through_dot():
    dot = to_dot(_engine("ft-rollout"))
    svg = render(dot, "svg").decode()
    assert "<svg" in svg and 'id="engine/edge/Unhealthy:recover:Recovering"' in svg
    assert render(dot, "png").startswith(b"\x89PNG\r\n\x1a\n")


def test_missing_dot_is_a_clear_error_and_text_formats_still_work(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no `dot` anywhere
    with pytest.raises(LifecycleError, match=r"apt-get install graphviz.*brew install graphviz"):
        require_dot()
    # a real process with that PATH, as a user without graphviz would run it
    env = {**os.environ, "PATH": str(tmp_path)}
    cmd = [sys.executable, "-m", "lifecycle.cli", "graph", "--machine", "engine", "--preset", "ft-train"]
    svg = subprocess.run([*cmd, "--format", "svg"], capture_output=True, text=True, env=env, check=False)
    assert svg.returncode == 2
    assert "apt-get install graphviz" in svg.stderr and "brew install graphviz" in svg.stderr
    assert "Traceback" not in svg.stderr
    mermaid = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    assert mermaid.returncode == 0 and mermaid.stdout.startswith("stateDiagram-v2\n"), mermaid.stderr
    for fmt, head in (("dot", 'digraph "engine"'), ("json", "{")):
        assert main(["graph", "--machine", "engine", "--format", fmt]) == 0
        assert capsys.readouterr().out.startswith(head)
    for fmt in ("png", "html"):
        assert main(["graph", "--format", fmt, "-o", str(tmp_path / "x")]) == 2
        assert "apt-get install graphviz" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_markup_machine_evaluates_the_real_predicates_when_fired():
    """to_markup keeps every edge; guards become lifecycle.decide.predicates.* conditions called with the
    event's args."""
    engine = _engine("ft-rollout")["machines"]["engine"]
    m = markup_machine(engine)  # the public loader: MarkupMachine(**to_markup(engine))
    assert isinstance(m, MarkupMachine)
    assert m.state == "Init"
    for trigger in ("start", "ready"):
        m.trigger(trigger, preset("ft-train"))
    m.trigger("mark_unhealthy", preset("ft-train"))
    assert m.state == "Unhealthy"
    assert m.trigger("recover", preset("ft-train")) is False  # rollout_ft is false: blocked
    assert m.state == "Unhealthy"
    assert m.trigger("recover", preset("ft-rollout")) is True
    assert m.state == "Recovering"
    assert set(m.markup["states"][i]["name"] for i in range(len(engine["states"]))) == {
        s["name"] for s in engine["states"]
    }


def test_markup_config_only_is_self_contained():
    engine = _engine("ft-train")["machines"]["engine"]
    markup = to_markup(engine, config_only=True)
    assert all("conditions" not in t and "unless" not in t for t in markup["transitions"])
    m = markup_machine(engine, config_only=True)
    assert m.markup["transitions"] == MarkupMachine(**markup).markup["transitions"]
    m.start()
    m.start_failed()
    assert "recover" not in m.events  # no rollout FT: the recover edge is not in this machine at all
    with pytest.raises(MachineError):
        m.restart()  # restart exists (Recovering -> Starting) but not from Unhealthy
    m.fail()
    assert m.state == "Failed"
