"""The job's state while a step changes it: a working copy of a :class:`JobState`, frozen again once at the end.

A step changes many fields, one engine at a time; rebuilding the 18-field tuple, an engine group or the
commands out at every change would cost more than the step itself (the checker takes ~10^6 steps, and a fleet
operation over N engines would cost O(N^2)). So the fields are plain attributes, the engine groups and the
commands out are working copies changed in place, and each whole is built only when something reads it.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from lifecycle.decide.core.model import ROLLOUT, Command, EngineState, Failure, JobState

Item = TypeVar("Item")


class ChangedItems(Generic[Item]):
    """A tuple field of the state that a step changes item by item (an engine group).

    The changes go to a list, copied from the tuple once; the tuple is built again only when something reads the
    whole group, not at every change. Reads of one item never build it.
    """

    __slots__ = ("frozen", "items")

    def __init__(self, frozen: tuple[Item, ...]) -> None:
        self.frozen: tuple[Item, ...] | None = frozen  # the whole, as a tuple (None: changed since it was built)
        self.items: list[Item] | None = None  # the working copy, once something changed

    def get(self) -> tuple[Item, ...]:
        if self.frozen is None:
            assert self.items is not None
            self.frozen = tuple(self.items)
        return self.frozen

    def put(self, i: int, item: Item) -> None:
        items = self.items
        if items is None:
            assert self.frozen is not None
            items = self.items = list(self.frozen)
        items[i] = item
        self.frozen = None


SCAN_LIMIT = 16  # up to this many commands out, a result is crossed off by a scan (list.remove), above via an index


class CommandsOut:
    """The commands out, while a step adds them and crosses off the ones whose results came back.

    A result crosses off the first equal command still out (exactly what ``list.remove`` does) through an index
    built once, a new command is appended, and the tuple is built once when something reads the whole: O(N + k)
    for k changes, where a tuple rebuilt per change costs O(N * k).
    """

    __slots__ = ("frozen", "items", "where")

    def __init__(self, frozen: tuple[Command, ...]) -> None:
        self.frozen: tuple[Command, ...] | None = frozen
        self.items: list[Command | None] | None = None  # the working copy; None: crossed off
        self.where: dict[Command, list[int]] | None = None  # per command, where its copies still out are, in order

    def get(self) -> tuple[Command, ...]:
        if self.frozen is None:
            assert self.items is not None
            self.frozen = tuple([c for c in self.items if c is not None])
            self.items = self.where = None  # the next change starts from the tuple (positions moved)
        return self.frozen

    def _working(self) -> list[Command | None]:
        if self.items is None:
            assert self.frozen is not None
            self.items = list(self.frozen)
        self.frozen = None
        return self.items

    def append(self, cmd: Command) -> None:
        items = self._working()
        if self.where is not None:
            self.where.setdefault(cmd, []).append(len(items))
        items.append(cmd)

    def remove(self, cmd: Command) -> None:
        """Cross off the first command equal to ``cmd`` still out; none: nothing changes."""
        if self.where is None:
            out = self.items if self.items is not None else self.frozen
            assert out is not None
            if len(out) <= SCAN_LIMIT:  # the few commands a small job has out (the checker's): a scan beats an index
                if cmd in out:
                    self._working().remove(cmd)  # no tombstones yet: the index is what makes them
                return
            where: dict[Command, list[int]] = {}
            for j, c in enumerate(self._working()):
                if c is not None:
                    where.setdefault(c, []).append(j)
            self.where = where
        at = self.where.get(cmd)
        if not at:
            return
        items = self._working()
        items[at.pop(0)] = None
        if not at:
            del self.where[cmd]


def has_command_out(awaiting: tuple[Command, ...], lane: str) -> bool:
    """A command of ``lane`` is out (a plain loop: this runs on every step, a generator costs twice as much)."""
    for c in awaiting:  # noqa: SIM110
        if c.lane == lane:
            return True
    return False


class JobDraft:
    """The job's state so far in a step: :class:`JobState`'s fields as attributes, read and written in place."""

    __slots__ = (
        *(name for name in JobState._fields if name not in ("engines", "evals", "awaiting")),
        "_engines",
        "_evals",
        "commands_out",
    )

    def __init__(self, state: JobState) -> None:
        (
            self.rollout,
            self.trainer,
            self.monitor,
            self.fleet,
            engines,
            evals,
            self.lock,
            self.committed,
            self.dirty,
            self.ci_pending,
            self.rollout_op,
            self.rollout_program,
            self.trainer_op,
            self.trainer_program,
            awaiting,
            self.failed,
            self.sync,
            self.ahead,
            self.version,
            self.buffer,
            self.taken,
            self.resuming,
            self.target,
            self.sync_generation,
        ) = state
        self._engines, self._evals = ChangedItems(engines), ChangedItems(evals)
        self.commands_out = CommandsOut(awaiting)  # the commands given out whose results have not come back

    def freeze(self) -> JobState:
        """The state as the step leaves it."""
        return JobState(
            self.rollout,
            self.trainer,
            self.monitor,
            self.fleet,
            self.engines,
            self.evals,
            self.lock,
            self.committed,
            self.dirty,
            self.ci_pending,
            self.rollout_op,
            self.rollout_program,
            self.trainer_op,
            self.trainer_program,
            self.awaiting,
            self.failed,
            self.sync,
            self.ahead,
            self.version,
            self.buffer,
            self.taken,
            self.resuming,
            self.target,
            self.sync_generation,
        )

    @property
    def engines(self) -> tuple[EngineState, ...]:
        return self._engines.get()

    @engines.setter
    def engines(self, engines: tuple[EngineState, ...]) -> None:
        self._engines = ChangedItems(engines)

    @property
    def evals(self) -> tuple[EngineState, ...]:
        return self._evals.get()

    @evals.setter
    def evals(self, evals: tuple[EngineState, ...]) -> None:
        self._evals = ChangedItems(evals)

    @property
    def awaiting(self) -> tuple[Command, ...]:
        return self.commands_out.get()

    @awaiting.setter
    def awaiting(self, awaiting: tuple[Command, ...]) -> None:
        self.commands_out = CommandsOut(awaiting)

    def group(self, group: str) -> tuple[EngineState, ...]:
        """The whole group (built if it changed since the last read: read one engine with :meth:`engine`)."""
        return self.engines if group == ROLLOUT else self.evals

    def engine(self, group: str, i: int) -> EngineState:
        items = self._engines if group == ROLLOUT else self._evals
        working = items.items
        if working is not None:
            return working[i]
        assert items.frozen is not None
        return items.frozen[i]

    def set_engine(self, group: str, i: int, e: EngineState) -> None:
        (self._engines if group == ROLLOUT else self._evals).put(i, e)

    def state_of(self, part: str, group: str | None = None, i: int | None = None) -> str:
        """The state of one machine: an engine (group and index) or a part (``rollout``, ``sync``, ...)."""
        if part == "engine":
            assert group is not None and i is not None
            return self.engine(group, i).state
        return str(getattr(self, part))

    def set_machine(self, part: str, state: str) -> None:
        setattr(self, part, state)

    def set_lane(self, lane: str, *, op: str | None = None, program: tuple[str, ...] | None = None) -> None:
        if lane == "rollout":
            if op is not None:
                self.rollout_op = op
            if program is not None:
                self.rollout_program = program
        elif lane == "trainer":
            if op is not None:
                self.trainer_op = op
            if program is not None:
                self.trainer_program = program

    def program(self, lane: str) -> tuple[str, ...]:
        return self.rollout_program if lane == "rollout" else self.trainer_program

    def lane_op(self, lane: str) -> str:
        return self.rollout_op if lane == "rollout" else self.trainer_op

    def fail(self, failure: Failure) -> None:
        """The run stops; the first failure is the one it reports."""
        if not self.failed:
            self.failed = failure
