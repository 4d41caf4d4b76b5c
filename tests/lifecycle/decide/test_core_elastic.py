"""An elastic fleet in the core: joins, retirements, notices, replacement, a spent budget, the minimum, the weight
group's generation -- and a config without bounds unchanged.

The driver of ``test_core`` plays the shells; where news must land while commands are out (under the engine lock,
mid-stream, while a launch is out) the test steps by hand (:class:`Hand`)."""

from __future__ import annotations

from typing import Any

import pytest

from lifecycle.decide.core import ROLLOUT, Command, Completed, Core, Op, Outcome, Result
from lifecycle.decide.core.model import COMMITTED_WEIGHTS
from lifecycle.decide.core.plan import ELASTIC_PHASES, OPERATIONS

from .test_core import RFT, Drive, cfg, ok

BOUNDS = {"rollout_min_num_gpus": 1, "rollout_max_num_gpus": 3}


def elastic(**flags: Any) -> Drive:
    return Drive(cfg(**{**BOUNDS, **flags})).start()


class Hand:
    """Step by step: the commands out are answered only when the test says so, so news can land in between."""

    def __init__(self, d: Drive) -> None:
        self.d = d
        self.out: list[Command] = []

    def send(self, event: Op | Outcome) -> Result:
        r: Result = self.d.core.step(self.d.s, event)
        assert r.refused is None, r.refused
        self.d.s = r.state
        self.d.moves += r.moves
        self.out += r.commands
        return r

    def answer(self, pick: Any = lambda c: True) -> Result:
        """Answer (plainly) the commands out that ``pick`` picks; the rest stay out."""
        now = [c for c in self.out if pick(c)]
        self.out = [c for c in self.out if not pick(c)]
        r: Result = self.d.core.step(self.d.s, Completed(tuple((c, ok(c)) for c in now)))
        assert r.refused is None
        self.d.s = r.state
        self.d.moves += r.moves
        self.out += r.commands
        return r

    def until_locked(self) -> None:
        """Answer the commands out until the engine lock is taken (the trainer writes its weights first)."""
        while not self.d.s.lock:
            self.answer()

    def settle(self) -> None:
        while self.out:
            self.answer()


def scale(d: Drive, n: int) -> Any:
    return d.do(Op("scale_rollout", target=n))


def notice(i: int, epoch: int | None = None) -> Outcome:
    return Outcome("preempt_notice", ROLLOUT, i, epoch=epoch)


# -- a config without bounds ------------------------------------------------------------------------------------
def test_without_bounds_the_fleet_the_programs_and_the_news_are_as_before() -> None:
    core = Core(cfg())
    assert (core.engines, core.initial_engines, core.elastic) == (2, 2, False)
    assert core.initial().target == 0 and core.initial().sync_generation == 0
    for name, op in OPERATIONS.items():  # the elastic phases are left out: the same states as before
        assert core.programs[name] == tuple(p for p in op.program if p not in ELASTIC_PHASES)
    assert ("rollout", "read_gateway") not in core.commands()
    d = Drive(cfg()).start()
    d.op("generate")
    before = d.s
    assert d.do(notice(0)) is None and d.s == before  # a notice moves nothing: there is no fleet to drain
    refused = d.do(Op("scale_rollout", target=2))
    assert refused is not None and refused.kind == "blocked" and refused.blocked_by == ("elastic",)
    refused = d.op("retire_engine", 0)
    assert refused is not None and refused.kind == "blocked"
    with pytest.raises(ValueError, match="only an elastic fleet"):
        Core(cfg(), initial=1)


def test_slots_are_the_maximum_and_only_the_initial_fleet_starts() -> None:
    d = elastic()
    assert (d.core.engines, d.core.initial_engines, d.core.min_engines) == (3, 2, 1)
    assert d.engines() == ["Quiesced", "Quiesced", "Init"] and d.s.target == 2
    assert d.core.members(d.s) == (0, 1)
    assert ("rollout", "read_gateway") in d.core.commands()


