"""Confirming a stop, in the core: an engine is Stopped (or restarted by a recovery) only once its death is
confirmed; a kill the shell reports as ``alive`` stops the run instead -- a second process on the same slot
would serve beside a zombie that still holds its port and memory."""

from __future__ import annotations

from lifecycle.decide.core import ROLLOUT, Command, Outcome

from .test_core import RFT, Drive, cfg, ok


def _survives_sigkill(cmd: Command) -> Outcome:
    if cmd.effect == "kill_engine" and cmd.engine == 0:
        return Outcome("alive", reason="process still alive 10s after SIGKILL")
    return ok(cmd)


def test_a_stop_whose_death_is_not_confirmed_never_reaches_stopped_and_stops_the_run() -> None:
    d = Drive(cfg(**RFT)).start()
    d.op("stop_engine", 0, answer=_survives_sigkill)
    assert "confirm_dead" not in d.triggers("engine-0") and d.engines()[0] != "Stopped"
    assert d.s.failed is not None and (d.s.failed.machine, d.s.failed.instance) == ("engine", "engine-0")
    assert str(d.s.failed).startswith("engine-0: process still alive after SIGKILL")
    confirmed = Drive(cfg(**RFT)).start()
    confirmed.op("stop_engine", 0)
    assert confirmed.engines()[0] == "Stopped" and confirmed.triggers("engine-0")[-1] == "confirm_dead"


def test_a_recovery_whose_kill_is_not_confirmed_never_starts_a_second_process() -> None:
    d = Drive(cfg(**RFT)).start()
    d.do(Outcome("died", ROLLOUT, 0))
    d.op("generate", answer=_survives_sigkill)
    assert "restart" not in d.triggers("engine-0") and "still alive after SIGKILL" in str(d.s.failed)
