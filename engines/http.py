"""The HTTP transport shared by every engine client (SGLang's and vLLM's).

One place decides how a request is bounded and how a failure is reported, so that the engine slot
and the rollout see the same typed :class:`~engines.errors.EngineError` whichever server answers:
:class:`EngineHTTPError` (non-2xx; status and body), :class:`EngineTimeout`,
:class:`EngineUnreachable` (refused, reset, dropped) and :class:`EngineProtocolError` (a 2xx body
that does not match the contract). The API-specific clients only add endpoints on top.

An ``aiohttp`` session belongs to one event loop: use one client per loop, and close it
(``async with client``, or ``await client.close()``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from types import TracebackType
from typing import Any, Self, TypeVar

import aiohttp
from pydantic import BaseModel, ValidationError
from yarl import URL  # aiohttp's own URL type (a dependency of aiohttp)

from engines.errors import EngineError, EngineHTTPError, EngineProtocolError, EngineTimeout, EngineUnreachable

M = TypeVar("M", bound=BaseModel)
_CACHED = 64  # per transport: the paths' URLs and the bounds' timeouts kept (a client calls a handful of each)


def body_of(request: BaseModel) -> dict[str, Any]:
    """Only the fields the caller set: the server's own defaults apply to the rest."""
    return request.model_dump(mode="json", exclude_unset=True)


def validation_message(model: type[BaseModel], exc: ValidationError) -> str:
    """The first problem, as ``does not match MODEL: MSG at FIELD.PATH`` (the drift tests read the field)."""
    first = exc.errors()[0]
    return f"answer does not match {model.__name__}: {first['msg']} at {'.'.join(str(p) for p in first['loc'])}"


class HTTPTransport:
    """Bounded JSON requests to one engine at ``base_url`` (``http://host:port``), with typed failures."""

    # False: one connection per request. vLLM's server (uvicorn) closes a kept-alive connection after a 500
    # answer without saying so, and the next request sent on it fails as "connection reset" -- an engine
    # reported unreachable that is alive. (aiohttp has already pooled the connection again when the body
    # has been read, so it cannot be dropped after the 500 alone.)
    keep_alive = True

    def __init__(self, base_url: str, *, engine_id: str, api_key: str | None = None, timeout: float = 30.0) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"engine {engine_id}: base_url must start with http:// or https://, got {base_url!r}")
        if not timeout > 0:
            raise ValueError(f"engine {engine_id}: timeout must be > 0 seconds, got {timeout!r}")
        self.base_url = base_url.rstrip("/")
        self.engine_id = engine_id
        self.api_key = api_key
        self.timeout = timeout
        self._session: aiohttp.ClientSession | None = None
        # per path and per bound, built once: yarl's own parse cache holds a few hundred URLs, and a fleet of 1,024
        # engines calls ~5,000 distinct ones, so each request would parse its URL again (~15 us)
        self._urls: dict[str, URL] = {}
        self._timeouts: dict[float, aiohttp.ClientTimeout] = {}

    # -- session ----------------------------------------------------------------------------------
    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the HTTP session (idempotent); a later call opens a new one."""
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    @property
    def closed(self) -> bool:
        return self._session is None or self._session.closed

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else None
            connector = None if self.keep_alive else aiohttp.TCPConnector(force_close=True)
            self._session = aiohttp.ClientSession(headers=headers, connector=connector)
        return self._session

    # -- transport ----------------------------------------------------------------------------------
    async def _call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        send_body: bool = False,
        params: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> str:
        """One request; the 2xx response text, or a typed error."""
        limit = self.timeout if timeout is None else timeout
        if not limit > 0:
            raise ValueError(f"engine {self.engine_id} {path}: timeout must be > 0 seconds, got {limit!r}")
        session = self._get_session()
        url = self._urls.get(path)
        if url is None:
            url = URL(self.base_url + path)
            if len(self._urls) < _CACHED:
                self._urls[path] = url
        bound = self._timeouts.get(limit)
        if bound is None:
            bound = aiohttp.ClientTimeout(total=limit)
            if len(self._timeouts) < _CACHED:
                self._timeouts[limit] = bound
        kwargs: dict[str, Any] = {"timeout": bound}
        if send_body:
            kwargs["data"] = json.dumps(body).encode()
            kwargs["headers"] = {"Content-Type": "application/json"}
        if params:
            kwargs["params"] = dict(params)
        try:
            async with session.request(method, url, **kwargs) as resp:
                text = await resp.text(errors="replace")
                status = resp.status
        except TimeoutError:
            raise EngineTimeout(self.engine_id, path, limit) from None
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as exc:
            raise EngineUnreachable(self.engine_id, path, f"{type(exc).__name__}: {exc}") from None
        except aiohttp.ClientError as exc:
            raise EngineError(self.engine_id, path, f"{type(exc).__name__}: {exc}") from None
        if not 200 <= status < 300:
            raise EngineHTTPError(self.engine_id, path, status, text)
        return text

    def _json(self, path: str, text: str) -> Any:
        try:
            return json.loads(text)
        except ValueError:
            raise EngineProtocolError(self.engine_id, path, f"expected a JSON body, got {text[:200]!r}") from None

    def _parse(self, path: str, model: type[M], data: Any) -> M:
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            raise EngineProtocolError(self.engine_id, path, validation_message(model, exc)) from None

    async def _post_model(self, path: str, request: BaseModel, model: type[M], timeout: float | None) -> M:
        text = await self._call("POST", path, body=body_of(request), send_body=True, timeout=timeout)
        return self._parse(path, model, self._json(path, text))
