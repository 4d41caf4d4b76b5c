"""The HTML review page without a browser: self-contained, every preset embedded; and edge diffs."""

from __future__ import annotations

import copy
import html
import json
import re
import shutil

import pytest

from lifecycle.cli import main
from lifecycle.decide.machines import MACHINES
from lifecycle.decide.presets import PRESETS, preset
from lifecycle.graph import diff_machines, graph_document, reference_config

NOT_EXTERNAL = "!external_engines (external_engines=false)"  # the second guard of recover


def test_diff_finds_added_removed_and_changed_edges():
    ref = graph_document(preset("ft-rollout"))["machines"]["engine"]
    cur = copy.deepcopy(ref)
    cur["edges"] = [e for e in cur["edges"] if e["id"] != "Init:dispose:Disposed"]
    recover = next(e for e in cur["edges"] if e["id"] == "Unhealthy:recover:Recovering")
    recover["active"] = False
    recover["guards"][0]["value"] = False
    diff = diff_machines(ref, cur)
    assert [e["id"] for e in diff["removed"]] == ["Init:dispose:Disposed"]
    assert diff["added"] == []
    assert diff["changed"] == [
        {
            "id": "Unhealthy:recover:Recovering",
            "fields": ["guards", "active"],
            "before": "recover [rollout_ft=true, " + NOT_EXTERNAL + "] / recover_engine, kill_engine",
            "after": "recover [rollout_ft=false, " + NOT_EXTERNAL + "] / recover_engine, kill_engine",
            "active_before": True,
            "active_after": False,
        }
    ]
    assert diff_machines(ref, ref) == {
        "added": [],
        "removed": [],
        "changed": [],
        "states_added": [],
        "states_removed": [],
    }


def test_reference_config_is_rebuilt_from_values_when_not_a_preset():
    config = preset("ft-train")
    doc = graph_document(config)
    assert reference_config(doc)[1] is None
    assert reference_config(doc)[0] == config
    named = graph_document(config, preset_name="ft-train")
    assert reference_config(named) == (config, "ft-train")


@pytest.fixture(scope="module")
def page_text(tmp_path_factory):
    if shutil.which("dot") is None:
        pytest.skip("graphviz `dot` not installed (apt-get install graphviz)")
    out = tmp_path_factory.mktemp("html") / "review.html"
    assert main(["graph", "--format", "html", "--preset", "ft-train", "-o", str(out)]) == 0
    return out.read_text(encoding="utf-8")


def test_review_page_is_one_self_contained_file(page_text):
    assert page_text.startswith("<!DOCTYPE html>")
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page_text)
    assert "<link" not in page_text and "@import" not in page_text and "url(http" not in page_text
    assert page_text.count("<svg") == len(PRESETS) * len(MACHINES)  # --preset given: no command-line option


def test_review_page_embeds_every_preset_with_its_explain_data(page_text):
    options = re.findall(r'<option value="([^"]+)"( selected)?>', page_text)
    assert [key for key, _ in options] == list(PRESETS)
    assert [key for key, sel in options if sel] == ["ft-train"]
    raw = re.search(r'<script type="application/json" id="review-data">(.*?)</script>', page_text, re.S).group(1)
    data = json.loads(raw)
    assert [o["key"] for o in data["options"]] == list(PRESETS)
    by_key = {o["key"]: o for o in data["options"]}
    assert by_key["ft-train"]["explain"]["predicates"]["rollout_ft"] is False
    assert by_key["ft-rollout"]["explain"]["predicates"]["rollout_ft"] is True
    assert {g["predicate"] for g in by_key["replay"]["explain"]["gates"]} >= {"constructs_rollout_fn", "rollout_ft"}
    text = html.unescape(page_text)  # dot writes '-' in ids as &#45;
    for key in PRESETS:
        assert f'id="{key}/engine/edge/Unhealthy:recover:Recovering"' in text
    assert data["compare"] is None


def test_compare_against_a_non_preset_export_adds_its_config(tmp_path, capsys):
    if shutil.which("dot") is None:
        pytest.skip("graphviz `dot` not installed (apt-get install graphviz)")
    ref = tmp_path / "ref.json"
    assert main(["graph", "--format", "json", "--machine", "engine", "--use-fault-tolerance", "-o", str(ref)]) == 0
    out = tmp_path / "r.html"
    assert main(["graph", "--format", "html", "--machine", "engine", "--compare", str(ref), "-o", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    data = json.loads(re.search(r'id="review-data">(.*?)</script>', text, re.S).group(1))
    assert data["compare"]["target"] == "reference-config" == data["selected"]
    assert data["compare"]["machines"]["engine"]["changed"] == []  # same specs, same config: nothing changed
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "something-else@9"}')
    assert main(["graph", "--format", "html", "--compare", str(bad), "-o", str(out)]) == 2
    assert "is not a rl-lifecycle/graph@1 export" in capsys.readouterr().err
