"""The engines' API key: one per run, so that no other local user can pause, release or reload its engines.

``lifecycle run`` keeps the key in ``RUN_DIR/engine-api-key`` (mode 0600: the owner's only; ``--resume``
reuses it), hands it to every engine it launches by environment variable -- never on the command line,
which any user can read in ``/proc/PID/cmdline`` -- and sends it on every request (``EngineClient``), the
router's to its workers included. Engines started outside the job take the key given in the same
variable, as SGLang's servers take ``--api-key``.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from lifecycle.decide.errors import ConfigError

API_KEY_ENV = "LIFECYCLE_ENGINE_API_KEY"  # the CPU engine's key; the key of external engines, for the driver
KEY_FILE = "engine-api-key"
MAX_KEY_BYTES = 4096


def given_api_key() -> str | None:
    """The key of engines started outside the job (``$LIFECYCLE_ENGINE_API_KEY``), if one is given: checked here,
    where it is read, as a key the HTTP header can carry (a newline in it was aiohttp's header-injection
    traceback at the first request), naming the variable."""
    key = os.environ.get(API_KEY_ENV) or None
    if key is not None and not _valid(key):
        raise ConfigError(
            f"${API_KEY_ENV}",
            f"<a secret of {len(key)} characters, not shown>",
            f"is not one key of 1..{MAX_KEY_BYTES} characters without spaces or newlines (it is sent as an "
            "HTTP header)",
            f'set {API_KEY_ENV} to the engines\' key alone (e.g. export {API_KEY_ENV}="$(cat KEYFILE)"), or unset it',
        )
    return key


def _valid(text: str) -> bool:
    return 0 < len(text) <= MAX_KEY_BYTES and not any(c.isspace() for c in text)


def run_api_key(run_dir: Path) -> str:
    """The run's key: ``run_dir/engine-api-key`` if it holds one readable by its owner alone, else a new one
    written there with mode 0600 from the start (never a moment readable by others)."""
    path = run_dir / KEY_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as f:
            if os.fstat(f.fileno()).st_mode & 0o077 == 0:
                key = f.read(MAX_KEY_BYTES + 1).decode("utf-8", "replace").strip()
                if _valid(key):
                    return key
    except OSError:
        pass  # none yet (or not a file we can use): write a new one
    key = secrets.token_urlsafe(32)
    tmp = path.with_name(f".{KEY_FILE}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    os.replace(tmp, path)
    return key


def key_env(api_key: str | None) -> dict[str, str]:
    """The environment entries that hand ``api_key`` to a launched CPU engine (none without a key)."""
    return {API_KEY_ENV: api_key} if api_key else {}
