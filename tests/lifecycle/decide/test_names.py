"""The typed names (``lifecycle.decide.names``) are the specs' names, and a misspelt one is a type error."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import get_args

from lifecycle.decide import names
from lifecycle.decide.core import OPERATIONS
from lifecycle.decide.machines import MACHINES
from lifecycle.decide.names_render import ALIASES, render
from lifecycle.decide.predicates import PREDICATES

ROOT = Path(__file__).resolve().parents[3]


def test_names_module_is_written_from_the_specs() -> None:
    """Regenerate with ``python -m lifecycle.decide.names_render`` after changing a spec."""
    assert (ROOT / "lifecycle" / "decide" / "names.py").read_text() == render()


def test_every_alias_lists_exactly_the_specs_names() -> None:
    for machine, alias in ALIASES.items():
        assert get_args(getattr(names, alias)) == MACHINES[machine].state_names, alias
    assert set(get_args(names.Trigger)) == {t for m in MACHINES.values() for t in m.triggers}
    assert set(get_args(names.PredicateName)) == set(PREDICATES)
    assert get_args(names.OperationName) == tuple(OPERATIONS)


def test_a_misspelt_state_is_a_mypy_error(tmp_path: Path) -> None:
    """The reason for the types: ``state == "Serveing"`` would otherwise be silently False."""
    source = textwrap.dedent(
        """
        from lifecycle.decide.core import JobState

        def serving(s: JobState) -> bool:
            return s.engines[0].state == "Serveing"

        def fine(s: JobState) -> bool:
            return s.engines[0].state == "Serving"
        """
    )
    (tmp_path / "probe_names.py").write_text(source)
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(tmp_path / "probe_names.py")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 1, run.stdout + run.stderr
    errors = [line for line in run.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 1 and "probe_names.py:5" in errors[0] and "Serveing" in errors[0], run.stdout
