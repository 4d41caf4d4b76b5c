"""Kept engines (issue 31, the core's half): with --detach-engines a driver's death costs no engine, and a resumed
job adopts the slots its engine ledger names instead of launching them. What an adopted engine holds decides how
it rejoins -- the checkpoint's committed weights: no reload; a later (voided), torn or unknown version: reloaded
before it is routed; unreachable or not the ledger's process: killed and launched anew. The checker lets the
driver die at every state of such a job and holds every invariant over the adoption that follows."""

from __future__ import annotations

import pytest

from lifecycle.check.explore import explore, lattice
from lifecycle.check.world import Checker
from lifecycle.decide.config import ConfigError
from lifecycle.decide.core import Command, Outcome

from .test_core import RFT, Drive, cfg, ok

KEPT = {"save": "runs/job/checkpoints", "save_interval": 1, "load": "runs/job/checkpoints", "detach_engines": True}


def _answer(**held: str) -> object:
    """The shells' answers, with each kept engine's adoption answer (engine-0="adopted", ...)."""

    def answer(cmd: Command) -> Outcome:
        if cmd.effect == "adopt_engine":
            return Outcome(held[cmd.instance.replace("-", "")])
        return ok(cmd)

    return answer


def _resumed(epochs: tuple[int | None, ...], **flags: object) -> Drive:
    d = Drive(cfg(**RFT, **KEPT, **flags))
    d.s = d.core.with_kept(d.s, epochs)
    return d


def test_an_engine_holding_the_checkpoint_is_adopted_without_a_reload_and_serves_at_the_first_generate() -> None:
    d = _resumed((4, 7))
    d.op("trainer.start")
    d.op("init", answer=_answer(engine0="adopted", engine1="adopted"))  # type: ignore[arg-type]
    assert d.triggers("engine-0") == ["adopt", "adopted"] and d.triggers("engine-1") == ["adopt", "adopted"]
    assert not [c for c in d.commands if c.effect in ("launch_engine", "transfer_weights")]
    assert d.engines() == ["Quiesced", "Quiesced"] and all(e.current and not e.kept for e in d.s.engines)
    assert [e.epoch for e in d.s.engines] == [4, 7]  # the same processes: the same generations
    d.op("generate")
    assert d.engines() == ["Serving", "Serving"]


def test_an_engine_holding_another_version_is_reloaded_before_it_is_routed() -> None:
    d = _resumed((3, 3))
    d.op("trainer.start")
    d.op("init", answer=_answer(engine0="adopted", engine1="behind"))  # type: ignore[arg-type]
    assert d.triggers("engine-1") == ["adopt", "adopted_behind", "begin_update", "finish_update"]
    loads = [c for c in d.commands if c.effect == "transfer_weights"]
    assert [(c.instance, c.weights) for c in loads] == [("engine-1", "committed")]
    assert d.engines() == ["Quiesced", "Quiesced"] and all(e.current for e in d.s.engines)


def test_an_unreachable_engine_is_killed_and_launched_anew_with_a_new_generation() -> None:
    d = _resumed((5, None))
    d.op("trainer.start")
    d.op("init", answer=_answer(engine0="lost"))  # type: ignore[arg-type]
    assert d.triggers("engine-0") == [
        "adopt",
        "disown",
        "confirm_dead",
        "start",
        "ready",
        "begin_update",
        "finish_update",
    ]
    assert d.triggers("engine-1")[0] == "start"  # no ledger entry: a new engine
    # no generation is used twice: the slot's new process and the never-kept slot's are both past the ledger's
    assert [e.epoch for e in d.s.engines] == [6, 6]
    assert d.engines() == ["Quiesced", "Quiesced"]


def test_an_adoption_that_raises_counts_as_lost() -> None:
    d = _resumed((1, 1))
    d.op("trainer.start")

    def answer(cmd: Command) -> Outcome:
        if cmd.effect == "adopt_engine" and cmd.engine == 0:
            return Outcome("error", reason="actor handle lookup timed out")
        return _answer(engine1="adopted")(cmd)  # type: ignore[operator, no-any-return]

    d.op("init", answer=answer)
    assert d.triggers("engine-0")[:3] == ["adopt", "disown", "confirm_dead"] and d.engines()[0] == "Quiesced"


def test_kept_slots_are_restored_once_before_anything_runs_and_only_where_engines_are_kept() -> None:
    d = Drive(cfg(**RFT, **KEPT))
    with pytest.raises(ValueError, match="for 1 engines, but the job has 2"):
        d.core.with_kept(d.s, (1,))
    d.start()
    with pytest.raises(ValueError, match="before the first operation"):
        d.core.with_kept(d.s, (1, 1))
    plain = Drive(cfg(**RFT, save="runs/job/checkpoints", load="runs/job/checkpoints"))
    with pytest.raises(ValueError, match="keeps no engines"):
        plain.core.with_kept(plain.s, (1, None))
    assert plain.core.with_kept(plain.s, (None, None)).engines == plain.s.engines  # nothing kept: unchanged


@pytest.mark.parametrize(
    ("flags", "why"),
    [
        ({"detach_engines": True}, "reconciles it with the job checkpoint in --save"),
        ({"detach_engines": True, "debug_train_only": True, "save": "x"}, "starts no rollout engine"),
        (
            {"detach_engines": True, "save": "x", "rollout_external_engine_addrs": ["127.0.0.1:30000"]},
            "kept by their owner already",
        ),
    ],
)
def test_detach_engines_is_refused_where_nothing_can_be_kept_or_adopted(flags: dict[str, object], why: str) -> None:
    with pytest.raises(ConfigError, match="--detach-engines") as err:
        cfg(**flags)
    assert why in str(err.value)


def test_the_checker_lets_the_driver_die_anywhere_and_adopts_every_way() -> None:
    """Every adoption outcome is reached from a driver death, and every invariant holds over what follows."""
    config = cfg(**RFT, **KEPT)
    checker = Checker(config, engines=2)
    assert checker.adopts and checker.dies
    seen: set[object] = set()
    todo, triggers, dies_in = [checker.initial()], set[str](), set[str]()
    while todo:
        n = todo.pop()
        k = n.key()
        if k in seen:
            continue
        seen.add(k)
        out = list(checker.successors(n))
        deaths = [t for t in out if t.action.name == "fault.driver_death"]
        if n.world.faults < checker.max_faults and not checker.terminal(n):  # wherever a fault may still strike
            assert len(deaths) == 1, n
            dies_in.add(n.job.rollout)
        for t in out:
            triggers |= {m.trigger for m in t.moves if m.machine == "engine"}
            todo.append(t.node)
    assert {"adopt", "adopted", "adopted_behind", "disown"} <= triggers
    # not only between steps: mid-start, mid-generate, mid-weight-update, while offloaded
    assert {"StartingServers", "Generating", "UpdatingWeights", "Ready"} <= dies_in
    assert explore(config, engines=2).ok


def test_the_lattice_has_resumed_jobs_that_keep_their_engines_under_every_ft_configuration() -> None:
    kept = [c for c in lattice().valid if c.detach_engines]
    assert len(kept) == 8
    assert {(tuple(sorted(c.ft_components)), c.update_weight_transfer_mode) for c in kept} == {
        (comps, mode)
        for comps in ((), ("rollout",), ("train",), ("rollout", "train"))
        for mode in ("disk", "broadcast")
    }
