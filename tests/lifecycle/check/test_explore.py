"""``lifecycle check`` and the explorer: CLI behaviour, shortest counterexamples, lattice, symmetry."""

from __future__ import annotations

import json
import re

import pytest

from lifecycle.check.explore import explore, lattice, run_check
from lifecycle.check.invariants import INVARIANTS, check_state, check_step
from lifecycle.check.mutants import MUTANTS
from lifecycle.check.world import DEAD, UP, Checker, Node, World, _normal
from lifecycle.cli import main
from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.core import EngineState, JobState
from lifecycle.decide.predicates import behaviour, vector

SINGLE = ["--use-fault-tolerance", "--ft-components", "train", "--rollout-num-gpus", "2", "--jobs", "1"]
ROLLOUT_ONLY = LifecycleConfig.from_mapping({"debug_rollout_only": True, "rollout_num_gpus": 2}, check_paths=False)


def check(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["check", *argv])
    out, err = capsys.readouterr()
    return code, out, err


# -- the command ------------------------------------------------------------------------------------
def test_single_config_passes_and_prints_the_states_table(capsys):
    code, out, err = check(capsys, *SINGLE)
    assert code == 0, out + err
    assert re.search(r"states\s+transitions\s+inv", out)  # the table header
    row = next(
        line
        for line in out.splitlines()
        if line.endswith("--use-fault-tolerance --ft-components train --rollout-num-gpus 2")
    )
    numbers = [int(n) for n in re.findall(r"\s(\d+)\s", row)]
    assert numbers and max(numbers) > 1000  # states/transitions of a real exploration
    assert "1 configs (1 distinct predicate vectors" in out
    assert out.rstrip().endswith("OK: every invariant holds")


def test_mutant_prints_a_numbered_counterexample_naming_the_invariant(capsys):
    code, out, _ = check(capsys, "--mutant", "lock_kept_on_failed_update", "--rollout-num-gpus", "2", "--jobs", "1")
    assert code == 1
    steps = re.findall(r"^  (\d+)\. (.+)$", out, flags=re.M)
    assert [int(n) for n, _ in steps] == list(range(1, len(steps) + 1))
    assert steps[0][1].startswith("loop calls init")
    assert steps[-1][1].startswith("the shells report:") and " error" in steps[-1][1]  # the update fails
    assert "✗ invariant engine_lock_held_only_while_updating: the engine lock is still held" in out
    assert "FAILED: 1 violation(s)" in out


def test_json_output_parses_and_carries_the_violation_steps(capsys):
    code, out, _ = check(
        capsys, "--json", "--mutant", "lock_kept_on_failed_update", "--rollout-num-gpus", "2", "--jobs", "1"
    )
    assert code == 1
    doc = json.loads(out)
    assert doc["ok"] is False and doc["configs"] == 1 and doc["explorations"] == 1
    assert doc["results"][0]["states"] > 0 and doc["results"][0]["ok"] is False
    (violation,) = doc["violations"]
    assert violation["invariant"] == "engine_lock_held_only_while_updating"
    assert violation["config"] == ["--rollout-num-gpus", "2"]
    steps = violation["steps"]
    assert [s["n"] for s in steps] == list(range(1, len(steps) + 1))
    assert steps[-1]["action"].startswith("results.") and steps[-1]["fault"] is True
    last_rollout = [m for m in steps[-1]["moves"] if m["machine"] == "rollout"]
    assert last_rollout == [
        {
            "machine": "rollout",
            "instance": "rollout",
            "trigger": "update_failed",
            "src": "UpdatingWeights",
            "dst": "Ready",
            "effects": [],  # the mutant: release_engine_lock is gone
        }
    ]


def test_json_output_of_a_passing_run(capsys):
    code, out, _ = check(capsys, "--json", *SINGLE)
    assert code == 0
    doc = json.loads(out)
    assert doc["ok"] is True and doc["violations"] == []
    assert doc["states"] == doc["results"][0]["states"] > 0
    assert doc["transitions"] == doc["results"][0]["transitions"] > doc["states"]
    assert doc["seconds"] > 0 and doc["states_per_second"] == pytest.approx(doc["states"] / doc["seconds"], rel=0.01)
    assert (doc["engines"], doc["max_faults"], doc["jobs"]) == (2, 2, 1)


