"""The trainer tests' rollout stand-in: these tests are about the trainer group (healing, failing, bounded
calls on real Ray actors), so the rollout side's commands -- launch, load, probe, release -- answer as a
healthy engine would without starting one. Tests that are about the two together use the real rollout
manager (``test_update_weights_*``, the loop tests)."""

from __future__ import annotations

from lifecycle.decide.core import Command, Outcome
from lifecycle.decide.runner import Runner

# the nominal result of each command (the rest answer ``done``): what a healthy engine reports
NOMINAL = {"launch_engine": "ready", "kill_engine": "dead", "transfer_weights": "loaded", "probe_engine": "probe_ok"}


def bind_rollout_stand_in(runner: Runner) -> None:
    async def nominal(cmd: Command) -> Outcome:
        return Outcome(NOMINAL.get(cmd.effect, "done"))

    runner.provide({f"{m}.{e}": nominal for m, e in runner.core.commands() if m != "trainer"})


async def generated(runner: Runner) -> None:
    """The rollout side through init and one generate, as a loop does before its first train step (the core
    refuses ``train`` before anything was generated)."""
    for name in ("init", "generate", "generate_done"):
        await runner.operate(name)
