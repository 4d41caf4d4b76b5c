"""A run's engines require its API key (issue 27, cause 8): no other local user can pause, release or reload them.

The key is made per run (``RUN_DIR/engine-api-key``, mode 0600, reused by ``--resume``), handed to each launched
engine by environment (not on its command line), sent on every request the run makes, and never written to the
event log. ``test_catches_engines_without_a_key`` runs the same witness with the old wiring (no key) and shows
it fails.
"""

from __future__ import annotations

import asyncio
import io
import json
import stat
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from engines.apikey import KEY_FILE, run_api_key
from engines.launcher import ExternalLauncher

KEYED_ENGINE_KEY = "s3cret-key"  # conftest.API_KEY: the keyed_engine fixture's


def test_the_run_key_is_0600_made_once_and_reused(tmp_path: Path) -> None:
    key = run_api_key(tmp_path)
    path = tmp_path / KEY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(key) >= 32
    assert run_api_key(tmp_path) == key  # --resume: the same key
    path.chmod(0o644)  # readable by others: no longer a secret, a new one replaces it
    fresh = run_api_key(tmp_path)
    assert fresh != key and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == [KEY_FILE]  # no temporary file left behind


def test_external_engines_take_the_key_their_owner_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    from engines.engine import Engine

    monkeypatch.setenv("LIFECYCLE_ENGINE_API_KEY", "owner-key")
    assert Engine("engine-0", ExternalLauncher("engine-0", "http://127.0.0.1:1")).api_key == "owner-key"
    monkeypatch.delenv("LIFECYCLE_ENGINE_API_KEY")
    assert Engine("engine-0", ExternalLauncher("engine-0", "http://127.0.0.1:1")).api_key is None


def _post(url: str, path: str, key: str | None = None) -> int:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(url + path, data=b"{}", headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def _witnessed_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real (rollout-only, one local engine) run; as each engine comes up, another user's unauthenticated
    /pause_generation (then /continue_generation, so the old behaviour does not wedge the run) is tried."""
    pytest.importorskip("ray")
    from engines.engine import Engine
    from lifecycle.decide.config import LifecycleConfig
    from trainer.app.loop import RunOptions, run_loop

    seen: list[tuple[int, int, str]] = []
    launch = Engine.launch

    async def launch_and_try(self: Engine) -> Any:
        outcome = await launch(self)
        if self.url is not None:
            paused = await asyncio.to_thread(_post, self.url, "/pause_generation")
            if paused == 200:
                await asyncio.to_thread(_post, self.url, "/continue_generation")
            pid = await self.launcher.server_pid()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace") if pid else ""
            seen.append((paused, await asyncio.to_thread(_post, self.url, "/flush_cache", self.api_key), cmdline))
        return outcome

    monkeypatch.setattr(Engine, "launch", launch_and_try)
    config = LifecycleConfig.from_mapping({"debug_rollout_only": True, "rollout_num_gpus": 1})
    run_dir = tmp_path / "run"
    opts = RunOptions(steps=2, seed=0, run_dir=run_dir, launcher="local", quiet=True)
    result = asyncio.run(run_loop(config, opts, io.StringIO()))
    assert len(result.rewards) == 2, "the run works with its key"
    assert seen, "no engine was launched"
    for paused, flushed, _ in seen:
        assert paused == 401, f"an unauthenticated /pause_generation got {paused}"
        assert flushed == 200, "the run's own key is accepted"
    key_file = run_dir / KEY_FILE
    key = key_file.read_text().strip()
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    for _, _, cmdline in seen:
        assert key not in cmdline, "the key is on the engine's command line (visible to every user)"
    for name in ("events.jsonl", "metrics.jsonl", "run.json"):
        if (run_dir / name).exists():
            assert key not in (run_dir / name).read_text(), f"the key is written to {name}"
    json.loads((run_dir / "run.json").read_text())


@pytest.mark.usefixtures("ray_cluster")
def test_a_runs_engines_refuse_a_request_without_its_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _witnessed_run(tmp_path, monkeypatch)


@pytest.mark.usefixtures("ray_cluster")
def test_catches_engines_without_a_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import trainer.app.job

    monkeypatch.setattr(trainer.app.job, "run_api_key", lambda run_dir: None)  # the old wiring: no key at all
    with pytest.raises(AssertionError, match="unauthenticated /pause_generation got 200"):
        _witnessed_run(tmp_path, monkeypatch)


async def _through_router(url: str, api_key: str | None) -> str:
    """One /generate through a real SMG gateway to ``url``, registered with ``api_key``: the answer's text,
    or the error."""
    from engines.errors import EngineError
    from engines.router import Router

    router = Router("router-key", startup_timeout=60.0)
    try:
        await router.start()
        await router.add(url, api_key=api_key)
        assert router.client is not None
        try:
            answer = await router.client.generate("Hi", sampling_params={"max_new_tokens": 2})
        except EngineError as exc:
            return f"error: {exc}"
        return f"text: {answer.text}"
    finally:
        await router.close()


def test_the_router_sends_each_worker_its_key(keyed_engine: Any) -> None:
    from engines.router import router_available

    if not router_available():
        pytest.skip("smg (the gateway) is not installed: pip install 'rl-lifecycle[router]'")
    assert asyncio.run(_through_router(keyed_engine.url, KEYED_ENGINE_KEY)).startswith("text: ")
    # the old registration (no key): the keyed worker refuses what the router forwards
    assert asyncio.run(_through_router(keyed_engine.url, None)).startswith("error: ")