# -- remembering: the core's decisions and the job-only verdicts, asked once per job state -----------------------
REMEMBERED = [
    ROLLOUT_ONLY,
    LifecycleConfig.from_mapping(
        {"use_fault_tolerance": True, "rollout_num_gpus": 2, "eval_num_gpus": 2, "engine_max_restarts": 1},
        check_paths=False,
    ),
    LifecycleConfig.from_mapping(
        {
            "use_fault_tolerance": True,
            "rollout_num_gpus": 2,
            "engine_max_restarts": 1,
            "update_weight_transfer_mode": "broadcast",
            "save": "runs/j",
            "load": "runs/j",
            "save_interval": 1,
            "detach_engines": True,
        },
        check_paths=False,
    ),
]


@pytest.mark.parametrize("config", REMEMBERED, ids=["rollout-only", "ft-eval-fleet", "kept-broadcast-resumed"])
def test_remembering_changes_no_state_and_no_transition(config):
    fast, slow = explore(config, max_faults=1), explore(config, max_faults=1, remember=False)
    assert fast.ok and slow.ok
    assert (fast.states, fast.transitions) == (slow.states, slow.transitions)


def _sample(config: LifecycleConfig, limit: int = 3000) -> list[tuple[Node, object]]:
    """(before, transition) pairs of a breadth-first walk: states of every kind, worlds included."""
    job = Checker(config, max_faults=2)
    start = job.key(job.initial())
    seen, queue, out = {start}, [start], []
    while queue and len(out) < limit:
        s = queue.pop(0)
        for t in job.successors(s):
            out.append((s, t))
            child = job.key(t.node)
            if child not in seen:
                seen.add(child)
                queue.append(child)
    return out


class _NoWorld:
    """Stands in for the world (and the action) where a job-only invariant must not look."""

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"read .{name} of the world or the action")


def _blind(n: Node) -> Node:
    return Node(n.job, _NoWorld())  # type: ignore[arg-type]


def _reads_world(inv, job: Checker, pairs) -> bool:
    from lifecycle.check.world import Transition

    for before, t in pairs:
        try:
            if inv.kind == "state":
                inv.fn(job, _blind(t.node))
            else:
                inv.fn(job, Transition(_NoWorld(), t.moves, _blind(t.node)), _blind(before))  # type: ignore[arg-type]
        except AssertionError:
            return True
    return False


def test_invariants_remembered_per_job_state_read_no_world():
    """Verdicts remembers what an invariant not marked world=True says once per job state or decision; one that
    read the processes' health, the group flags or the action would then be judged on the wrong world."""
    pairs = [(c, _sample(c)) for c in REMEMBERED]
    for inv in INVARIANTS.values():
        if inv.kind not in ("state", "step") or inv.world:
            continue
        for config, sample in pairs:
            assert not _reads_world(inv, Checker(config), sample), f"{inv.name} reads the world: mark it world=True"


def test_the_world_probe_finds_an_unmarked_world_invariant():
    """The probe above can fail: the world-reading invariants, judged blind, are caught."""
    sample = _sample(REMEMBERED[2])
    job = Checker(REMEMBERED[2])
    caught = {inv.name for inv in INVARIANTS.values() if inv.world and _reads_world(inv, job, sample)}
    assert {"dead_engines_are_not_counted_alive", "stopped_only_after_death_confirmed"} <= caught
    assert "no_news_of_an_older_epoch_acted_on" in caught  # reads the action


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--invariant", "bogus"], "--invariant"),
        (["--mutant", "bogus"], "--mutant"),
        (["--engines", "9"], "--engines"),
    ],
)
def test_bad_arguments_exit_2_with_a_clear_error(capsys, argv, flag):
    code, out, err = check(capsys, *argv, *SINGLE)
    assert code == 2
    assert out == ""
    assert err.startswith("lifecycle check: error:")
    assert flag in err
    if flag == "--invariant":
        assert "bogus" in err and "engine_lock_held_only_while_updating" in err  # names the choices


