"""Engine generations (issue 31): every launch of an engine's process is a new epoch; news names the epoch it is
about, and news about an older one -- a late death report, a probe verdict or a failed request about a process
that was since replaced (miles #2172) -- moves no machine. The specs say which events are fenced; the core
records each fenced report; the checker sends such reports everywhere and the ``news_epochs_ignored`` mutant,
which drops the fence from the specs, is caught with a shortest counterexample."""

from __future__ import annotations

from dataclasses import replace

import pytest

from lifecycle.check.explore import explore
from lifecycle.check.mutants import MUTANTS
from lifecycle.check.world import STALE_NEWS, Checker, Node
from lifecycle.decide.core import ROLLOUT, Fenced, Outcome
from lifecycle.decide.machines import ENGINE, MONITOR
from lifecycle.decide.spec import SpecError

from .test_core import RFT, Drive, cfg


def _serving(**flags: object) -> Drive:
    d = Drive(cfg(**flags)).start()
    d.op("generate")
    assert d.engines() == ["Serving", "Serving"]
    return d


def test_every_launch_is_a_new_generation() -> None:
    d = Drive(cfg(**RFT))
    assert [e.epoch for e in d.s.engines] == [0, 0]  # no process yet
    d.start()
    assert [e.epoch for e in d.s.engines] == [1, 1]
    d.op("generate")
    d.do(Outcome("died", ROLLOUT, 0, "SIGKILL", epoch=1))  # the monitor marks it; rollout FT restarts it
    d.op("generate_done")
    d.op("generate")
    assert d.triggers("engine-0")[-3:] == ["begin_update", "finish_update", "resume"]
    assert [e.epoch for e in d.s.engines] == [2, 1]


@pytest.mark.parametrize("news", ["died", "threshold_reached", "request_failed"])
def test_news_about_an_older_generation_moves_nothing_and_is_on_the_record(news: str) -> None:
    d = _serving(**RFT)
    before = d.s
    r = d.core.step(d.s, Outcome(news, ROLLOUT, 1, "late", epoch=0))
    assert r.ok and r.moves == () and r.commands == () and r.state == before
    assert len(r.fenced) == 1
    f = r.fenced[0]
    assert (f.instance, f.news, f.epoch, f.current) in {
        ("monitor", news, 0, 1),  # a monitor exists: it would have turned the report into its verdict
        ("engine-1", news, 0, 1),  # a failed request marks the engine itself
    }
    # the same report about the process it has now is acted on
    r = d.core.step(d.s, Outcome(news, ROLLOUT, 1, "now", epoch=1))
    assert r.fenced == () and ("engine-1", "mark_unhealthy") in [(m.instance, m.trigger) for m in r.moves]


def test_without_a_monitor_the_engine_itself_is_fenced() -> None:
    d = _serving()  # no rollout FT: no monitor; a death marks the engine and the run stops
    r = d.core.step(d.s, Outcome("died", ROLLOUT, 0, "late", epoch=0))
    assert r.moves == () and r.fenced == (Fenced("engine", "engine-0", "mark_unhealthy", "Serving", "died", 0, 1),)
    assert d.core.step(d.s, Outcome("died", ROLLOUT, 0, "now", epoch=1)).state.failed is not None


def test_a_shell_that_cannot_tell_the_generation_reports_about_the_current_process() -> None:
    d = _serving(**RFT)
    r = d.core.step(d.s, Outcome("request_failed", ROLLOUT, 0, "timeout"))
    assert r.fenced == () and r.state.engines[0].state == "Unhealthy"


def test_a_late_report_after_a_restart_leaves_the_new_process_serving() -> None:
    """The bug class itself: the old process's death is reported after the new one serves."""
    d = _serving(**RFT)
    d.do(Outcome("threshold_reached", ROLLOUT, 0, "3 failed probes", epoch=1))
    d.op("generate_done")
    d.op("generate")
    assert d.engines() == ["Serving", "Serving"] and d.s.engines[0].epoch == 2
    d.do(Outcome("died", ROLLOUT, 0, "the old process exited", epoch=1))
    assert d.engines() == ["Serving", "Serving"]


def test_only_news_can_be_fenced() -> None:
    with pytest.raises(SpecError, match="fenced event 'resume' is not an environment event"):
        replace(ENGINE, fenced=frozenset({"mark_unhealthy", "resume"}))
    assert MONITOR.fenced <= MONITOR.environment and ENGINE.fenced <= ENGINE.environment


def test_the_checker_catches_a_core_that_ignores_epochs_with_a_shortest_counterexample() -> None:
    config = cfg(**RFT)
    assert explore(config, engines=2).ok
    result = explore(config, engines=2, machines=MUTANTS["news_epochs_ignored"].machines())
    assert not result.ok
    v = result.violations[0]
    assert v.invariant == "no_news_of_an_older_epoch_acted_on"
    labels = [t.action.label() for t in v.path]
    assert labels[-1].startswith("Ray reports the death of engine-0's previous process")
    assert len(labels) == 3  # init, the launches' results, the late report: nothing shorter shows it


def test_the_checker_sends_late_reports_everywhere_and_a_fenced_one_adds_no_state() -> None:
    """A fenced report changes nothing, so it is no edge; and how many launches an engine had is folded to "one or
    more" (only "an older generation exists" matters), so restarts add no state either."""
    config = cfg(**RFT)
    real, unfenced = (
        Checker(config, engines=2),
        Checker(config, engines=2, machines=MUTANTS["news_epochs_ignored"].machines()),
    )
    node = real.initial()
    for _ in range(200):  # walk the real specs to a state where both engines serve
        if all(e.state == "Serving" for e in node.job.engines):
            break
        node = next(t for t in real.successors(node) if not t.action.fault).node
    assert all(e.state == "Serving" for e in node.job.engines)
    late = [t for t in unfenced.successors(node) if t.action.name.startswith("news.stale_epoch_")]
    assert {t.action.name for t in late} == {f"news.stale_epoch_{n}" for n in STALE_NEWS}
    assert not [t for t in real.successors(node) if t.action.name.startswith("news.stale_epoch_")]
    twice = node.job._replace(engines=tuple(e._replace(epoch=7) for e in node.job.engines))
    assert Node(twice, node.world).key() == node.key()
