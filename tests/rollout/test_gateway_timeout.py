"""A hung engine behind the real SMG gateway is named by SMG's own answer, not found by a probe afterwards.

SMG bounds every forwarded request (``--request-timeout-secs``) and answers 504 ``call_upstream_timeout`` naming
the worker's URL. A gateway client that gives up at the same instant (its timeout equal to SMG's) gets no answer at
all: the failure names no engine, the routing has to probe every member to find the hung one, and until then the
hung engine gets the next round of requests too. So a gateway client waits a margin beyond SMG's bound
(``engines.router.GATEWAY_MARGIN``). Measured here: client 4 s vs SMG 4 s -> ``EngineTimeout``, no upstream;
client 8 s -> SMG's 504 after 4.0 s, naming the worker.
"""

from __future__ import annotations

import asyncio
import os
import signal
from types import SimpleNamespace
from typing import Any

import pytest

from engines.process import ServerProcess, torch_engine_command
from lifecycle.decide.core import Outcome
from rollout.routing import GenRequest, RouterRouting

pytest.importorskip("smg")
BOUND = 3.0  # SMG's request bound in these tests (seconds)


def _stalled_reasons(tmp_path: Any) -> list[tuple[str, str]]:
    """Route one request through SMG to a CPU engine stalled by SIGSTOP; what the routing reported, per engine."""
    reported: list[tuple[str, str]] = []

    async def on_unhealthy(engine_id: str, reason: str, epoch: int | None = None) -> None:
        reported.append((engine_id, reason))

    async def died(reason: str) -> None:
        raise AssertionError(f"the gateway died: {reason}")

    async def probe_stalled(timeout: float) -> Outcome:
        return Outcome("probe_failed", reason="no answer to the probe (stalled)")

    with ServerProcess(torch_engine_command(seed=0)) as server:
        url = server.url
        engine = SimpleNamespace(
            id="engine-0", url=url, server=None, weight_version="default", api_key=None, epoch=1, probe=probe_stalled
        )
        routing = RouterRouting("router-rollout", on_death=died, log_dir=tmp_path, request_timeout=BOUND)

        async def run() -> None:
            try:
                assert (await routing.publish(engine)).name == "done"  # type: ignore[arg-type]
                os.killpg(server.pid, signal.SIGSTOP)
                try:
                    request = GenRequest(0, "ab:", {"max_new_tokens": 4})
                    answers = await routing.generate([request], on_unhealthy, logprobs=False, max_tries=1)
                    assert answers == {}
                finally:
                    os.killpg(server.pid, signal.SIGCONT)
            finally:
                await routing.close()

        asyncio.run(asyncio.wait_for(run(), 60.0))
    return reported


def test_smgs_own_timeout_names_the_hung_engine(tmp_path: Any) -> None:
    reported = _stalled_reasons(tmp_path)
    assert [engine for engine, _ in reported] == ["engine-0"]
    reason = reported[0][1]
    assert reason.startswith("generate through the router failed: ") and "call_upstream_timeout" in reason, reason


def test_catches_a_gateway_client_that_gives_up_with_smg(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """No margin: the client's timeout fires with SMG's, the failure names no engine, and only a probe of every
    member afterwards finds the hung one."""
    monkeypatch.setattr("engines.router.GATEWAY_MARGIN", 0.0)
    reported = _stalled_reasons(tmp_path)
    assert [engine for engine, _ in reported] == ["engine-0"]
    assert "call_upstream_timeout" not in reported[0][1] and "); no answer to the probe" in reported[0][1]
