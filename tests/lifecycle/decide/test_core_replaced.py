"""A process replaced behind an external engine's address (issue 41, case 13), as the core sees it: the shell
reports ``replaced`` (news naming the generation it attached); the core lets the old process go (out of
routing), attaches the new one as a new generation, and that one catches up before it is routed -- with or
without rollout FT, since nothing failed. News about an older generation moves nothing."""

from __future__ import annotations

from lifecycle.decide.core import ROLLOUT, Outcome

from .test_core import RFT, Drive, cfg

EXTERNAL = {"rollout_external_engine_addrs": ["127.0.0.1:30000", "127.0.0.1:30001"]}


def _serving(**flags: object) -> Drive:
    d = Drive(cfg(**EXTERNAL, **flags)).start()
    d.op("generate")
    assert d.engines() == ["Serving", "Serving"]
    return d


def test_a_replaced_process_is_let_go_and_the_new_one_is_a_new_generation_caught_up_before_routing() -> None:
    for flags in (RFT, {}):
        d = _serving(**flags)
        d.do(Outcome("replaced", ROLLOUT, 1, "another process answers there", epoch=1))
        assert d.triggers("engine-1")[-4:] == ["stop", "confirm_dead", "start", "ready"]
        assert d.engines() == ["Serving", "PendingWeights"] and d.s.engines[1].epoch == 2
        assert not d.s.engines[1].current and not d.s.engines[1].replaced
        assert d.s.failed is None
        stop = [c for c in d.commands if c.instance == "engine-1"][-3:]
        assert [c.effect for c in stop] == ["stop_routing", "kill_engine", "launch_engine"]
        d.op("generate_done")
        d.op("generate")
        assert d.triggers("engine-1")[-3:] == ["begin_update", "finish_update", "resume"]
        assert d.engines() == ["Serving", "Serving"] and d.s.engines[1].current


def test_a_replacement_reported_about_an_older_generation_moves_nothing() -> None:
    d = _serving()
    before = d.s
    r = d.core.step(d.s, Outcome("replaced", ROLLOUT, 0, "late", epoch=0))
    assert r.moves == () and r.commands == () and r.state == before
    assert [(f.instance, f.news, f.epoch, f.current) for f in r.fenced] == [("engine-0", "replaced", 0, 1)]


def test_a_replacement_of_an_engine_not_running_is_not_news() -> None:
    d = Drive(cfg(**EXTERNAL))
    r = d.core.step(d.s, Outcome("replaced", ROLLOUT, 0, "before it started", epoch=0))
    assert r.moves == () and r.commands == ()
