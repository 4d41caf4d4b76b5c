"""Joining a Ray cluster someone else started (``--ray-address``): one check before ``ray.init``, one way in.

Light on purpose (Ray is imported only by :func:`use_cluster_token` and only where Ray is already being
started), so ``lifecycle run`` can check an address before its heavy imports:

- :func:`check_gcs` asks the address whether it speaks gRPC (a Ray head's GCS, or a Ray Client server):
  ``ray.init`` against a server that accepts a connection but is not Ray waited out its own retries for
  minutes (240 s seen); the gRPC handshake is answered in milliseconds by Ray and never by anything else.
- :func:`use_cluster_token`: Ray 2.60's ``ray start --head`` turns token authentication on and writes the
  token to ``~/.ray/auth_token``, but ``ray.init(address=...)`` with an explicit address sends it only when
  ``RAY_AUTH_MODE=token`` is set (an address found by ``auto`` turns it on by itself). A driver given an
  address on a machine where a token is available sends it, as ``auto`` would; ``RAY_AUTH_MODE`` set by the
  user is left as it is.
- :func:`settings_follow_environment`: a local cluster's GCS and its driver agree on ``RAY_AUTH_MODE``;
  :func:`own_cluster_auth` states Ray's default for a cluster the driver starts.
- :func:`connection_error`: any failure of ``ray.init`` as one :class:`ConfigError` naming the flag and the fix.
"""

from __future__ import annotations

import os
import socket

from lifecycle.decide.errors import ConfigError

FLAG = "--ray-address"
PROBE_TIMEOUT = 3.0  # seconds: a GCS answers the handshake in milliseconds, on any network a driver would use
AUTH_MODE_ENV = "RAY_AUTH_MODE"
TOKEN_ENVS = ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
# an HTTP/2 connection preface and an empty SETTINGS frame: what every gRPC client sends first
_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
_SETTINGS = 4  # the frame type a gRPC server answers the preface with
_AUTH_REFUSED = ("InvalidAuthToken", "AuthenticationError", "Unauthenticated")  # how Ray words a token refusal
HEAD_FIX = (
    "start one with `ray start --head --port PORT` on that machine and pass --ray-address HOST:PORT (the GCS "
    "port it prints), ray://HOST:10001 for a Ray Client server, or omit --ray-address to start a local instance"
)


