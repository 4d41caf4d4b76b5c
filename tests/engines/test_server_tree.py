"""A server's whole process tree dies with the thread that spawned it (``ServerProcess(die_with_parent=True)``).

A vLLM API server forks an engine core, which forks a worker (seen on a real server: four processes in one group).
The parent-death signal reaches only the process it is set in, so the server's children outlived a SIGKILLed
driver or actor -- for 5-90 s after a driver, ~285 s after an actor (they notice by their own means). Here a fake
server with the same shape (a child, and a grandchild in a group of its own, the worst case) is spawned by a
driver process that is then SIGKILLed: nothing of the tree may remain. The real-server version is in
tests/engines/vllm/test_vllm_core.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from engines import process
from engines.errors import EngineStartError
from engines.process import ServerProcess
from tests.helpers import alive

# the fake server: forks a child (same group) and a grandchild that leaves the group, writes all pids, waits
SERVER = textwrap.dedent(
    """
    import os, sys, time
    pids = [os.getpid()]
    if os.fork() == 0:
        if os.fork() == 0:
            os.setpgid(0, 0)  # a descendant in a group of its own: only the reaper's subreaper link finds it
            time.sleep(300); os._exit(0)
        time.sleep(300); os._exit(0)
    time.sleep(0.3)
    with open(sys.argv[1], "w") as f:
        tree = [int(c) for c in os.listdir("/proc") if c.isdigit() and _is_desc(int(c))]
        f.write(" ".join(str(p) for p in [os.getpid(), *tree]))
    time.sleep(300)
    """
)
DESC = textwrap.dedent(
    """
    def _is_desc(pid):
        me = os.getpid()
        while pid > 1:
            try:
                stat = open(f"/proc/{pid}/stat").read()
            except OSError:
                return False
            pid = int(stat[stat.rindex(")") + 2:].split()[1])
            if pid == me:
                return True
        return False
    """
)
DRIVER = textwrap.dedent(
    """
    import sys, time
    from engines import process
    if sys.argv[3] == "old":  # the old spawn: the parent-death signal (SIGKILL) set in the server itself
        process._reaped = lambda command, fd: list(command)
        process.REAPER_DEATH_SIGNAL = process.signal.SIGKILL
    server = process.ServerProcess([sys.executable, sys.argv[1], sys.argv[2]], die_with_parent=True)
    server.spawn()
    time.sleep(300)
    """
)


def _kill_driver_and_count_survivors(tmp_path: Path, mode: str) -> list[int]:
    script = tmp_path / "server.py"
    script.write_text("import os\n" + DESC + SERVER)
    pids_file = tmp_path / "pids"
    env = {**os.environ, "PYTHONPATH": str(Path(process.__file__).resolve().parents[1])}
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, str(script), str(pids_file), mode], env=env)
    try:
        deadline = time.monotonic() + 30
        while not (pids_file.exists() and pids_file.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.05)
        pids = [int(p) for p in pids_file.read_text().split()]
        assert len(pids) == 3, pids  # the server, its child and its grandchild
    finally:
        driver.kill()
        driver.wait(10)
    deadline = time.monotonic() + 3  # the kernel's signal is immediate; the reaper's kill takes milliseconds
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    survivors = [p for p in pids if alive(p)]
    for pid in survivors:
        os.kill(pid, signal.SIGKILL)
    return survivors


def test_no_process_of_a_servers_tree_outlives_its_sigkilled_driver(tmp_path: Path) -> None:
    assert _kill_driver_and_count_survivors(tmp_path, "new") == []


def test_catches_a_parent_death_signal_set_in_the_server_alone(tmp_path: Path) -> None:
    """The old spawn: the server itself dies with its driver, its children do not."""
    assert len(_kill_driver_and_count_survivors(tmp_path, "old")) == 2


def test_a_server_run_by_the_reaper_exits_as_it_did_and_leaves_nothing(tmp_path: Path) -> None:
    """The server's own exit code (and death by signal) reaches the spawner through the reaper; a child the server
    left behind is killed; a SIGTERM to the group is the server's to handle (the reaper does not escalate it)."""
    code = "import os, sys, time\nif os.fork() == 0:\n    time.sleep(300)\nsys.exit(3)\n"
    proc = ServerProcess([sys.executable, "-c", code], die_with_parent=True)
    proc.spawn()
    assert proc.wait_dead(10) == 3
    ready = "print('READY http://x:1', flush=True)\ntime.sleep(60)\n"
    graceful = "import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\n" + ready
    proc = ServerProcess([sys.executable, "-c", graceful], die_with_parent=True)
    proc.start(10)
    proc.terminate()
    assert proc.wait_dead(10) == 0
    proc = ServerProcess([sys.executable, "-c", "import time\n" + ready], die_with_parent=True)
    proc.start(10)
    proc.kill()
    assert proc.wait_dead(10) == -signal.SIGKILL


def test_a_missing_executable_is_a_start_error_at_once() -> None:
    with pytest.raises(EngineStartError, match="cannot run"):
        ServerProcess(["/no/such/server"], die_with_parent=True).spawn()
