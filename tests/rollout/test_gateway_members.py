"""``read_gateway`` against the real SMG gateways of a job (rollout and eval): each router's whole ``GET /workers``
list becomes one ``gateway.members`` fact, every worker named by the engine whose URL it is (and that process's
epoch), a URL no slot of the group holds named None. Observed on SMG 1.13: a withdrawn engine (``DELETE
/workers/{id}``) is gone from the list at once -- SMG shows no ``draining`` row for it -- while it still answers what
it was forwarded (``test_drain.py``)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("smg")

from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.core import Command
from lifecycle.decide.events import GATEWAY_MEMBERS, EventLog, MemorySink
from lifecycle.decide.runner import Runner
from rollout.controller import InferenceController
from rollout.executor import RolloutManager
from rollout.routing import RouterRouting

from .conftest import routed_manager

pytestmark = pytest.mark.routing


class Rig:
    def __init__(self, tmp: Path) -> None:
        self.config = LifecycleConfig.from_mapping({"rollout_num_gpus": 2, "eval_num_gpus": 1})
        self.loop = asyncio.new_event_loop()
        self.runner = Runner(self.config, log=EventLog([MemorySink()]))
        self.manager: RolloutManager = routed_manager(self.config, self.runner, tmp, self.run)

    @property
    def controller(self) -> InferenceController:
        return self.manager.controller

    def routing(self, group: str) -> RouterRouting:
        routing = self.controller.routing(group)
        assert isinstance(routing, RouterRouting)
        return routing

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def read(self) -> dict[str, list[tuple[Any, ...]]]:
        """router -> its workers as (instance, epoch, status, weight_version), and that no read failed."""
        facts, errors = self.run(self.controller.read_gateway())
        assert errors == []
        out = {}
        for fact in facts:
            assert fact.event == GATEWAY_MEMBERS
            fields = dict(fact.fields)
            out[fields["router"]] = [
                (w["instance"], w["epoch"], w["status"], w["weight_version"]) for w in fields["workers"]
            ]
        return out


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    r = Rig(tmp_path_factory.mktemp("members"))
    yield r
    r.run(r.manager.dispose())
    r.loop.close()


def test_both_routers_are_read_whole_and_each_worker_is_named(rig: Rig) -> None:
    c = rig.controller
    e0, e1, ev = c.engines[0], c.engines[1], c.evals[0]
    for engine, group in ((e0, "rollout"), (e1, "rollout"), (ev, "eval")):
        assert rig.run(rig.routing(group).publish(engine)).name == "done"
    assert rig.read() == {
        "router-rollout": sorted(
            [("engine-0", e0.epoch, "ready", "0"), ("engine-1", e1.epoch, "ready", "0")],
            key=lambda w: next(e.url for e in (e0, e1) if e.id == w[0]) or "",
        ),
        "router-eval": [("eval-0", ev.epoch, "ready", "default")],  # registered unlabelled: SMG says "default"
    }
    assert e0.epoch is not None and e1.epoch is not None


def test_a_withdrawn_engine_is_gone_from_the_list_and_a_stray_url_is_named_none(rig: Rig) -> None:
    c = rig.controller
    e0, e1, ev = c.engines[0], c.engines[1], c.evals[0]
    assert rig.run(rig.routing("rollout").withdraw(e1)).name == "done"
    read = rig.read()
    assert read["router-rollout"] == [("engine-0", e0.epoch, "ready", "0")]  # no "draining" row: gone
    assert ev.url is not None  # the eval engine's URL, registered at the rollout router by hand: a stray there
    rig.run(rig.routing("rollout").router.add(ev.url, weight_version="0"))
    strays = [w for w in rig.read()["router-rollout"] if w[0] is None]
    assert strays == [(None, None, "ready", "0")]
    rig.run(rig.routing("rollout").router.remove(ev.url))
    assert [w[0] for w in rig.read()["router-rollout"]] == ["engine-0"]


def test_the_handler_returns_the_facts_with_a_done_result(rig: Rig) -> None:
    outcome = rig.run(rig.controller._read_gateway(Command("read_gateway", "rollout", "rollout")))
    assert outcome.name == "done" and outcome.reason == ""
    assert sorted(dict(f.fields)["router"] for f in outcome.facts) == ["router-eval", "router-rollout"]
