"""A run directory (and a ``--save`` directory) belongs to one driver at a time.

Two drivers on one run directory interleave its event log (which then fails its own ``trace check``), write one
save directory, and under ``--detach-engines`` both adopt the same kept engines. So every driver -- ``lifecycle
run``, ``--resume``, :func:`trainer.app.loop.run_loop`, a :class:`trainer.app.job.Job` -- holds the directories it
writes, before its first write, with one lock: ``flock(LOCK_EX | LOCK_NB)`` on ``DIR/.lifecycle.lock``.

* The kernel frees a flock when its holder dies, however it dies: a SIGKILLed driver's directory is taken over by
  the next one with no stale-pid guessing. The holder writes who it is into the file, so a refusal names it.
* The descriptor is close-on-exec and closed in a forked child: an engine server, a Ray worker or a ``fork``
  that outlives the driver never keeps its lock (a flock belongs to the open file, which a fork shares).
* Reentrant within a process: ``lifecycle run`` holds its directories, then ``run_loop`` and the ``Job`` it builds
  take them again; the last release frees them.
* Released, the lock file is removed, and so is each directory the lock itself created where nothing else was
  written: a refused run leaves its folder as it found it. A taker checks that the file it locked is
  still the one at the path (a releasing holder removes it before it unlocks), else takes the new one.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import socket
import stat
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from lifecycle.decide.errors import ConfigError

LOCK_FILE = ".lifecycle.lock"
_HOLDER_BYTES = 4096  # what a refusal reads of the lock file (its holder's line; the file is anyone's to damage)
_ATTEMPTS = 20  # takes of a lock file that a releasing holder removed meanwhile (each one a fresh file)


@dataclass
class _Held:
    """One directory this process holds: its lock file's descriptor and identity, and how many holders share it."""

    fd: int
    lock_path: str
    identity: tuple[int, int]  # (st_dev, st_ino) of the lock file locked
    created: list[Path] = field(default_factory=list)  # the directories the lock created, outermost first
    count: int = 1


_HELD: dict[str, _Held] = {}  # real path of the directory -> what this process holds of it
# reentrant: a Job's finalizer (its holding released when it is collected) may run inside a holding's change
_GUARD = threading.RLock()


def _forget_in_child() -> None:
    """A forked child closes its copies of the descriptors (which releases nothing: the parent's stay open) and
    holds nothing, so the lock ends with the driver even when the child outlives it."""
    global _GUARD
    _GUARD = threading.RLock()  # another thread may have held it at the fork
    for held in _HELD.values():
        with contextlib.suppress(OSError):
            os.close(held.fd)
    _HELD.clear()


os.register_at_fork(after_in_child=lambda: _forget_in_child())  # looked up when called: a test replaces it


class DirLock:
    """This process's holding of one directory (:func:`hold`); :meth:`release` once, however the holder ends."""

    def __init__(self, key: str, held: _Held) -> None:
        self.path = key
        self._held: _Held | None = held

    def release(self) -> None:
        held, self._held = self._held, None
        if held is None:
            return
        with _GUARD:
            if _HELD.get(self.path) is not held:  # a forked child's copy: the lock is the parent's
                return
            held.count -= 1
            if held.count:
                return
            del _HELD[self.path]
            try:  # removed while still locked: a taker that opened it meanwhile sees it is gone and retries
                if _identity(os.stat(held.lock_path, follow_symlinks=False)) == held.identity:
                    os.unlink(held.lock_path)
            except OSError:
                pass
            os.close(held.fd)
            _remove_created(held.created)

    def __enter__(self) -> DirLock:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.release()


class DirLocks:
    """Several holdings released together, the last taken first (a command's run and save directories)."""

    def __init__(self) -> None:
        self._locks: list[DirLock] = []

    def take(self, path: str | os.PathLike[str] | None, flag: str) -> None:
        """Hold ``path`` (None: nothing to hold) until :meth:`release`; a ConfigError naming ``flag`` if another
        process holds it."""
        if path is not None:
            self._locks.append(hold(path, flag))

    def release(self) -> None:
        while self._locks:
            self._locks.pop().release()

    def __enter__(self) -> DirLocks:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.release()


def hold_run(
    run_dir: str | os.PathLike[str], save: str | os.PathLike[str] | None, *, run_flag: str, save_flag: str
) -> DirLocks:
    """A driver's directories: its run directory and its ``--save`` directory (None: none), both or neither."""
    locks = DirLocks()
    try:
        locks.take(run_dir, run_flag)
        locks.take(save, save_flag)
    except BaseException:
        locks.release()
        raise
    return locks


def hold(path: str | os.PathLike[str], flag: str) -> DirLock:
    """Hold the directory ``path`` (created if missing) for this process; one ConfigError naming ``flag``, the
    holder and the fix if another process holds it."""
    with _GUARD:
        created = _make_dirs(Path(path), flag)
        key = os.path.realpath(path)
        held = _HELD.get(key)
        if held is not None:
            held.count += 1
            if _HELD.get(key) is held:  # not released meanwhile by a collected holder's finalizer
                return DirLock(key, held)
        try:
            held = _take(key, flag)
        except BaseException:
            _remove_created(created)
            raise
        held.created = created
        _HELD[key] = held
        return DirLock(key, held)