def test_invariant_selection_checks_only_that_invariant(capsys):
    # the lock mutant breaks only the lock invariant: selecting another one passes
    code, out, _ = check(
        capsys,
        "--invariant",
        "replay_never_constructs",
        "--mutant",
        "lock_kept_on_failed_update",
        "--rollout-num-gpus",
        "2",
        "--jobs",
        "1",
    )
    assert code == 0, out
    assert re.search(r"^\s*\d+\s+\d+\s+1\s+[\d.]+s\s", out, flags=re.M)  # the "inv" column says 1 invariant


# -- shortest counterexamples -------------------------------------------------------------------------
def _violation_within(job: Checker, depth: int) -> bool:
    """An independent bounded search: is any invariant violated within ``depth`` steps?"""
    frontier = {job.initial().key(): job.initial()}
    seen = set(frontier)
    for _ in range(depth):
        nxt: dict[Node, Node] = {}
        for s in frontier.values():
            for t in job.successors(s):
                if check_step(job, t, s):
                    return True
                k = t.node.key()
                if k not in seen:
                    seen.add(k)
                    nxt[k] = t.node
        frontier = nxt
    return False


def _replay(job: Checker, path) -> Node:
    """Follow a counterexample's actions from the initial state; each must be a successor."""
    s = job.initial().key()
    for t in path:
        match = [u for u in job.successors(s) if u.action == t.action]
        assert match, f"{t.action} is not enabled in {s}"
        s = match[0].node.key()
    return s


@pytest.mark.parametrize("engines", [1, 2, 3])
def test_counterexamples_are_shortest(engines):
    """stopped_before_death_confirmed: a stop needs the rollout manager Ready, which needs servers_ready, which
    needs every engine started and loaded: init, the launches' results, the loads' results, stop = 4 steps
    (the core commits a fan-out's results together, so the count does not grow with the engines)."""
    machines = MUTANTS["stopped_before_death_confirmed"].machines()
    result = explore(ROLLOUT_ONLY, engines=engines, machines=machines)
    (v,) = result.violations
    assert v.invariant == "stopped_only_after_death_confirmed"
    assert len(v.path) == 4
    assert v.path[-1].action.label().startswith("loop calls stop_engine on engine-")
    job = Checker(ROLLOUT_ONLY, engines=engines, machines=machines)
    end = _replay(job, v.path)
    assert check_state(job, end, frozenset({v.invariant}))  # the path really ends in the violation
    if engines <= 2:
        assert not _violation_within(job, len(v.path) - 1)  # and nothing shorter violates anything


def test_real_specs_have_no_short_violation_either():
    """The bounded search can tell: it finds the mutant (above) but nothing in the real specs."""
    assert not _violation_within(Checker(ROLLOUT_ONLY, engines=2), 8)
    assert _violation_within(
        Checker(ROLLOUT_ONLY, engines=2, machines=MUTANTS["stopped_before_death_confirmed"].machines()), 4
    )


# -- the lattice ---------------------------------------------------------------------------------------------
def test_lattice_covers_all_414_combinations():
    lat = lattice()
    # FT x components x mode x CI x eval fleet x offload; external engines without CI and fleet; broadcast weight
    # updates in the normal mode, without CI, fleet or external engines; a resumed, checkpointing job per FT config
    # x (disk updates, broadcast updates, external engines, kept engines with disk or broadcast updates); vLLM per FT
    # config x mode x offload, and broadcasting; streaming (--fully-async) per FT config x (disk, broadcast, resumed);
    # an elastic fleet without FT and with rollout FT x (disk, broadcast, streaming)
    combinations = 2 * 4 * 4 * 2 * 2 * 2 + 2 * 4 * 4 * 2 + 2 * 4 * 2 + 4 * 5 + 4 * 4 * 2 + 4 * 2 + 4 * 3 + 2 * 3
    assert len(lat.valid) + len(lat.invalid) == combinations == 414
    on_vllm = [c for c in lat.valid if c.rollout_backend == "vllm"]
    assert on_vllm and not any(c.offload_rollout and c.mode == "normal" for c in on_vllm)
    refused = [reason for flags, reason in lat.invalid if flags.get("rollout_backend") == "vllm"]
    assert len(refused) == 4 + 4  # offloading with a trainer and servers: the normal mode, disk or broadcast
    assert all("sleep mode" in reason for reason in refused)
    streaming = [c for c in lat.valid if c.fully_async]
    assert len(streaming) == 12 + 2 and sum(c.load is not None for c in streaming) == 4
    elastic = [c for c in lat.valid if c.rollout_max_num_gpus is not None]
    assert len(elastic) == 6 and not any(c.offload_rollout or c.eval_num_gpus or c.load for c in elastic)
    resumed = [c for c in lat.valid if c.load is not None and c.save is not None and not c.fully_async]
    assert len(resumed) == 20
    assert sum(c.update_weight_transfer_mode == "broadcast" for c in resumed) == 8
    assert sum(c.detach_engines for c in resumed) == 8
    assert sum(bool(c.rollout_external_engine_addrs) for c in resumed) == 4
    assert any(c.rollout_external_engine_addrs for c in lat.valid)
    assert any(c.update_weight_transfer_mode == "broadcast" for c in lat.valid)
    assert all(reason for _, reason in lat.invalid)
    assert lat.valid and lat.invalid


