"""Shared test settings and fixtures.

* Hypothesis profiles: ``dev`` (fast, default) and ``ci`` (thorough, selected by ``CI=true``).
* ``LIFECYCLE_REQUIRE_ALL=1`` (set by ``.ci/run``) turns a skip for a missing tool (graphviz,
  chromium, playwright, mermaid) into a failure, so CI cannot go green by skipping.
* ``recorded`` tests run only with ``LIFECYCLE_RECORDED=1`` (docs/contributing.md says which, and why).
* One real local Ray cluster per session (``ray_cluster``), only if a test asks for it.
* ``LIFECYCLE_PURE=1`` unless set: the suite runs the pure-Python core and checker, which its tests patch at run
  time (compiled modules cannot be patched); ``tests/lifecycle/check/test_compiled_equal.py`` runs the compiled
  checker (``make compiled``) against the pure one in child processes.
* SGLang's contracts (``contracts``): ``<repo>/../shared/contracts`` (CI keeps a copy of ``shared/``
  beside the clone) or ``$LIFECYCLE_CONTRACTS``; tests that need them skip, saying where they looked.
* Real CPU engine processes (``main_engine``, ``slow_engine``, ``keyed_engine``, ``doomed_engines``)
  and helpers for tests against them (``support``). torch and aiohttp are imported only by the
  fixtures that need them, so the pure tests do not pay for them.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

os.environ.setdefault("LIFECYCLE_PURE", "1")  # before anything imports lifecycle (lifecycle.compiled decides once)
# Ray starts its workers at nice 15 (the raylet's worker_niceness); here they share 2 cores with the tests' nice-0
# processes (checker children, local-launcher engines, vLLM servers), which starved them: a trainer at a few percent
# of a core fell behind vLLM servers in CI (the stream's in-flight witness failed) and a cell's trainer start waited
# 85-144 s beside the 3-engine lattice. Every Ray a test starts, in-process or in a child, inherits this.
os.environ.setdefault("RAY_worker_niceness", "0")

import pytest
from hypothesis import settings

from engines.process import ServerProcess, torch_engine_command

if TYPE_CHECKING:
    from engines.client import EngineClient
    from engines.models import CausalLM

settings.register_profile("dev", max_examples=30, deadline=None)
settings.register_profile("ci", max_examples=300, deadline=None)
settings.load_profile("ci" if os.environ.get("CI", "").strip().lower() == "true" else "dev")

_MISSING_TOOL_WORDS = ("install", "not installed")
RECORDED = os.environ.get("LIFECYCLE_RECORDED", "") == "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``recorded`` tests (long runs whose behaviour other tests in CI also cover: real-vLLM runs, the FT sweeps'
    none and both halves) run only with ``LIFECYCLE_RECORDED=1``: CI's time bound. Their last results are written in
    the docs they feed."""
    if RECORDED:
        return
    skip = pytest.mark.skip(reason="recorded: run with LIFECYCLE_RECORDED=1 (kept out of CI for its time bound)")
    for item in items:
        if item.get_closest_marker("recorded"):
            item.add_marker(skip)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()
    if not report.skipped or os.environ.get("LIFECYCLE_REQUIRE_ALL") != "1":
        return
    reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if any(word in reason for word in _MISSING_TOOL_WORDS):
        report.outcome = "failed"
        report.longrepr = f"LIFECYCLE_REQUIRE_ALL=1 but a required tool is missing: {reason}"


@pytest.fixture(scope="session")
def vllm_python() -> str:
    """The vLLM engine environment's python (``make engine-env``); a test that needs real vLLM servers skips
    without it (and fails under ``LIFECYCLE_REQUIRE_ALL=1``: the reason says "install")."""
    from engines.vllm.launcher import find_python
    from lifecycle.decide.errors import ConfigError

    try:
        return find_python()
    except ConfigError:
        pytest.skip("the vLLM engine environment is not installed: make engine-env (builds .venv-vllm)")


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[None]:
    """One real local Ray cluster per test session (2 CPUs, no dashboard); only if a test asks."""
    ray = pytest.importorskip("ray", reason="ray is not installed: pip install 'rl-lifecycle[ray]'")
    from engines.actor import init_local_cluster

    init_local_cluster(num_cpus=2)
    yield
    ray.shutdown()