# -- joins ------------------------------------------------------------------------------------------------------
def test_a_joiner_launches_catches_up_on_the_committed_weights_and_is_routed_only_after() -> None:
    d = elastic()
    d.op("generate")
    d.op("generate_done")
    assert scale(d, 3) is None
    assert d.s.target == 3 and d.core.members(d.s) == (0, 1, 2)
    assert d.triggers("engine-2") == ["join", "ready", "begin_update", "finish_update"]
    load = [c for c in d.commands if c.effect == "transfer_weights" and c.engine == 2]
    assert [c.weights for c in load] == [COMMITTED_WEIGHTS]
    assert d.engines() == ["Quiesced", "Quiesced", "Quiesced"] and d.s.engines[2].current
    assert d.commands[-1].effect == "read_gateway"  # the operation ends by reading the gateway back
    d.op("generate")
    assert d.engines() == ["Serving"] * 3 and d.triggers("engine-2")[-1] == "resume"


def test_a_join_during_a_generate_waits_for_the_next_boundary_to_load_and_serve() -> None:
    d = elastic()
    d.op("generate")
    scale(d, 3)
    assert d.engines() == ["Serving", "Serving", "PendingWeights"]  # launched, holding nothing: never routed
    d.op("generate_done")
    d.op("generate")  # the boundary: the committed weights first, then the route
    assert d.engines() == ["Serving"] * 3
    assert d.triggers("engine-2") == ["join", "ready", "begin_update", "finish_update", "resume"]


def test_in_a_stream_a_joiner_is_routed_right_after_its_catch_up() -> None:
    d = elastic(fully_async=True)
    d.op("stream")
    scale(d, 3)
    assert d.s.rollout == "Streaming" and d.engines() == ["Serving"] * 3
    assert d.triggers("engine-2") == ["join", "ready", "begin_update", "finish_update", "resume"]


def test_a_failed_join_retires_its_slot_and_never_stops_the_run() -> None:
    d = elastic()
    d.do(Op("scale_rollout", target=3), lambda c: Outcome("start_failed") if c.effect == "launch_engine" else ok(c))
    assert d.engines() == ["Quiesced", "Quiesced", "Retired"] and d.s.failed is None
    assert d.triggers("engine-2") == ["join", "start_failed", "retired"]
    d.op("generate")  # the gap is tried again at the next boundary
    assert d.engines() == ["Serving"] * 3


# -- retirements --------------------------------------------------------------------------------------------------
def test_retire_a_serving_engine_withdraws_it_then_drains_beside_the_loop() -> None:
    d = elastic()
    d.op("generate")
    assert d.op("retire_engine", 1) is None
    assert d.engines() == ["Serving", "Draining", "Init"] and d.s.target == 1
    assert [c.effect for c in d.commands if c.engine == 1][-2:] == ["stop_routing", "drain_requests"]
    assert d.commands[-1].effect == "read_gateway"
    assert d.core.members(d.s) == (0,) and d.core.routable(d.s) == (0,)
    d.do(Outcome("drained", ROLLOUT, 1, epoch=d.s.engines[1].epoch))
    assert d.engines() == ["Serving", "Retired", "Init"]
    assert d.triggers("engine-1")[-3:] == ["retire", "drained", "retired"]


@pytest.mark.parametrize(
    ("setup", "state"),
    [("ready", "Quiesced"), ("generating_joiner", "PendingWeights"), ("unhealthy", "Unhealthy")],
)
def test_retire_from_every_state_with_a_retire_edge_stops_it_at_once(setup: str, state: str) -> None:
    """Serving drains (above); the unrouted states stop at once. (Offloaded and WeightsOnly have retire edges
    too, but an elastic fleet refuses offload: --offload-rollout with bounds is a ConfigError.)"""
    d = elastic(**(RFT if setup == "unhealthy" else {}))
    if setup == "generating_joiner":
        d.op("generate")
        scale(d, 3)
        i = 2
    elif setup == "unhealthy":
        d.do(Outcome("died", ROLLOUT, 1))
        i = 1
    else:
        i = 1
    assert d.s.engines[i].state == state
    assert d.op("retire_engine", i) is None
    assert d.s.engines[i].state == "Retired" and d.triggers(f"engine-{i}")[-2:] == ["retire", "retired"]
    assert d.s.failed is None


