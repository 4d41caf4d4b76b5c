"""The job's parts: how :class:`JobState` names each machine, the spec it runs, and its instance name."""

from __future__ import annotations

from typing import Literal, NamedTuple

# How the job's parts are called in JobState, and the spec each one runs.
PARTS = {
    "rollout": "rollout",
    "trainer": "trainer",
    "monitor": "monitor",
    "fleet": "eval_fleet",
    "engine": "engine",
    "sync": "weight_sync",
}
PART_OF = {machine: part for part, machine in PARTS.items()}
INSTANCE = {
    "rollout": "rollout",
    "trainer": "trainer",
    "monitor": "monitor",
    "fleet": "eval_fleet",
    "sync": "weight-sync",
}
Lane = Literal["rollout", "trainer"]
LANES: tuple[Lane, ...] = ("rollout", "trainer")


class Origin(NamedTuple):
    """The move an effect comes from: the part whose move it is, its engine (group and index) and its source."""

    part: str
    group: str | None
    engine: int | None
    src: str
