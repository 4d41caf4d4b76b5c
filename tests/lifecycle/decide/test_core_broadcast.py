"""The weight-update group in the core (``--update-weight-transfer-mode broadcast``), step by step.

Connect before the first broadcast; stale when a member's process changes; destroyed and connected
again before the next broadcast; a failed broadcast aborts the update on every engine of the snapshot
(none is routed until it reloaded the committed weights); a failed connect changes nothing.
"""

from __future__ import annotations

import pytest

from lifecycle.decide.core import BROADCAST as VIA_GROUP
from lifecycle.decide.core import COMMITTED_WEIGHTS, PENDING_WEIGHTS, Command, Outcome

from .test_core import RFT, Drive, cfg, ok

pytestmark = pytest.mark.weight_update
BROADCAST = {"update_weight_transfer_mode": "broadcast"}
BOTH = {**RFT, "ft_components": ["rollout", "train"]}
LOAD = "engine.transfer_weights"


def step(d: Drive, answer=ok) -> None:
    d.op("generate")
    d.op("generate_done")
    d.op("train")
    d.op("update_weights", answer=answer)


def sync(d: Drive) -> list[str]:
    return d.triggers("weight-sync")


def test_the_first_update_connects_every_engine_then_broadcasts_and_the_next_reuses_the_group():
    d = Drive(cfg(**RFT, **BROADCAST)).start()
    step(d)
    assert sync(d) == ["connect", "connected", "broadcast", "broadcast_done"]
    assert d.s.sync == "Connected" and all(e.joined and e.current for e in d.s.engines)
    # the broadcast is the first command of its step, the engines' receives follow under the lock
    first = next(i for i, c in enumerate(d.commands) if c.effect == "broadcast_weights")
    assert [c.effect for c in d.commands[first : first + 3]] == ["broadcast_weights", *["transfer_weights"] * 2]
    step(d)
    assert sync(d)[4:] == ["broadcast", "broadcast_done"]  # no reconnect: the membership is unchanged


def loads(d: Drive, since: int = 0) -> list[tuple[str, str, str, str]]:
    """Every engine load the core handed out: which engine, which weights, how, and the handler it goes to."""
    return [(c.instance, c.weights, c.via, c.handler) for c in d.commands[since:] if c.handler.startswith(LOAD)]


@pytest.mark.parametrize("mode", ["disk", "broadcast"])
def test_each_load_names_the_weights_it_takes_and_a_members_receive_is_the_groups_command(mode):
    """The rule the controller used to branch on: the trainer's update gives the rollout engines its new
    weights (received from the group while it broadcasts), every other load the committed ones from disk."""
    d = Drive(cfg(**RFT, **(BROADCAST if mode == "broadcast" else {})))
    d.start()
    disk = LOAD
    assert loads(d) == [(f"engine-{i}", COMMITTED_WEIGHTS, "", disk) for i in (0, 1)]  # the initial weights
    before = len(d.commands)
    step(d)
    via, handler = (VIA_GROUP, f"{disk}.broadcast") if mode == "broadcast" else ("", disk)
    assert loads(d, before) == [(f"engine-{i}", PENDING_WEIGHTS, via, handler) for i in (0, 1)]
    d.do(Outcome("died", "rollout", 1, "SIGKILL"))
    before = len(d.commands)
    d.op("generate")  # recovered, then caught up with the committed weights (from disk, whatever the mode)
    assert loads(d, before) == [("engine-1", COMMITTED_WEIGHTS, "", disk)]


def test_disk_mode_never_touches_the_group():
    d = Drive(cfg(**RFT)).start()
    step(d)
    assert sync(d) == [] and d.s.sync == "Init" and not any(e.joined for e in d.s.engines)


def test_a_restarted_member_makes_the_group_stale_and_the_next_update_reconnects():
    d = Drive(cfg(**RFT, **BROADCAST)).start()
    step(d)
    d.do(Outcome("died", "rollout", 1, "SIGKILL"))
    assert d.s.sync == "Stale" and not d.s.engines[1].joined  # its process left the group
    step(d)  # generate recovers it (a new process: PendingWeights, then the committed weights from disk)
    assert sync(d)[4:] == ["membership_changed", "destroy", "connect", "connected", "broadcast", "broadcast_done"]
    assert all(e.joined and e.current for e in d.s.engines)