def test_retire_refusals_name_the_bound_and_the_member() -> None:
    d = elastic(rollout_min_num_gpus=2)
    refused = d.op("retire_engine", 0)
    assert refused is not None and refused.kind == "illegal" and "--rollout-min-num-gpus" in refused.reason
    refused = d.op("retire_engine", 2)
    assert refused is not None and refused.kind == "illegal"  # a vacant slot: Init has no retire
    for target in (1, 4):
        refused = scale(d, target)
        assert refused is not None and refused.kind == "illegal" and "--rollout-max-num-gpus" in refused.reason


def test_scaling_down_retires_the_vacant_soon_first_then_the_highest_slot() -> None:
    d = elastic()
    d.op("generate")
    scale(d, 3)  # engine-2 PendingWeights: it goes first
    scale(d, 1)
    assert d.engines() == ["Serving", "Draining", "Retired"] and d.s.target == 1


# -- notices -------------------------------------------------------------------------------------------------------
def test_a_notice_on_a_serving_engine_withdraws_it_at_once_and_keeps_the_target() -> None:
    d = elastic()
    d.op("generate")
    d.do(notice(0, d.s.engines[0].epoch))
    assert d.engines() == ["Draining", "Serving", "Init"] and d.s.target == 2
    assert d.core.members(d.s) == (1,)


def test_a_notice_on_an_idle_engine_stops_it_and_the_next_boundary_replaces_it_into_a_vacant_slot() -> None:
    d = elastic()
    d.do(notice(0))
    assert d.engines() == ["Retired", "Quiesced", "Init"] and d.s.target == 2
    d.op("generate")
    assert d.engines() == ["Serving", "Serving", "Init"]  # the lowest vacant slot with budget: engine-0 again
    assert d.triggers("engine-0")[-5:] == ["join", "ready", "begin_update", "finish_update", "resume"]
    assert d.s.engines[0].epoch == 2 and not d.s.engines[0].leaving  # a new process: a fresh state


def test_a_spare_slot_makes_the_replacement_make_before_break() -> None:
    d = elastic()
    d.op("generate")
    d.do(notice(1))  # engine-1 drains beside the loop
    d.op("generate_done")
    d.op("generate")  # the boundary joins the spare slot while engine-1 still drains
    assert d.engines() == ["Serving", "Draining", "Serving"]


def test_a_notice_under_the_engine_lock_retires_at_its_release() -> None:
    d = elastic()
    h = Hand(d)
    h.send(Op("update_weights"))
    h.until_locked()
    assert d.engines()[:2] == ["UpdatingWeights", "UpdatingWeights"]
    h.send(notice(1))
    assert d.s.engines[1].leaving and d.engines()[1] == "UpdatingWeights"  # the snapshot is not cut into
    h.settle()
    assert not d.s.lock and d.engines() == ["Quiesced", "Retired", "Init"] and d.s.failed is None
    assert d.triggers("engine-1")[-4:] == ["begin_update", "finish_update", "retire", "retired"]