REPO = Path(__file__).resolve().parents[1]


def contracts_dir() -> Path:
    env = os.environ.get("LIFECYCLE_CONTRACTS")
    return Path(env) if env else REPO.parent / "shared" / "contracts"


@dataclass(frozen=True)
class Contracts:
    openapi: dict[str, Any]
    endpoints: dict[str, Any]

    @property
    def schemas(self) -> dict[str, Any]:
        return dict(self.openapi["components"]["schemas"])

    def endpoint(self, path: str) -> dict[str, Any]:
        """The lifecycle summary of ``path``; a path it does not list (the weight-update session, new in
        0.5.23) is read from SGLang's own schema: its POST body's schema name and whether it is required."""
        if path in self.endpoints["endpoints"]:
            return dict(self.endpoints["endpoints"][path])
        post = self.openapi["paths"][path]["post"]
        body = post["requestBody"]
        content_type, media = next(iter(body["content"].items()))
        name = media["schema"]["$ref"].rsplit("/", 1)[-1]
        return {
            "methods": sorted(m.upper() for m in self.openapi["paths"][path]),
            "request_body": {
                "schema_name": name,
                "required": body.get("required", False),
                "content_type": content_type,
            },
        }


@pytest.fixture(scope="session")
def contracts() -> Contracts:
    where = contracts_dir()
    openapi, endpoints = where / "sglang-0.5.23-openapi.json", where / "sglang-lifecycle-endpoints.json"
    if not (openapi.is_file() and endpoints.is_file()):
        pytest.skip(
            f"SGLang contract files not found in {where} (expected sglang-0.5.23-openapi.json and "
            "sglang-lifecycle-endpoints.json); set LIFECYCLE_CONTRACTS to the shared/contracts folder"
        )
    return Contracts(json.loads(openapi.read_text()), json.loads(endpoints.read_text()))


# Every CPU engine process the engines tests use, by name (torch_engine_command keyword arguments).
# Module-scoped fixtures below hand them out; the pool starts all that the collected tests need *at
# once*, when the first of them is asked for, because importing torch (seconds of CPU) dominates and
# runs in parallel across processes. Each engine is closed when the module that uses it ends.
API_KEY = "s3cret-key"
ENGINE_SPECS: dict[str, dict[str, Any]] = {
    "main": {"seed": 7},
    "slow": {"seed": 5, "step_delay_s": 0.01},  # ~100 tokens/s: requests stay in flight long enough to pause
    "keyed": {"seed": 1, "api_key": API_KEY},
    "victim": {"seed": 2},  # SIGKILLed
    "graceful": {"seed": 3, "step_delay_s": 0.01},  # SIGTERMed with a request in flight
    "receiver_a": {"seed": 11, "weight_group_timeout_s": 20.0},  # weight-update group members
    "receiver_b": {"seed": 12, "weight_group_timeout_s": 20.0},  # (b is SIGKILLed mid-broadcast)
}
FIXTURE_ENGINES = {
    "main_engine": ("main",),
    "slow_engine": ("slow",),
    "keyed_engine": ("keyed",),
    "doomed_engines": ("victim", "graceful"),
    "receivers": ("receiver_a", "receiver_b"),
}


