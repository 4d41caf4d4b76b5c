"""Kept engines (issue 31, the engines' half): a detached engine actor outlives the handle that launched it, a new
handle adopts it by name only if it is the process the ledger names (engine, generation, server pid), and an
engine whose driver never renews its lease kills its server and exits. The ledger is rewritten whole, and a
ledger that cannot be read is one clear error naming the file and the fix."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path

import pytest

from engines.actor import Keep, RayLauncher
from engines.errors import EngineStartError
from engines.launcher import Keepable, launcher_factory
from engines.ledger import LEDGER, EngineLedger, Kept, LedgerError
from engines.process import torch_engine_command
from tests.helpers import alive

pytestmark = pytest.mark.usefixtures("ray_cluster")


def _launcher(keep: Keep, engine_id: str = "engine-0") -> RayLauncher:
    return RayLauncher(engine_id, lambda: torch_engine_command(seed=0), startup_timeout=90, keep=keep)


def test_a_kept_engine_outlives_its_launcher_and_is_adopted_only_as_the_ledgers_process() -> None:
    keep = Keep(f"job-{uuid.uuid4().hex[:8]}", lease=60)

    async def scenario() -> None:
        first = _launcher(keep)
        assert isinstance(first, Keepable)
        first.epoch = 3
        url = await first.launch()
        pid = await first.server_pid()
        assert pid is not None
        first._renewal.cancel()  # type: ignore[union-attr]  # the driver is gone: nothing renews, nothing kills
        second = _launcher(keep)  # a new driver's handle on the same slot
        with pytest.raises(EngineStartError, match="epoch is 3, the ledger says 2"):
            await second.adopt(2, pid)
        with pytest.raises(EngineStartError, match="server_pid is"):
            await second.adopt(3, pid + 1)
        assert await second.adopt(3, pid) == url  # the same process: its URL, no restart
        assert await second.server_pid() == pid and alive(pid)
        second.shutdown()  # a normal end: the actor and its server go

    asyncio.run(scenario())


def test_a_relaunch_takes_over_the_name_of_a_process_that_was_not_adopted() -> None:
    """The new driver disowned the kept process (not the ledger's, or hung): the slot's next launch kills the actor
    still holding the name and starts its own under it."""
    keep = Keep(f"job-{uuid.uuid4().hex[:8]}", lease=60)

    async def scenario() -> None:
        old = _launcher(keep)
        old.epoch = 1
        await old.launch()
        old_pid = await old.server_pid()
        old._renewal.cancel()  # type: ignore[union-attr]
        new = _launcher(keep)
        new.epoch = 2
        await new.launch()
        new_pid = await new.server_pid()
        assert new_pid is not None and new_pid != old_pid
        assert (await new.info())["server_pid"] == new_pid
        deadline = time.monotonic() + 30
        while old_pid is not None and alive(old_pid) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        assert old_pid is not None and not alive(old_pid)  # its actor was killed, and its server with it
        new.shutdown()

    asyncio.run(scenario())


def test_an_engine_nobody_adopts_is_not_found_and_says_so() -> None:
    async def scenario() -> None:
        with pytest.raises(EngineStartError, match="cannot be reached"):
            await _launcher(Keep(f"job-{uuid.uuid4().hex[:8]}")).adopt(1, 1234)

    asyncio.run(scenario())


def test_an_orphaned_engine_exits_after_its_lease() -> None:
    """Its driver never comes back: after the lease the server is killed and the actor is gone (its name free)."""
    import ray

    keep = Keep(f"job-{uuid.uuid4().hex[:8]}", lease=4)

    async def launch() -> int:
        launcher = _launcher(keep)
        launcher.epoch = 1
        await launcher.launch()
        pid = await launcher.server_pid()
        assert pid is not None
        launcher._renewal.cancel()  # type: ignore[union-attr]
        return pid

    pid = asyncio.run(launch())
    assert alive(pid)
    deadline = time.monotonic() + 60  # a bound on the test, not a claim about speed: the lease is 4 s
    while time.monotonic() < deadline and alive(pid):
        time.sleep(0.5)
    assert not alive(pid), "the orphaned engine's server outlived its lease"
    while time.monotonic() < deadline:
        try:
            ray.get_actor(keep.actor_name("engine-0"), namespace=keep.namespace)
        except ValueError:
            break
        time.sleep(0.5)
    else:
        pytest.fail("the orphaned engine's actor outlived its lease")


def test_a_renewed_lease_keeps_the_engine() -> None:
    keep = Keep(f"job-{uuid.uuid4().hex[:8]}", lease=3)

    async def scenario() -> int:
        launcher = _launcher(keep)
        launcher.epoch = 1
        await launcher.launch()
        pid = await launcher.server_pid()
        assert pid is not None
        await asyncio.sleep(8)  # well past one lease: the launcher's renewals keep it
        assert alive(pid) and launcher.alive()
        launcher.shutdown()
        return pid

    asyncio.run(scenario())


def test_kept_engines_are_ray_actors_only() -> None:
    with pytest.raises(ValueError, match="use the 'ray' launcher"):
        launcher_factory("local", keep=Keep("job"))
    with pytest.raises(ValueError, match="positive"):
        Keep("job", lease=0)


# -- the ledger (no Ray) ------------------------------------------------------------------------------------------
def test_the_ledger_is_rewritten_whole_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / LEDGER
    ledger = EngineLedger.read(path, "ns")
    assert ledger.kept == {} and not path.exists()  # none yet: nothing was kept
    ledger.record("engine-0", Kept("job-engine-0", 1, 4242, "http://127.0.0.1:1"))
    ledger.record("engine-1", Kept("job-engine-1", 2, 4343))
    ledger.updating("engine-1", True)
    again = EngineLedger.read(path, "other")
    assert again.namespace == "ns" and again.kept["engine-1"].updating and not again.kept["engine-0"].updating
    assert again.epochs(["engine-0", "engine-1", "engine-2"]) == (1, 2, None)
    again.forget("engine-0")
    assert EngineLedger.read(path, "ns").epochs(["engine-0", "engine-1"]) == (None, 2)
    assert [p.name for p in tmp_path.iterdir()] == [LEDGER]  # no temporary file left behind


@pytest.mark.parametrize("text", ["{", '{"format": 9, "engines": {}}', '{"format": 1, "engines": {"e": {"x": 1}}}'])
def test_a_ledger_that_cannot_be_read_names_the_file_and_the_fix(tmp_path: Path, text: str) -> None:
    path = tmp_path / LEDGER
    path.write_text(text)
    with pytest.raises(LedgerError, match="engine ledger cannot be read") as err:
        EngineLedger.read(path, "ns")
    assert str(path) in str(err.value) and "delete the file" in str(err.value)


def test_a_server_dies_with_its_actor_however_the_actor_dies() -> None:
    """The actor process is SIGKILLed (an OOM kill, a lost worker): nothing of it runs to kill its server, and the
    lease thread died with it, so only the kernel can: the server is spawned with a parent-death signal tied to a
    thread that lives as long as the actor. Without it the server is orphaned for good, holding its port and memory."""
    import signal

    keep = Keep(f"job-{uuid.uuid4().hex[:8]}", lease=60)

    async def scenario() -> None:
        launcher = _launcher(keep)
        launcher.epoch = 1
        await launcher.launch()
        for _ in range(20):  # calls on the actor's other threads end nothing: the server lives on
            await launcher.info()
        info = await launcher.info()
        server, actor = info["server_pid"], info["actor_pid"]
        assert server is not None and alive(server)
        launcher._renewal.cancel()  # type: ignore[union-attr]
        os.kill(actor, signal.SIGKILL)
        deadline = time.monotonic() + 30  # a bound on the test: the kernel's signal is immediate
        while alive(server) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        survived = alive(server)
        if survived:
            os.killpg(server, signal.SIGKILL)  # leave nothing behind for the next test
        assert not survived, "the server outlived its SIGKILLed actor"

    asyncio.run(scenario())
