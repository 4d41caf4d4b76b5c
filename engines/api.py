"""What an engine slot asks of its server, in the lifecycle's words, once per backend.

The slot (:class:`engines.engine.Engine`) carries out the core's commands -- wait until serving, probe, load
a checkpoint and publish its version, join/receive/leave a broadcast, pause, resume, release and resume
memory -- and reports outcomes. *How* each is spelled on the wire is the backend's: SGLang's API (real
SGLang, and the project's CPU engine, which speaks it) here, vLLM's in :mod:`engines.vllm.api`. A launcher
names the API of the server it starts (``Launcher.api``, from its backend's row in :mod:`engines.backends`).

Both backends bracket a weight update in the server's own session, so a version is published only by a
completed update: SGLang ``/begin_weight_update`` ... ``/end_weight_update``, vLLM ``/start_weight_update`` ...
``/finish_weight_update``. A failed transfer closes (or abandons) the session and leaves the old weights.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

from engines.apikey import API_KEY_ENV
from engines.client import EngineClient
from engines.errors import EngineError, EngineHTTPError, EngineMismatch, EngineProtocolError
from engines.http import HTTPTransport
from lifecycle.decide.backends import BackendName, capabilities
from lifecycle.decide.config import KEEPING_PAUSE_MODES

Bucket = Sequence[tuple[str, str, Sequence[int]]]  # one broadcast bucket: (name, dtype, shape) of each tensor
GROUP_BACKEND = "gloo"  # the weight-update group's transport on these CPUs
GROUP_NAME = "weight_update_group"  # SGLang's default group name: the stem of every generation's name


def group_name(generation: int) -> str:
    """The rendezvous of one generation of the weight-update group: a fresh group per membership, never grown in
    place (NCCL cannot add ranks to a communicator), and a bucket of another generation is refused by name."""
    return f"{GROUP_NAME}.g{generation}"


class ServerFacts(NamedTuple):
    """What a server says it is, read from it: which process answers (``identity``: a new value is a new process
    behind the same address; None where the server does not tell), the weight version it serves, its model."""

    identity: str | None
    weight_version: str | None
    model: str | None


class ServerAPI(Protocol):
    """One server's API (raises :class:`~engines.errors.EngineError` on every failure). ``client`` is its HTTP
    client: the rollout's routing calls ``client.generate_batch`` with SGLang's arguments on either backend."""

    backend: BackendName
    client: Any

    async def ready(self, timeout: float) -> None:
        """One start-up probe: returns once the server generates and can take an update."""

    async def probe(self, endpoint: str, timeout: float) -> None:
        """One liveness probe (``health_generate``: a real 1-token generation; ``health``: liveness only)."""

    async def load(self, path: str, version: str, timeout: float | None) -> str | None:
        """Load a checkpoint directory in one update session publishing ``version``; the version it reports."""

    async def served_version(self, timeout: float) -> str | None:
        """The weight version the server says it serves now (what a load or a broadcast published)."""

    async def identify(self, timeout: float) -> ServerFacts:
        """What the server is (its process, served version, model); raises :class:`EngineMismatch` naming what
        was expected and found when it is not a server of this backend the lifecycle can drive."""

    async def join_group(
        self, address: str, port: int, rank: int, world_size: int, timeout: float, group: str = GROUP_NAME
    ) -> None:
        """Join the trainer's weight-update group ``group`` (its generation's name) at ``rank`` (blocks until every
        member joined)."""

    async def leave_group(self, timeout: float, group: str = GROUP_NAME) -> None:
        """Leave the group (raises if the server cannot be told)."""

    async def receive(
        self, buckets: Sequence[Bucket], version: str, timeout: float, group: str = GROUP_NAME
    ) -> str | None:
        """Receive every bucket of the trainer's broadcast in one session publishing ``version``; every bucket
        names ``group``, and a server in another generation's group refuses it."""

    async def pause(self, mode: str | None = None) -> None:
        """Stop generating, keeping what runs (resumed by :meth:`resume`): in ``mode`` (--pause-generation-mode),
        or the backend's first mode that keeps requests."""

    async def resume(self) -> None: ...

    async def hand_back(self, timeout: float) -> None:
        """End every request the paused server holds, so that each caller gets its answer back now (finish_reason
        abort, the tokens so far) and the stream re-sends it elsewhere; the server stays paused: it generates
        nothing more on the weights it holds (a failed or reverted update's)."""

    async def release(self, tags: Sequence[str]) -> None:
        """Release the memory tags (``weights``, ``kv_cache``) in one request."""

    async def resume_memory(self, tags: Sequence[str]) -> None:
        """Bring the memory tags back."""

    async def close(self) -> None: ...


