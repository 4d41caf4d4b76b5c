"""Replay files: round trip, and every kind of damage named with file and rollout id."""

from __future__ import annotations

import json

import pytest

from rollout.replay import SCHEMA, ReplayDataError, load_rollout, save_rollout

SAMPLES = [{"prompt": "ab", "response": "abab", "reward": 0.5, "tokens": [1, 2, 3]}, {"prompt": "é", "reward": 1.0}]


def test_round_trip(tmp_path):
    template = str(tmp_path / "data" / "{rollout_id}.json")
    path = save_rollout(template, 3, SAMPLES, weight_version="v3")
    assert path.name == "3.json"
    assert load_rollout(template, 3) == SAMPLES
    assert not list(path.parent.glob("*.tmp"))


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda p: p.unlink(), "does not exist"),
        (lambda p: p.write_text(p.read_text()[: len(p.read_text()) // 2]), "truncated or corrupt"),
        (lambda p: p.write_text(json.dumps({"samples": []})), "no schema field"),
        (lambda p: p.write_text(p.read_text().replace(SCHEMA, "rl-lifecycle/rollout@0")), "schema"),
        (lambda p: p.write_text(p.read_text().replace('"reward": 0.5', '"reward": 0.9')), "checksum mismatch"),
        (lambda p: p.write_bytes(b"\x80\x81 not utf8"), "truncated or corrupt"),
    ],
)
def test_damaged_files_raise_replay_data_error_naming_file_and_rollout(tmp_path, damage, message):
    template = str(tmp_path / "{rollout_id}.json")
    path = save_rollout(template, 1, SAMPLES)
    damage(path)
    with pytest.raises(ReplayDataError) as info:
        load_rollout(template, 1)
    assert message in str(info.value)
    assert str(path) in str(info.value) and "rollout 1" in str(info.value)
    assert "Fix:" in str(info.value)


def test_a_file_of_another_rollout_is_refused(tmp_path):
    save_rollout(str(tmp_path / "{rollout_id}.json"), 2, SAMPLES)
    (tmp_path / "2.json").rename(tmp_path / "5.json")
    with pytest.raises(ReplayDataError, match="holds rollout 2"):
        load_rollout(str(tmp_path / "{rollout_id}.json"), 5)