def host_port(address: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``ray://HOST:PORT`` (already checked by the flag's parser) as a socket address."""
    rest = address[len("ray://") :] if address.startswith("ray://") else address
    host, _, port = rest.rpartition(":")
    return host.strip("[]") or "127.0.0.1", int(port)


def check_gcs(address: str, flag: str = FLAG, timeout: float = PROBE_TIMEOUT) -> None:
    """Refuse, within ``timeout`` seconds, an address where no gRPC server (a Ray GCS) answers."""
    if address == "auto":
        return  # Ray finds the cluster of this machine itself (and says so if there is none)
    try:
        host, port = host_port(address)
    except ValueError:
        raise ConfigError(flag, address, "not HOST:PORT", HEAD_FIX) from None
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(_PREFACE)
            head = b""
            while len(head) < 9:  # a frame header: length (3 bytes), type, flags, stream id (4)
                chunk = sock.recv(9 - len(head))
                if not chunk:
                    break
                head += chunk
    except TimeoutError:
        raise ConfigError(
            flag,
            address,
            f"a server there accepted the connection but did not answer Ray's (gRPC) handshake in {timeout:g}s: "
            "it is not a Ray cluster's head",
            HEAD_FIX,
        ) from None
    except OSError as exc:
        raise ConfigError(flag, address, f"no Ray cluster answers there ({exc.strerror or exc})", HEAD_FIX) from None
    if len(head) < 9 or head[3] != _SETTINGS:
        found = "closed the connection" if not head else f"answered {head[:9]!r}"
        raise ConfigError(
            flag,
            address,
            f"the server there {found} instead of Ray's (gRPC) handshake: it is not a Ray cluster's head",
            HEAD_FIX,
        )


def token_available() -> bool:
    """Whether this machine holds a Ray auth token where Ray looks: ``$RAY_AUTH_TOKEN``, the file at
    ``$RAY_AUTH_TOKEN_PATH``, or ``~/.ray/auth_token`` (what ``ray start --head`` writes)."""
    if os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return True
    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or os.path.join(os.path.expanduser("~"), ".ray", "auth_token")
    try:
        return os.path.getsize(path) > 0
    except OSError:
        return False


def use_cluster_token(address: str) -> bool:
    """Send this machine's Ray auth token to the cluster at ``address`` (as ``ray.init`` does for ``auto``), unless
    ``$RAY_AUTH_MODE`` says otherwise; whether token mode is now on. A cluster without authentication accepts a
    driver that sends one."""
    if address == "auto" or os.environ.get(AUTH_MODE_ENV) is not None or not token_available():
        return os.environ.get(AUTH_MODE_ENV, "").lower() == "token"
    os.environ[AUTH_MODE_ENV] = "token"
    _reload_settings()
    return True


def own_cluster_auth() -> None:
    """Before this driver starts a cluster of its own: Ray's default for a new local cluster -- token
    authentication, its token in ``~/.ray/auth_token`` (written if missing) -- stated, unless ``$RAY_AUTH_MODE``
    says otherwise. Left to its default, Ray logs a warning that it chose it at the top of every run."""
    os.environ.setdefault(AUTH_MODE_ENV, "token")
    settings_follow_environment()


def settings_follow_environment() -> None:
    """Before a local cluster starts: make Ray's settings, cached when Ray was imported, agree with
    ``$RAY_AUTH_MODE`` as it is now. The GCS a driver starts reads the variable afresh, the driver sends a token
    only by its cached settings: a variable set after ``import ray`` (by the user's script, or by an earlier
    join in the same process) started a GCS that refused its own driver ("Failed to start GCS ...
    InvalidAuthToken"), and left that GCS running."""
    if os.environ.get(AUTH_MODE_ENV) is not None:
        _reload_settings()


def _reload_settings() -> None:
    try:  # Ray caches its settings when imported: read them again, as Ray's own token set-up does
        from ray._raylet import Config  # type: ignore[attr-defined]  # Ray's own token set-up calls it

        Config.initialize("")
    except (ImportError, AttributeError):
        pass  # a Ray without token authentication: nothing cached to refresh


def check_token(address: str, flag: str = FLAG) -> None:
    """Ask the GCS at ``address`` for its cluster id once, with the token this driver would send: a cluster that
    requires another answers at once (``ray.init`` retried for 20 s, logging each refusal). Ray's own log line of
    the refusal is kept off stderr (the error says it); anything else is left for ``ray.init`` to report."""
    if address == "auto" or address.startswith("ray://"):
        return  # found locally by Ray (with its token); a Ray Client server authenticates in ray.init
    try:
        from ray._raylet import GcsClient  # type: ignore[attr-defined]  # what ray.init asks first
        from ray.exceptions import AuthenticationError
    except ImportError:
        return
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        GcsClient(address=address, cluster_id=None)
    except AuthenticationError as exc:
        raise connection_error(address, exc, flag) from exc
    except Exception:  # not ours to judge: ray.init reports it (as connection_error)
        pass
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def connection_error(address: str, exc: BaseException, flag: str = FLAG) -> ConfigError:
    """``ray.init``'s failure to join ``address`` as one paragraph: why, and what to do."""
    chain: list[str] = []
    cause: BaseException | None = exc
    while cause is not None and len(chain) < 5:
        chain.append(f"{type(cause).__name__}: {cause}")
        cause = cause.__cause__ or cause.__context__
    text = " ".join(chain)
    if any(word in text for word in _AUTH_REFUSED):
        mode = os.environ.get(AUTH_MODE_ENV)
        return ConfigError(
            flag,
            address,
            "the Ray cluster there requires token authentication, and "
            + (
                "the token this driver sent is not the cluster's"
                if mode == "token" and token_available()
                else f"this driver has no token to send ({AUTH_MODE_ENV}={mode or 'unset'})"
            ),
            "give this driver the head's token: copy the head's ~/.ray/auth_token to this machine's ~/.ray/auth_token, "
            "or set RAY_AUTH_TOKEN_PATH to a copy of it (or RAY_AUTH_TOKEN to the token); or start the head with "
            f"{AUTH_MODE_ENV}=disabled (a private network only)",
        )
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return ConfigError(flag, address, f"Ray could not join the cluster there ({first[:300]})", HEAD_FIX)