def test_a_notice_mid_stream_under_the_lock_drains_the_paused_engine_at_the_release() -> None:
    d = elastic(fully_async=True)
    d.op("stream")
    h = Hand(d)
    h.send(Op("update_weights"))
    h.until_locked()
    assert d.engines()[:2] == ["UpdatingInFlight", "UpdatingInFlight"]
    h.send(notice(0))
    assert d.engines()[0] == "UpdatingInFlight"
    h.settle()
    # its kept requests continue, unrouted; the other engine resumes
    assert d.engines() == ["Draining", "Serving", "Init"]
    retire = [m for m in d.moves if m.instance == "engine-0" and m.trigger == "retire"]
    assert retire[-1].src == "Paused" and retire[-1].effects == ("continue_generation", "drain_requests")
    d.do(Outcome("drained", ROLLOUT, 0))
    assert d.engines()[0] == "Retired"
    drained = [m for m in d.moves if m.trigger == "drained"][-1]
    assert drained.effects == ("hand_back_requests", "kill_engine")  # a stream takes back what it had not got


def test_a_notice_on_a_joiner_retires_it_once_it_is_up() -> None:
    d = elastic()
    h = Hand(d)
    h.send(Op("scale_rollout", target=3))
    assert d.engines()[2] == "Joining"
    h.send(notice(2))
    assert d.engines()[2] == "Joining"
    h.settle()
    assert d.engines()[2] == "Retired"
    assert d.triggers("engine-2") == ["join", "ready", "retire", "retired"]


def test_a_notice_on_a_recovering_engine_retires_its_slot_at_the_recovery_kill() -> None:
    d = elastic(**RFT)
    d.do(Outcome("died", ROLLOUT, 1))
    h = Hand(d)
    h.send(Op("generate"))
    assert d.engines()[1] == "Recovering"
    h.send(notice(1))
    h.settle()
    assert d.engines()[1] != "Failed" and "retired" in d.triggers("engine-1")
    assert "restart" not in d.triggers("engine-1")
    assert d.engines()[0] == "Serving" and d.s.failed is None


def test_a_notice_about_an_older_process_is_fenced() -> None:
    d = elastic()
    r = d.core.step(d.s, notice(0, epoch=0))
    assert r.moves == () and not r.state.engines[0].leaving
    assert [(f.instance, f.trigger, f.epoch, f.current) for f in r.fenced] == [("engine-0", "retire", 0, 1)]


def test_news_about_a_leaver_stops_it_never_marks_it() -> None:
    """Without rollout FT a death stops the run -- but not a leaver's: its death is lost, its slot vacant."""
    d = elastic()
    d.op("generate")
    d.do(notice(0))
    d.do(Outcome("died", ROLLOUT, 0))
    assert d.engines() == ["Retired", "Serving", "Init"] and d.s.failed is None
    assert d.triggers("engine-0")[-3:] == ["retire", "lost", "retired"]
    d.op("generate_done")
    d.do(Outcome("died", ROLLOUT, 1))  # a member's unannounced death: fail-fast, as without bounds
    assert d.s.failed is not None


def test_dispose_cuts_a_drain_short_and_disposes_retired_slots() -> None:
    d = elastic()
    d.op("generate")
    d.op("retire_engine", 1)
    d.op("generate_done")
    d.do(notice(0))
    assert d.op("dispose") is None
    assert d.engines() == ["Disposed"] * 3


# -- a spent budget and the minimum -------------------------------------------------------------------------------
def test_a_spent_restart_budget_retires_the_slot_and_the_run_goes_on_above_the_minimum() -> None:
    d = elastic(**{**RFT, "engine_max_restarts": 0, "rollout_max_num_gpus": 2})
    d.do(Outcome("died", ROLLOUT, 1))
    d.op("generate")
    assert d.engines() == ["Serving", "Retired"] and d.s.failed is None
    assert d.triggers("engine-1")[-3:] == ["mark_unhealthy", "recover", "give_up"]
    assert d.s.target == 2 and d.core.members(d.s) == (0,)  # the gap stays: no slot with budget to fill it