class SGLangAPI:
    """SGLang's HTTP API (``/health_generate``, ``/update_weights_from_disk``, ``/model_info``, ...)."""

    backend: BackendName = "sglang"

    def __init__(self, url: str, *, engine_id: str, api_key: str | None = None, timeout: float = 30.0) -> None:
        self.client = EngineClient(url, engine_id=engine_id, api_key=api_key, timeout=timeout)
        # what a pause asks unless told: SGLang's "retract" puts running requests back in the queue, resumed by
        # continue (a retracted request is re-prefilled: its tokens after an update see the new weights only)
        self.pause_mode = keeping_pause(self.backend)

    async def ready(self, timeout: float) -> None:
        await self.client.health_generate(timeout=timeout)
        await self.client.flush_cache()  # the queue is empty: an offload or an update may follow

    async def probe(self, endpoint: str, timeout: float) -> None:
        call = self.client.health if endpoint == "health" else self.client.health_generate
        await call(timeout=timeout)

    async def load(self, path: str, version: str, timeout: float | None) -> str | None:
        async with self._session(timeout):
            await self.client.update_weights_from_disk(path, weight_version=version, timeout=timeout)
        return (await self.client.model_info()).weight_version

    async def served_version(self, timeout: float) -> str | None:
        return (await self.client.model_info(timeout=timeout)).weight_version

    async def identify(self, timeout: float) -> ServerFacts:
        """``/model_info`` (its model and version) and ``/server_info``'s ``startup_time`` (its process)."""
        expected = "an SGLang-API server (--rollout-backend sglang: SGLang, or the project's CPU engine)"
        try:
            info = await self.client.model_info(timeout=timeout)
            server = await self.client.server_info(timeout=timeout)
        except (EngineHTTPError, EngineProtocolError) as exc:
            raise await mismatch(self.client, exc, expected, timeout) from exc
        start = server.startup_time
        return ServerFacts(None if start is None else f"startup_time {start!r}", info.weight_version, info.model_path)

    async def join_group(
        self, address: str, port: int, rank: int, world_size: int, timeout: float, group: str = GROUP_NAME
    ) -> None:
        await self.client.init_weights_update_group(
            address, port, rank, world_size, group_name=group, backend=GROUP_BACKEND, timeout=timeout
        )

    async def leave_group(self, timeout: float, group: str = GROUP_NAME) -> None:
        await self.client.destroy_weights_update_group(group_name=group, timeout=timeout)

    async def receive(
        self, buckets: Sequence[Bucket], version: str, timeout: float, group: str = GROUP_NAME
    ) -> str | None:
        async with self._session(timeout):
            for k, bucket in enumerate(buckets):
                await self.client.update_weights_from_distributed(
                    [n for n, _, _ in bucket],
                    [d for _, d, _ in bucket],
                    [list(shape) for _, _, shape in bucket],
                    group_name=group,
                    weight_version=version if k == len(buckets) - 1 else None,
                    timeout=timeout,
                )
        return (await self.client.model_info()).weight_version

    @contextlib.asynccontextmanager
    async def _session(self, timeout: float | None) -> Any:
        """``/begin_weight_update`` ... ``/end_weight_update``; ended even when the transfer failed (a failed
        SGLang update changes nothing, and a session left open would refuse the next one)."""
        await self.client.begin_weight_update(timeout=timeout)
        try:
            yield
        except BaseException:
            with contextlib.suppress(EngineError):
                await self.client.end_weight_update(timeout=timeout)
            raise
        await self.client.end_weight_update(timeout=timeout)

    async def pause(self, mode: str | None = None) -> None:
        await self.client.pause_generation(mode=mode or self.pause_mode)  # type: ignore[arg-type]

    async def resume(self) -> None:
        await self.client.continue_generation()

    async def hand_back(self, timeout: float) -> None:
        """``/abort_request {"abort_all": true}``, and no ``/continue_generation``. A paused scheduler still takes
        it: every queued request ends at once with finish_reason abort -- after ``retract`` that is every kept one
        (the CPU engine ends ``in_place`` ones at once too). Real SGLang only marks a request frozen ``in_place``
        to end at its next step, which a paused scheduler does not take: its caller's call ends when the stream
        cancels it (a disconnect is an abort in SGLang)."""
        await self.client.abort_request(
            abort_all=True, abort_message="handed back: the weight update failed", timeout=timeout
        )

    async def release(self, tags: Sequence[str]) -> None:
        await self.client.release_memory_occupation(list(tags))  # SGLang's tags: a list, every tag in one call

    async def resume_memory(self, tags: Sequence[str]) -> None:
        await self.client.resume_memory_occupation(list(tags))

    async def close(self) -> None:
        await self.client.close()