def test_lattice_groups_partition_the_valid_configs_by_predicate_vector():
    lat = lattice()
    grouped = [c for configs in lat.groups.values() for c in configs]
    assert sorted(map(repr, grouped)) == sorted(map(repr, lat.valid))
    for vec, configs in lat.groups.items():
        assert {behaviour(c) for c in configs} == {vec}
    # a vLLM config explores with the sglang configs that behave alike (the machines read no capability)
    assert any({c.rollout_backend for c in configs} == {"sglang", "vllm"} for configs in lat.groups.values())
    assert len(lat.groups) < len(lat.valid)  # grouping saves explorations


def test_configs_in_one_group_explore_identically():
    lat = lattice()
    group = next(g for g in lat.groups.values() if len(g) > 1 and not vector(g[0])[0] and len(g) < 5)
    results = [explore(c) for c in group]
    assert len({(r.states, r.transitions) for r in results}) == 1


def test_run_check_in_parallel_matches_serial():
    small = [g for g in lattice().groups.values() if g[0].debug_rollout_only or g[0].debug_train_only]
    groups = small[:6]
    assert len(groups) == 6
    serial = [(r.states, r.transitions, r.ok) for r in run_check(groups, jobs=1, max_faults=1)]
    parallel = [(r.states, r.transitions, r.ok) for r in run_check(groups, jobs=2, max_faults=1)]
    assert serial == parallel


@pytest.mark.recovery
def test_fault_budget_bounds_the_state_space():
    sizes = [explore(ROLLOUT_ONLY, max_faults=f).states for f in (0, 1, 2)]
    assert sizes[0] < sizes[1] < sizes[2]


# -- symmetry reduction ------------------------------------------------------------------------------------------
def test_permuted_engines_map_to_the_same_key():
    a, b, c = EngineState("Serving", current=True), EngineState("Unhealthy"), EngineState("Starting")
    procs = {a: UP, b: DEAD, c: UP}

    def node(order: tuple[EngineState, ...]) -> Node:
        return Node(JobState("Ready", "Ready", "Paused", engines=order), World(tuple(procs[e] for e in order)))

    keys = {node(p).key() for p in ((a, b, c), (c, b, a), (b, a, c), (c, a, b))}
    assert len(keys) == 1
    assert node((a, b, c)).key() != node((a, b, b)).key()


def test_symmetry_reduction_shrinks_the_explored_space(monkeypatch):
    reduced = explore(ROLLOUT_ONLY, engines=2)
    monkeypatch.setattr(Checker, "key", lambda self, n: Node(*_normal(n.job, n.world)))
    unreduced = explore(ROLLOUT_ONLY, engines=2)
    assert reduced.ok and unreduced.ok
    assert reduced.states < unreduced.states < 2 * reduced.states + 1
    assert unreduced.transitions > reduced.transitions


def test_every_registered_invariant_is_selectable(capsys):
    for name in ("no_deadlock", "engine_lock_held_only_while_updating"):
        assert name in INVARIANTS
    code, _, _ = check(
        capsys, "--invariant", "no_deadlock", "--debug-rollout-only", "--rollout-num-gpus", "2", "--jobs", "1"
    )
    assert code == 0