def test_below_the_minimum_a_generate_fails_naming_the_bound_and_the_budget() -> None:
    d = elastic(**{**RFT, "engine_max_restarts": 0, "rollout_min_num_gpus": 2, "rollout_max_num_gpus": 2})
    d.do(Outcome("died", ROLLOUT, 1))
    d.op("generate")
    failure = d.s.failed
    assert failure is not None and "--rollout-min-num-gpus" in failure.reason
    assert "--engine-max-restarts" in failure.fix and "engine-1" in failure.fix


# -- the weight-update group's generation ---------------------------------------------------------------------------
def test_a_membership_change_reforms_the_group_as_a_new_generation_and_fences_older_results() -> None:
    d = elastic(update_weight_transfer_mode="broadcast")
    d.op("update_weights")
    assert d.s.sync == "Connected" and d.s.sync_generation == 1
    first = [c for c in d.commands if c.machine == "weight_sync"]
    assert {c.generation for c in first} == {1}
    d.op("retire_engine", 1)  # a planned departure: member_left
    assert d.s.sync == "Stale" and "member_left" in [m.trigger for m in d.moves if m.machine == "weight_sync"]
    d.op("update_weights")
    assert d.s.sync_generation == 2 and d.s.sync == "Connected"
    connect = [c for c in d.commands if c.effect == "init_weight_group"][-1]
    assert connect.generation == 2
    assert d.core.group_members(d.s) == (0,)
    late = first[-1]  # a result of the first group, arriving now
    r = d.core.step(d.s, Completed(((late, Outcome("failed")),)))
    assert r.state == d.s and r.moves == ()
    assert [(f.machine, f.epoch, f.current) for f in r.fenced] == [("weight_sync", 1, 2)]


def test_without_bounds_the_group_has_no_generation() -> None:
    d = Drive(cfg(update_weight_transfer_mode="broadcast")).start()
    d.op("update_weights")
    assert d.s.sync_generation == 0 and all(c.generation == 0 for c in d.commands)


@pytest.mark.parametrize("mode", ["disk", "broadcast"])
def test_an_update_while_an_engine_drains_leaves_it_out_of_the_snapshot_and_the_group(mode: str) -> None:
    d = elastic(update_weight_transfer_mode=mode)
    d.op("generate")
    d.op("retire_engine", 1)  # its drain runs on: no drained news yet
    d.op("generate_done")
    assert d.op("update_weights") is None and d.s.failed is None
    assert d.engines() == ["Quiesced", "Draining", "Init"]
    assert d.s.engines[0].current and not d.s.engines[1].current  # only the snapshot's engine took the update
    assert d.core.group_members(d.s) == ((0,) if mode == "broadcast" else ())


def test_a_resumed_target_is_reached_at_the_first_boundary() -> None:
    d = Drive(cfg(**BOUNDS))
    d.s = d.core.with_target(d.s, 3)
    d.start()
    assert d.engines() == ["Quiesced", "Quiesced", "Init"]  # the configured fleet starts
    d.op("generate")
    assert d.engines() == ["Serving"] * 3 and d.s.target == 3
    with pytest.raises(ValueError, match="outside the fleet's bounds"):
        d.core.with_target(d.core.initial(), 4)
    with pytest.raises(ValueError, match="no elastic fleet"):
        Core(cfg()).with_target(Core(cfg()).initial(), 2)


def test_a_gateway_that_cannot_be_read_does_not_stop_the_run() -> None:
    d = elastic()
    d.do(Op("scale_rollout", target=3), lambda c: Outcome("error") if c.effect == "read_gateway" else ok(c))
    assert d.s.failed is None and d.engines() == ["Quiesced"] * 3


def test_a_fleet_whose_every_engine_left_is_replaced_at_the_next_generate() -> None:
    d = Drive(cfg(rollout_num_gpus=1, rollout_max_num_gpus=1)).start()
    d.do(notice(0))
    assert d.engines() == ["Retired"]
    assert d.op("generate") is None
    assert d.engines() == ["Serving"] and d.s.engines[0].current