def keeping_pause(backend: BackendName) -> str:
    """The backend's first pause mode that keeps the requests in flight (the order of its declared modes)."""
    return next(m for m in capabilities(backend, "cpu").pause_modes if m in KEEPING_PAUSE_MODES)


class APIFactory(Protocol):
    def __call__(self, url: str, *, engine_id: str, api_key: str | None, timeout: float) -> ServerAPI: ...


def sglang_api(url: str, *, engine_id: str, api_key: str | None, timeout: float) -> ServerAPI:
    return SGLangAPI(url, engine_id=engine_id, api_key=api_key, timeout=timeout)


KEY_FIX = f"set {API_KEY_ENV} to the key the server was started with (its --api-key)"


# answers that say what a server is (a refused key, no such endpoint): asking again changes nothing
NOT_THIS_SERVER = frozenset({401, 403, 404, 405})


async def mismatch(client: HTTPTransport, exc: EngineError, expected: str, timeout: float) -> EngineError:
    """Why a server is not the ``expected`` one, read from how it failed: a refused key, a missing endpoint (and
    which backend does answer there), or an answer in another shape. Any other failure (a 503 while it starts,
    a timeout) says nothing about what it is: ``exc`` itself is returned."""
    if isinstance(exc, EngineHTTPError) and exc.status not in NOT_THIS_SERVER:
        return exc
    endpoint = exc.endpoint or ""
    if isinstance(exc, EngineHTTPError) and exc.status in (401, 403):
        given = "no key was given" if client.api_key is None else "it refused the key given"
        expected = "a server that accepts this job's requests"
        return EngineMismatch(client.engine_id, endpoint, expected, f"HTTP {exc.status} ({given})", KEY_FIX)
    if isinstance(exc, EngineHTTPError):
        found = f"HTTP {exc.status} at {endpoint}"
    else:
        found = f"an answer at {endpoint} that is not this backend's ({exc.detail})"
    other = await which_backend(client, timeout)
    if other is not None:
        found += f": it is {other[0]}"
        return EngineMismatch(client.engine_id, endpoint, expected, found, other[1])
    return EngineMismatch(
        client.engine_id,
        endpoint,
        expected,
        found,
        "point --rollout-external-engine-addrs at servers of --rollout-backend (each HOST:PORT a server's own "
        "address, not a proxy or another service)",
    )


async def which_backend(client: HTTPTransport, timeout: float) -> tuple[str, str] | None:
    """Which backend's API answers at the client's address, if one does: (what it is, the fix)."""
    with contextlib.suppress(EngineError, ValueError):
        data = client._json("/model_info", await client._call("GET", "/model_info", timeout=timeout))
        if isinstance(data, dict) and isinstance(data.get("model_path"), str):
            return "an SGLang-API server (its /model_info answers)", "use --rollout-backend sglang for it"
    with contextlib.suppress(EngineError, ValueError):
        data = client._json("/version", await client._call("GET", "/version", timeout=timeout))
        if isinstance(data, dict) and isinstance(data.get("version"), str):
            return (
                f"a vLLM server (version {data['version']})",
                "use --rollout-backend vllm for it, started with VLLM_SERVER_DEV_MODE=1 and "
                '--weight-transfer-config \'{"backend": "lifecycle"}\'',
            )
    return None
