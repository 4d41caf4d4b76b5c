"""A server's first process: runs the server as its child and takes the server's whole process tree down with it.

A parent-death signal (Linux ``PR_SET_PDEATHSIG``) reaches one process only, and only the one it was set in: a
server that forks children of its own (vLLM's API server starts an engine core, which starts workers; SGLang a
scheduler and a detokenizer) would leave them running when the kernel kills it -- they notice their parent's
death by their own means, seconds to minutes later, holding memory and ports. So the spawner's parent-death
signal goes to this small process instead (``SIGUSR1``, set between fork and exec), which kills every process
of the tree at once; it is also a subreaper, so a descendant whose parent died stays in the tree. The server
leads a session (and process group) of its own, so signals to the server's group -- a kill, a SIGSTOP, a
graceful SIGTERM -- reach the server's processes and not this one; when the server exits, whatever it left
behind is killed too, and this process exits as the server did. The server's pid is written to the file
descriptor given, once it exists (the spawner's handle on the server's group).

Stdlib only, run as ``python -S -I reaper.py PARENT_PID PID_FD COMMAND...`` (tens of milliseconds): it imports
nothing of the project, so it runs with the spawner's python whatever the server's environment is.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
SERVER = 0  # the server's pid, and its group's id, once forked
DEATH_SIGNAL = signal.SIGUSR1  # the parent-death signal the spawner sets: the only signal that kills the tree


def descendants(root: int) -> list[int]:
    """Every live process below ``root`` (by parent links in /proc: as a subreaper it inherits orphans)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode("ascii", "replace")
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if fields[0] != "Z":
            parents[int(entry)] = int(fields[1])
    found: set[int] = set()
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent and pid not in found:
                found.add(pid)
                frontier.append(pid)
    return sorted(found)


def kill_tree() -> None:
    for pid in descendants(os.getpid()):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def reap(deadline: float) -> None:
    """Collect the killed (this process is their subreaper), bounded."""
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.02)


def kill_server_group() -> None:
    """One syscall, first: whatever else kills this process next (Ray SIGKILLs a dead worker's children) comes
    after the server's group is gone."""
    if SERVER:
        with contextlib.suppress(OSError):
            os.killpg(SERVER, signal.SIGKILL)


def on_parent_death(signum: int, frame: object) -> None:
    kill_server_group()
    kill_tree()
    os._exit(128 + signal.SIGKILL)


def main(argv: list[str]) -> int:
    parent, pid_fd, command = int(argv[1]), int(argv[2]), argv[3:]
    signal.signal(DEATH_SIGNAL, on_parent_death)  # before this line the signal's default action ends this process
    # a graceful stop is the server's to handle; this process follows it when it exits
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if os.getppid() != parent:  # the parent died before the handler was in place: the signal came and went
        return 1
    global SERVER
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    me = os.getpid()
    child = os.fork()
    if child == 0:
        prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # this process SIGKILLed (no handler runs): the server goes too
        if os.getppid() != me:
            os._exit(1)
        for sig in (DEATH_SIGNAL, signal.SIGTERM, signal.SIGINT):  # ignored signals survive exec: restore them
            signal.signal(sig, signal.SIG_DFL)
        os.close(pid_fd)
        os.setsid()  # the server's own group: what the spawner signals (its pid is the group's id)
        try:
            os.execvp(command[0], command)
        except OSError as exc:
            os.write(2, f"cannot run {command[0]!r}: {exc}\n".encode())
        os._exit(127)
    SERVER = child
    with contextlib.suppress(OSError):
        os.write(pid_fd, f"{child}\n".encode())
    os.close(pid_fd)
    while True:
        pid, status = os.waitpid(-1, 0)  # orphans reparented here are reaped on the way
        if pid == child:
            break
    kill_server_group()
    kill_tree()
    reap(time.monotonic() + 5.0)
    if os.WIFSIGNALED(status):
        sig = signal.Signals(os.WTERMSIG(status))
        with contextlib.suppress(OSError, ValueError):  # SIGKILL has no handler to reset
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)  # exit as the server did: killed by the same signal
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