def test_a_failed_broadcast_takes_every_engine_of_the_snapshot_out_until_it_reloads_the_committed_weights():
    d = Drive(cfg(**RFT, **BROADCAST)).start()
    step(d)

    def tear(cmd: Command) -> Outcome:
        return Outcome("failed", reason="gloo: connection reset") if cmd.effect == "broadcast_weights" else ok(cmd)

    step(d, tear)
    assert sync(d)[-2:] == ["broadcast", "broadcast_failed"] and d.s.sync == "Disconnected"
    assert not d.s.lock and d.s.trainer == "Ready" and d.s.rollout == "Ready"
    assert not any(e.current or e.joined for e in d.s.engines)  # both took part: both may hold a mix
    assert any(c.effect == "destroy_weight_group" for c in d.commands)
    mark = len(d.moves)
    d.op("generate")  # each reloads the committed checkpoint (the catch-up) before it is routed
    engine0 = [m.trigger for m in d.moves[mark:] if m.instance == "engine-0"]
    assert engine0 == ["begin_update", "finish_update", "resume"], engine0
    assert all(e.state == "Serving" and e.current for e in d.s.engines)
    d.op("generate_done")
    d.op("train")
    d.op("update_weights")
    assert sync(d)[-4:] == ["connect", "connected", "broadcast", "broadcast_done"]  # the next update reconnects


def test_a_failed_connect_changes_no_engine_and_ends_the_update():
    d = Drive(cfg(**RFT, **BROADCAST)).start()

    def refuse(cmd: Command) -> Outcome:
        return Outcome("failed", reason="rendezvous timed out") if cmd.effect == "init_weight_group" else ok(cmd)

    step(d, refuse)
    assert sync(d) == ["connect", "connect_failed"] and d.s.trainer == "Ready" and d.s.rollout == "Ready"
    assert all(e.current and e.state == "Quiesced" for e in d.s.engines) and not d.s.dirty
    assert d.op("generate") is None


@pytest.mark.parametrize(("ft", "healed"), [(RFT, False), (BOTH, True)])
def test_a_trainer_crash_mid_broadcast_heals_and_redoes_the_update_or_stops(ft, healed):
    d = Drive(cfg(**ft, **BROADCAST)).start()
    step(d)
    crashed = []

    def crash_once(cmd: Command) -> Outcome:
        if cmd.effect == "broadcast_weights" and not crashed:
            crashed.append(cmd)
            return Outcome("worker_crashed", reason="actor died")
        return ok(cmd)

    step(d, crash_once)
    trainer = d.triggers("trainer")
    if healed:
        assert trainer[-5:] == ["worker_crashed", "heal", "healed", "update_weights", "update_done"], trainer
        again = ["broadcast", "broadcast_failed", "connect", "connected", "broadcast", "broadcast_done"]
        assert sync(d)[-6:] == again  # the update runs again from its start, over a new group
        assert all(e.current for e in d.s.engines) and not d.s.failed
    else:
        # it crashed while UpdatingWeights (the abort of the broadcast does not move the trainer first)
        crash = next(m for m in d.moves if m.trigger == "worker_crashed")
        assert crash.src == "UpdatingWeights" and trainer[-2:] == ["worker_crashed", "fail"] and d.s.failed


def test_the_mixed_weights_invariant_reads_the_world_not_the_cores_bookkeeping():
    """It fails for a Serving engine whose process holds a failed broadcast's mix, whatever the core believes
    (even that the engine is current), and passes once the process is whole again."""
    from lifecycle.check.invariants import no_engine_routed_with_mixed_weights
    from lifecycle.check.world import Checker, Node

    checker = Checker(cfg(**RFT, **BROADCAST))
    d = Drive(cfg(**RFT, **BROADCAST)).start()
    d.op("generate")
    assert d.engines() == ["Serving", "Serving"] and all(e.current for e in d.s.engines)
    world = checker.initial().world
    assert no_engine_routed_with_mixed_weights(checker, Node(d.s, world)) is None
    torn = world._replace(torn=(False, True))
    problem = no_engine_routed_with_mixed_weights(checker, Node(d.s, torn))
    assert problem is not None and "engine-1" in problem
