"""The README's and the docs' promises: the core's example runs, the two set-up commands are the Makefile's, and
the module map is the tree."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
EMBEDDING = (ROOT / "docs" / "embedding.md").read_text()  # the core's example
ARCHITECTURE = (ROOT / "docs" / "architecture.md").read_text()  # the module map


@pytest.mark.lifecycle_gate
def test_api_example_runs_and_shows_the_train_only_ft_gate(tmp_path):
    """The core example: init's commands come out in three rounds, a death under train-only FT is not
    recovered (the blocked recover names rollout_ft) and the run stops."""
    blocks = [b for b in re.findall(r"```python\n(.*?)```", EMBEDDING, re.S) if "Core(config)" in b]
    assert blocks, "docs/embedding.md lost the core's example (Core(config))"
    code = blocks[0]
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "['construct_eval_fn', 'construct_rollout_fn']",
        "['launch_engine']",
        "['transfer_weights']",
        "Ready ['Quiesced', 'Quiesced']",
        "recover ('rollout_ft',)",
        "engine-1 failed",
        "Refusal(kind='failed', reason='engine-1 failed', blocked_by=())",
    ]


def test_first_screen_gives_two_commands_that_the_makefile_and_ci_run():
    first_screen = "\n".join(README.splitlines()[:25])
    commands = re.findall(r"^make (\w+)", first_screen, re.M)
    assert commands == ["run", "test"]
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^run:", makefile, re.M) and re.search(r"^test:", makefile, re.M)
    assert "make test" in (ROOT / ".ci/run").read_text()


def test_the_module_map_lists_every_module_once_and_nothing_else():
    """A newcomer finds any file from the map in docs/architecture.md: it must match the tree exactly."""
    start, end = "<!-- module-map: checked by tests/test_readme.py -->", "<!-- /module-map -->"
    block = ARCHITECTURE.split(start)[1].split(end)[0]
    listed = re.findall(r"^\| `([\w/]+\.py)` \| (.+) \|$", block, re.M)
    names = [name for name, _ in listed]
    packages = ("lifecycle", "engines", "rollout", "trainer")
    modules = sorted(str(p.relative_to(ROOT)) for pkg in packages for p in (ROOT / pkg).rglob("*.py"))
    assert len(names) == len(set(names)), "a module is listed twice"
    assert sorted(names) == modules
    assert all(len(what) > 10 for _, what in listed)
