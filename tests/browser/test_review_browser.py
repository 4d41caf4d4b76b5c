"""The review page and the mermaid output, checked in a real browser (issue 4, items 4 and 5)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lifecycle.cli import main
from lifecycle.decide.machines import MACHINES
from lifecycle.decide.presets import PRESETS, preset
from lifecycle.graph import graph_document, require_dot, to_mermaid

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[2]
MERMAID_JS = REPO / "node_modules" / "mermaid" / "dist" / "mermaid.min.js"
ARTIFACTS = REPO / "test-artifacts"
RECOVER = "Unhealthy:recover:Recovering"


@pytest.fixture(scope="module")
def review_html(tmp_path_factory) -> Path:
    """The page with --compare against an ft-rollout export edited to have one edge fewer, one more, one changed."""
    try:
        require_dot()
    except Exception as exc:
        pytest.skip(str(exc))
    tmp = tmp_path_factory.mktemp("review")
    ref = tmp / "ref.json"
    assert main(["graph", "--format", "json", "--preset", "ft-rollout", "-o", str(ref)]) == 0
    doc = json.loads(ref.read_text())
    engine = doc["machines"]["engine"]
    engine["edges"] = [e for e in engine["edges"] if e["id"] != "Stopped:dispose:Disposed"]
    explode = {"trigger": "explode", "source": "Serving", "dest": "Failed", "guards": [], "effects": [], "doc": ""}
    engine["edges"].append({"id": "Serving:explode:Failed", "active": True, **explode})
    offload = next(e for e in engine["edges"] if e["id"] == "Quiesced:offload:Offloaded")
    offload["effects"] = offload["effects"][:1]
    ref.write_text(json.dumps(doc))
    out = tmp / "review.html"
    assert main(["graph", "--format", "html", "--compare", str(ref), "-o", str(out)]) == 0
    return out


def _edge_path_dashed(page, option: str, edge: str) -> bool:
    return page.evaluate(
        """([id]) => { const g = document.getElementById(id);
            if (!g || g.closest('div.graph').hidden) return null;
            return g.querySelector('path').hasAttribute('stroke-dasharray'); }""",
        [f"{option}/engine/edge/{edge}"],
    )


def test_review_page_follows_the_selected_preset(page, review_html):
    page.goto(review_html.as_uri())
    page.wait_for_selector("body[data-ready=true]")
    row = page.locator(f'table.edges[data-machine=engine] tr[data-edge="{RECOVER}"]')
    rollout_ft = page.locator("#predicate-table tr[data-predicate=rollout_ft] td").nth(1)
    monitors = page.locator("#gate-table tr[data-predicate=monitors_rollout] td").nth(1)

    page.select_option("#preset", "ft-rollout")
    assert row.get_attribute("data-active") == "true"
    assert _edge_path_dashed(page, "ft-rollout", RECOVER) is False
    assert _edge_path_dashed(page, "ft-train", RECOVER) is None  # the other preset's graph is hidden
    assert rollout_ft.inner_text() == "true" and monitors.inner_text() == "yes"

    page.select_option("#preset", "ft-train")
    assert row.get_attribute("data-active") == "false"
    assert "inactive" in row.get_attribute("class")
    assert _edge_path_dashed(page, "ft-train", RECOVER) is True
    assert _edge_path_dashed(page, "ft-rollout", RECOVER) is None
    assert rollout_ft.inner_text() == "false" and monitors.inner_text() == "no"
    assert "--ft-components train" in page.inner_text("#flags")

    ARTIFACTS.mkdir(exist_ok=True)
    shot = page.locator("#machine-engine div.graph:not([hidden])")  # the engine under ft-train: recover dashed
    shot.screenshot(path=str(ARTIFACTS / "review.png"))
    assert (ARTIFACTS / "review.png").stat().st_size > 10_000
    assert page.errors == []
    assert page.context.outside_requests == []


def test_review_page_lists_and_highlights_changes_against_the_reference(page, review_html):
    page.goto(review_html.as_uri())
    page.wait_for_selector("body[data-ready=true]")
    assert page.is_visible("#compare")
    assert page.input_value("#preset") == "ft-rollout"  # the reference's preset is shown first
    listed = page.locator("#compare ul[data-machine=engine]")
    items = {kind: listed.locator(f"li.{kind}").all_inner_texts() for kind in ("added", "removed", "changed")}
    assert len(items["added"]) == 1 and "Stopped:dispose:Disposed" in items["added"][0]
    assert len(items["removed"]) == 1 and "Serving:explode:Failed" in items["removed"][0]
    assert len(items["changed"]) == 1 and "Quiesced:offload:Offloaded" in items["changed"][0]
    assert "(effects)" in items["changed"][0]
    assert page.locator("#compare").get_attribute("data-total") == "3"

    def classes(element_id: str) -> str:
        return page.evaluate("(id) => document.getElementById(id).getAttribute('class') || ''", element_id)

    assert "diff-added" in classes("ft-rollout/engine/edge/Stopped:dispose:Disposed")
    assert "diff-changed" in classes("ft-rollout/engine/edge/Quiesced:offload:Offloaded")
    assert "diff-touched" in classes("ft-rollout/engine/state/Serving")
    assert "diff-added" not in classes("ft-train/engine/edge/Stopped:dispose:Disposed")
    assert page.locator("table.edges[data-machine=engine] tr.diff-added").count() == 1
    page.select_option("#preset", "no-ft")
    assert page.locator("table.edges[data-machine=engine] tr.diff-added").count() == 0
    assert page.errors == []


def _mermaid_blocks() -> dict[str, str]:
    """Every mermaid diagram we publish: the committed golden blocks and the --prune variants."""
    blocks: dict[str, str] = {}
    for name in MACHINES:
        text = (REPO / "docs" / "graphs" / f"{name}.md").read_text(encoding="utf-8")
        found = re.findall(r"^## (\S+)\n.*?```mermaid\n(.*?)```", text, flags=re.S | re.M)
        assert [p for p, _ in found] == list(PRESETS)
        blocks.update({f"docs/graphs/{name}.md#{p}": body for p, body in found})
    for p in PRESETS:
        doc = graph_document(preset(p), prune=True)
        blocks.update({f"{m}/{p}/prune": to_mermaid(g) for m, g in doc["machines"].items()})
    return blocks


def test_every_mermaid_output_parses_with_real_mermaid(page, tmp_path):
    if not MERMAID_JS.is_file():
        pytest.skip(f"{MERMAID_JS.relative_to(REPO)} missing: run `npm ci` at the repo root (package-lock.json)")
    host = tmp_path / "mermaid.html"  # a file: page, so chromium loads the 3.5 MB bundle from disk
    host.write_text(f'<!DOCTYPE html><meta charset="utf-8"><script src="{MERMAID_JS.as_uri()}"></script>')
    page.goto(host.as_uri())
    blocks = _mermaid_blocks()
    assert len(blocks) == 2 * len(MACHINES) * len(PRESETS)
    texts = sorted(set(blocks.values()))  # presets often give equal diagrams; parse each text once (~70 ms each)
    control = "stateDiagram-v2\n    A --> : nowhere\n"  # the parser must reject this, or the test proves nothing
    results = page.evaluate(
        """async (texts) => { const out = [];
            for (const text of texts) {
              try { const r = await mermaid.parse(text); out.push(r ? r.diagramType : 'no result'); }
              catch (e) { out.push('ERROR ' + (e.message || e)); } }
            return out; }""",
        [*texts, control],
    )
    assert results.pop().startswith("ERROR")  # the parser really rejects bad input
    verdict = dict(zip(texts, results, strict=True))
    bad = {key: verdict[text] for key, text in blocks.items() if verdict[text] != "stateDiagram"}
    assert not bad, bad
    assert page.errors == [] and page.context.outside_requests == []