def _take(directory: str, flag: str) -> _Held:
    lock_path = os.path.join(directory, LOCK_FILE)
    for _ in range(_ATTEMPTS):
        try:
            # O_NOFOLLOW: a planted link must not make the lock truncate (and write) a file elsewhere
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        except FileNotFoundError:  # the directory was removed under us (a releasing holder's rmdir): make it again
            _make_dirs(Path(directory), flag)
            continue
        except OSError as exc:
            raise _unusable(flag, directory, lock_path, exc.strerror or str(exc)) from None
        try:
            mine = os.fstat(fd)
            if not stat.S_ISREG(mine.st_mode):
                raise _unusable(flag, directory, lock_path, "it is not a regular file")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise _refusal(flag, directory, fd) from None
            try:
                there = os.stat(lock_path, follow_symlinks=False)
            except FileNotFoundError:
                there = None
            if there is None or _identity(there) != _identity(mine):  # its holder removed it as it released it
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(_holder()) + "\n").encode(), 0)
        except BaseException:
            _close(fd)
            raise
        return _Held(fd, lock_path, _identity(mine))
    raise _unusable(flag, directory, lock_path, f"it was replaced {_ATTEMPTS} times while being taken")


def _holder() -> dict[str, object]:
    """Who holds the lock, for the refusal of the next driver: this process, its command line, since when."""
    argv = list(getattr(sys, "orig_argv", None) or sys.argv) or ["?"]
    if "lifecycle.cli" in argv[1:3] and argv[argv.index("lifecycle.cli") - 1] == "-m":  # python -m lifecycle.cli
        argv = ["lifecycle", *argv[argv.index("lifecycle.cli") + 1 :]]
    argv[0] = os.path.basename(argv[0])
    return {"pid": os.getpid(), "host": socket.gethostname(), "command": shlex.join(argv)[:300], "since": time.time()}


def _refusal(flag: str, directory: str, fd: int) -> ConfigError:
    who = _describe(_read_holder(fd))
    pid = who[1]
    stop = f"stop that driver (kill {pid})" if pid is not None else "stop that driver"
    return ConfigError(
        flag,
        directory,
        f"the directory is in use by {who[0]}: a run or save directory belongs to one driver at a time",
        f"wait for that driver to end, or {stop}; a driver that died frees its lock by itself (the kernel releases "
        f"it), so there is nothing to remove",
    )


def _read_holder(fd: int) -> dict[str, object] | None:
    """The holder's line; it writes it just after it locks, so an empty file is read again for a moment."""
    for _ in range(5):
        try:
            data = os.pread(fd, _HOLDER_BYTES, 0)
        except OSError:
            return None
        try:
            body = json.loads(data)
        except ValueError:
            body = None
        if isinstance(body, dict):
            return body
        time.sleep(0.05)
    return None


def _describe(body: dict[str, object] | None) -> tuple[str, int | None]:
    """'pid 1234 (lifecycle run --resume r) on HOST since 08:41:02', and the pid; whatever the file holds is
    shown only where it has the type it was written with."""
    if body is None:
        return "another process (its lock file does not name it)", None
    pid = body.get("pid")
    pid = pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else None
    text = f"pid {pid}" if pid is not None else "another process"
    command = body.get("command")
    if isinstance(command, str) and command:
        text += f" ({command[:300]})"
    host = body.get("host")
    if isinstance(host, str) and host:
        text += f" on {host[:100]}"
    since = body.get("since")
    if isinstance(since, int | float) and not isinstance(since, bool) and 0 < since < 1e11:
        moment = time.localtime(since)
        same_day = time.strftime("%Y-%m-%d", moment) == time.strftime("%Y-%m-%d")
        text += " since " + time.strftime("%H:%M:%S" if same_day else "%Y-%m-%d %H:%M:%S", moment)
    return text, pid


def _unusable(flag: str, directory: str, lock_path: str, why: str) -> ConfigError:
    return ConfigError(
        flag,
        directory,
        f"cannot hold its lock file {lock_path} ({why}): a driver holds the directory it writes",
        f"pick a writable folder (or remove {lock_path} if it is not a file lifecycle wrote)",
    )


def _make_dirs(path: Path, flag: str) -> list[Path]:
    """Create ``path`` and its missing parents; those created, outermost first."""
    missing: list[Path] = []
    probe = path
    while not os.path.lexists(probe) and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        fix = "pass a directory (or a path that does not exist)"
        raise ConfigError(flag, str(path), "is not a directory", fix) from None
    except OSError as exc:
        why = f"cannot write there ({exc.strerror or exc})"
        raise ConfigError(flag, str(path), why, "pick a writable folder") from None
    return missing[::-1]


def _remove_created(created: list[Path]) -> None:
    """The directories a lock created, where nothing else was written into them (innermost first)."""
    for directory in reversed(created):
        try:
            directory.rmdir()
        except OSError:  # not empty (the run wrote there), or gone: it stays as it is
            return


def _identity(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _close(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)
