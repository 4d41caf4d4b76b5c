"""A fleet operation's step costs O(N + k), not O(N^2) (issue 32, P7): counted, never timed.

Every whole engine group or list of commands out that a step copies or builds goes through the step's working
copies (``_Items``, ``_Awaiting``): a step builds each once per read of the whole, never once per engine move,
command handed out or result crossed off. So the number of such copies per operation must not grow with the
number of engines -- the engines tuple rebuilt per move, ``awaiting`` appended one command at a time or a
result crossed off by a copy (the quadratic step the issue found) would make it grow linearly.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from lifecycle.decide.core import Command
from lifecycle.decide.core.draft import ChangedItems, CommandsOut

from .test_core import Drive, cfg

FLEET_OPS = ("generate", "generate_done", "offload", "onload_weights", "update_weights", "onload_kv", "generate")


@pytest.fixture
def copies(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """Counts the working copies' whole-collection builds: a new working copy, a list copied from the tuple, a
    tuple built from the list."""
    counts: Counter[str] = Counter()
    items, awaiting = ChangedItems, CommandsOut

    def counting(name: str, original: Callable[..., Any], copies_when: Callable[[Any], bool]) -> Callable[..., Any]:
        def wrapper(self: Any, *args: Any) -> Any:
            if copies_when(self):
                counts[name] += 1
            return original(self, *args)

        return wrapper

    for cls, label in ((items, "items"), (awaiting, "awaiting")):
        monkeypatch.setattr(cls, "__init__", counting(f"{label}.new", cls.__init__, lambda self: True))
        monkeypatch.setattr(cls, "get", counting(f"{label}.tuple", cls.get, lambda self: self.frozen is None))
    monkeypatch.setattr(items, "put", counting("items.list", items.put, lambda self: self.items is None))
    monkeypatch.setattr(
        awaiting, "_working", counting("awaiting.list", awaiting._working, lambda self: self.items is None)
    )
    yield counts


def per_operation(n: int, counts: Counter[str]) -> dict[str, Counter[str]]:
    drive = Drive(cfg(rollout_num_gpus=n, offload_rollout=True)).start()
    out = {}
    for name in FLEET_OPS:
        counts.clear()
        assert drive.op(name) is None, name
        out[name] = Counter(counts)
    assert drive.engines() == ["Serving"] * n  # every engine went through every operation
    return out


def test_a_fleet_operation_copies_the_engines_and_the_commands_out_as_often_at_any_fleet_size(
    copies: Counter[str],
) -> None:
    small, large = per_operation(4, copies), per_operation(64, copies)
    assert small == large
    assert all(sum(c.values()) for c in small.values())  # the counting sees the steps' copies at all


def test_results_are_crossed_off_the_first_equal_command_out_as_list_remove_did() -> None:
    """Above the scan's size the index crosses off what ``list.remove`` would: the first equal command, in any
    order, with duplicates, interleaved with new commands, and nothing for a command not out."""
    cmds = [Command("release_weights", "engine", f"engine-{i % 20}", "rollout", i % 20) for i in range(40)]
    extra = Command("probe_engine", "engine", "eval-0", "eval", 0)
    working = CommandsOut(tuple(cmds))
    reference = list(cmds)
    for step, cmd in enumerate([cmds[7], cmds[3], cmds[27], extra, cmds[7], cmds[7], cmds[39], cmds[0]]):
        working.remove(cmd)
        if cmd in reference:
            reference.remove(cmd)
        if step % 3 == 0:
            working.append(extra)
            reference.append(extra)
        assert working.get() == tuple(reference)
