"""The rollout fleet as a loop sees it: :class:`Fleet` (who is wanted, who serves, who leaves) and the
``--scale-rollout N@STEP`` schedule (:class:`Scale`).

An elastic fleet (``--rollout-min-num-gpus`` / ``--rollout-max-num-gpus``) grows and shrinks mid-run; the lifecycle
core decides every join and leave, and :class:`Fleet` is read off its state, never kept beside it. Light on purpose
(no torch, Ray or HTTP imports): the CLI parses ``--scale-rollout`` with it before the loop is imported.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from lifecycle.decide.config import MAX_COUNT, arg_type, parse_number
from lifecycle.decide.errors import ConfigError

_SCALE_RE = re.compile(r"(?P<engines>[0-9]+)@(?P<step>[0-9]+)")  # ASCII digits only


@dataclass(frozen=True)
class Fleet:
    """The rollout fleet now, in engine slot ids (``engine-0``, ...): Dynamo's desired / allocated / traffic.

    ``target``: the engines wanted (``Job.scale_rollout``; a preemption does not lower it: the gap is replaced);
    ``members``: the slots that hold or will hold a member (joining, loading the committed weights, serving);
    ``serving``: the routable ones; ``draining``: the leaving ones (out of the gateway, their requests in flight
    finishing, or being stopped); ``vacant``: the free slots a join may take (up to ``--rollout-max-num-gpus``)."""

    target: int
    members: tuple[str, ...]
    serving: tuple[str, ...]
    draining: tuple[str, ...]
    vacant: tuple[str, ...]


@dataclass(frozen=True)
class Scale:
    """``--scale-rollout N@STEP``: as step STEP starts, the loop calls ``job.scale_rollout(N)``."""

    engines: int
    step: int

    def __str__(self) -> str:
        return f"{self.engines}@{self.step}"


def parse_scale(spec: str) -> Scale:
    """``N@STEP``: N engines from step STEP on; both bounded like every count (the fleet's bounds are checked with
    the config, :func:`trainer.app.checks.check_scale`)."""
    m = _SCALE_RE.fullmatch(spec.strip())
    if not m:
        raise ConfigError(
            "--scale-rollout",
            spec,
            "not a scale spec",
            "use N@STEP: N engines from step STEP on, e.g. --scale-rollout 4@3",
        )
    numbers = []
    for part, low in (("engines", 1), ("step", 0)):
        try:
            numbers.append(int(parse_number(m[part], int, low, MAX_COUNT)))
        except ValueError as exc:
            name = "N" if part == "engines" else "STEP"
            raise ConfigError(
                "--scale-rollout", spec, f"its {name} is {exc}", f"give {name} in {low}..{MAX_COUNT}"
            ) from None
    return Scale(numbers[0], numbers[1])


# ``lifecycle run --scale-rollout``'s argparse type: a bad spec is refused while the command line is parsed
scale_arg = arg_type(parse_scale, "scale")