class EnginePool:
    def __init__(self) -> None:
        self.procs: dict[str, ServerProcess] = {}

    def spawn(self, names: Any) -> None:
        for name in names:
            if name not in self.procs:
                proc = ServerProcess(torch_engine_command(**ENGINE_SPECS[name]), engine_id=f"test-{name}")
                proc.spawn()
                self.procs[name] = proc

    def get(self, name: str, timeout: float = 90.0) -> ServerProcess:
        self.spawn([name])
        proc = self.procs[name]
        try:
            proc.wait_ready(timeout)
        except BaseException:
            self.close(name)
            raise
        return proc

    def close(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is not None:
            if proc.alive:
                proc.close()
            else:
                proc.wait_dead(5.0)

    def close_all(self) -> None:
        for name in list(self.procs):
            self.close(name)


@pytest.fixture(scope="session")
def engine_pool(request: pytest.FixtureRequest) -> Iterator[EnginePool]:
    import torch

    # The reference model runs here while engine processes run beside it: on a small CI box torch's
    # intra-op threads on tiny tensors cost far more than they save (the engines use one thread too).
    torch.set_num_threads(1)
    pool = EnginePool()
    needed = {
        name
        for item in request.session.items
        for fixture in getattr(item, "fixturenames", ())
        for name in FIXTURE_ENGINES.get(fixture, ())
    }
    pool.spawn(sorted(needed))
    yield pool
    pool.close_all()


def _module_engines(pool: EnginePool, fixture: str) -> Iterator[list[ServerProcess]]:
    names = FIXTURE_ENGINES[fixture]
    try:
        yield [pool.get(name) for name in names]
    finally:
        for name in names:
            pool.close(name)


@pytest.fixture(scope="module")
def main_engine(engine_pool: EnginePool) -> Iterator[ServerProcess]:
    """Seed 7, default flags: generation, weights, memory, contract shapes."""
    for procs in _module_engines(engine_pool, "main_engine"):
        yield procs[0]


@pytest.fixture(scope="module")
def slow_engine(engine_pool: EnginePool) -> Iterator[ServerProcess]:
    """Seed 5, 10 ms per decode step: pause/continue/abort with requests in flight."""
    for procs in _module_engines(engine_pool, "slow_engine"):
        yield procs[0]


@pytest.fixture(scope="module")
def keyed_engine(engine_pool: EnginePool) -> Iterator[ServerProcess]:
    """Seed 1 behind ``--api-key API_KEY``."""
    for procs in _module_engines(engine_pool, "keyed_engine"):
        yield procs[0]


@pytest.fixture(scope="module")
def doomed_engines(engine_pool: EnginePool) -> Iterator[list[ServerProcess]]:
    """Two engines a test kills (SIGKILL) and terminates (SIGTERM)."""
    yield from _module_engines(engine_pool, "doomed_engines")


@pytest.fixture(scope="module")
def receivers(engine_pool: EnginePool) -> Iterator[list[ServerProcess]]:
    """Two engines that join a weight-update group with the test as rank 0 (the second one is killed)."""
    yield from _module_engines(engine_pool, "receivers")


class Support:
    """Helpers for tests against a real CPU engine (the ``support`` fixture)."""

    @staticmethod
    def reference_greedy(model: CausalLM, text: str, max_new_tokens: int) -> tuple[list[int], list[float]]:
        """What the engine must produce for a greedy request with ignore_eos (same model, same seed)."""
        from engines.models import sample_token

        prompt = model.tokenizer.encode(text)
        cache = model.new_kv_cache(1)
        slot = cache.acquire()
        logits = model.prefill(cache, slot, prompt)
        ids: list[int] = []
        logprobs: list[float] = []
        for i in range(max_new_tokens):
            token, logprob = sample_token(logits, temperature=0.0)
            ids.append(token)
            logprobs.append(logprob)
            if i + 1 < max_new_tokens:
                logits = model.decode_step(cache, slot, token, len(prompt) + i)
        return ids, logprobs

    @staticmethod
    def teacher_forced_logprobs(model: CausalLM, text: str, output_ids: list[int], temperature: float) -> list[float]:
        """The trainer's view of the engine's output_token_logprobs (full forward, temperature-scaled)."""
        import torch

        ids = torch.tensor([model.tokenizer.encode(text) + output_ids])
        with torch.no_grad():
            lps = model.token_logprobs(ids, temperature=temperature)[0]
        return [float(x) for x in lps[-len(output_ids) :]]

    @staticmethod
    async def raw(
        url: str,
        method: str,
        path: str,
        *,
        body: Any = None,
        data: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, str]:
        """One request without the client (to see status and body exactly as sent)."""
        import aiohttp

        payload = data if data is not None else (None if body is None else json.dumps(body).encode())
        async with (
            aiohttp.ClientSession() as session,
            session.request(method, url + path, data=payload, headers=headers) as resp,
        ):
            return resp.status, await resp.text()

    @staticmethod
    async def wait_for(probe: Callable[[], Awaitable[bool]], *, timeout: float = 10.0, what: str = "condition") -> None:
        deadline = time.monotonic() + timeout
        while not await probe():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}")
            await asyncio.sleep(0.005)

    @staticmethod
    async def internal_state(client: EngineClient) -> dict[str, Any]:
        return dict((await client.server_info()).internal_states[0])


@pytest.fixture(scope="session")
def support() -> type[Support]:
    return Support
