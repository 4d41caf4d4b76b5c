"""``lifecycle run`` is a plug-in command: ``trainer.app.cli`` registers it through the entry-point group.

(Its bad-input cases are in ``tests/reliability/test_bad_inputs.py``, with every other command's.)
"""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import EntryPoint

import pytest

from lifecycle.cli import COMMAND_GROUP, build_parser, main, plugin_commands


def test_run_is_discovered_through_the_entry_point_group() -> None:
    (run,) = [ep for ep in plugin_commands() if ep.name == "run"]
    assert run.group == COMMAND_GROUP and run.value == "trainer.app.cli:register"
    assert "run" in build_parser().format_help()


def test_the_lifecycle_command_imports_no_runtime_to_list_its_commands() -> None:
    """Building the parser (every `lifecycle` call does) must not import torch or Ray: seconds each."""
    code = (
        "import sys; from lifecycle.cli import build_parser; build_parser(); "
        "print(sorted(m for m in ('torch', 'ray', 'aiohttp') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_plugin_that_cannot_import_still_shows_and_says_how_to_fix_it(capsys: pytest.CaptureFixture[str]) -> None:
    broken = EntryPoint(name="fly", value="no_such_package.cli:register", group=COMMAND_GROUP)
    parser = build_parser(plugins=[broken])
    assert "fly" in parser.format_help()
    ns = parser.parse_args(["fly", "--anything"])
    with pytest.raises(Exception, match=r"lifecycle fly.*no_such_package.*pip install"):
        ns.func(ns)


def test_run_help_lists_the_faults_from_the_fault_table(capsys: pytest.CaptureFixture[str]) -> None:
    from trainer.app.faults import FAULTS

    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = " ".join(capsys.readouterr().out.split()).replace("- ", "-")  # argparse wraps after a name's hyphen
    assert all(name in out for name in FAULTS), [name for name in FAULTS if name not in out]
