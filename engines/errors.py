"""Typed errors of the engines layer.

A caller (engine slot, health monitor, rollout) must tell "the engine said no" (HTTP status and
body), "the engine did not answer in time" and "the engine is gone" apart without parsing
strings, because each one leads to a different lifecycle event. Every error names the engine and
the endpoint.
"""

from __future__ import annotations

from lifecycle.decide.errors import LifecycleError


class EngineError(LifecycleError):
    """Anything that went wrong talking to (or starting) one engine."""

    def __init__(self, engine_id: str, endpoint: str | None, message: str) -> None:
        self.engine_id = engine_id
        self.endpoint = endpoint
        self.detail = message
        where = f"engine {engine_id}" + (f" {endpoint}" if endpoint else "")
        super().__init__(f"{where}: {message}")


class EngineHTTPError(EngineError):
    """The engine answered with a non-2xx status; ``body`` is the raw response text."""

    def __init__(self, engine_id: str, endpoint: str, status: int, body: str) -> None:
        self.status = status
        self.body = body
        shown = body if len(body) <= 500 else body[:500] + "..."
        super().__init__(engine_id, endpoint, f"HTTP {status}: {shown or '(empty body)'}")


class EngineTimeout(EngineError, TimeoutError):
    """No complete answer within ``timeout`` seconds (the engine may be alive but hung)."""

    def __init__(self, engine_id: str, endpoint: str | None, timeout: float, message: str | None = None) -> None:
        self.timeout = timeout
        super().__init__(engine_id, endpoint, message or f"no answer within {timeout:g}s")


class EngineUnreachable(EngineError, ConnectionError):
    """Connection refused, reset or dropped: nothing (or no longer anything) listens there."""


class EngineProtocolError(EngineError):
    """A 2xx answer whose body does not match the contract (wrong server, or a contract drift)."""


class EngineMismatch(EngineError):
    """The server at an address is not what the job was told it is (another backend, not in the mode the lifecycle
    needs, a key it refuses, the same server listed twice): what was expected, what was found, and the fix."""

    def __init__(self, engine_id: str, endpoint: str | None, expected: str, found: str, fix: str) -> None:
        self.expected, self.found, self.fix = expected, found, fix
        super().__init__(engine_id, endpoint, f"expected {expected}; found {found}. Fix: {fix}")


class EngineStartError(EngineError):
    """The server process exited, or never became ready; ``output`` is the tail of what it printed."""

    def __init__(self, engine_id: str, message: str, *, returncode: int | None = None, output: str = "") -> None:
        self.returncode = returncode
        self.output = output
        tail = f"\n--- last output ---\n{output}" if output else ""
        EngineError.__init__(self, engine_id, "start", message + tail)  # not super(): EngineStartTimeout's MRO


class EngineStartTimeout(EngineStartError, EngineTimeout):
    """The server process is running but did not become ready in time (it has been killed)."""

    def __init__(self, engine_id: str, timeout: float, *, output: str = "") -> None:
        self.timeout = timeout
        EngineStartError.__init__(
            self, engine_id, f"not ready within {timeout:g}s (process killed)", returncode=None, output=output
        )
