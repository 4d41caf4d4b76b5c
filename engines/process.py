"""Start, watch and kill one inference server process (the CPU torch engine or ``sglang.launch_server``).

The server runs in its own process group (its own session), so ``kill()`` takes down every
process it spawned (SGLang forks scheduler and detokenizer processes) and the death is a real OS
death. Readiness is bounded: the process must print ``READY <url>`` (the CPU engine does) or, when
the URL is known up front (an SGLang command with ``--port``), answer ``GET /health`` with 200.
Output (stdout and stderr, merged) is drained by a thread so the server never blocks on a full pipe;
its tail goes into every start error.

Blocking by design (``subprocess``); from async code call ``await asyncio.to_thread(proc.start)``.
"""

from __future__ import annotations

import collections
import ctypes
import functools
import http.client
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from engines.errors import EngineError, EngineStartError, EngineStartTimeout, EngineTimeout

READY_PATTERN = re.compile(r"^READY (https?://\S+)\s*$")
# A server environment's ``PRIVATE_DIR_ENV=NAME``: the server reads a directory of its own from ``$NAME``, which the
# process makes before the start and removes once the server is dead (vLLM's ZeroMQ sockets: ``VLLM_RPC_BASE_PATH``,
# /tmp by default, where a SIGKILLed server left its socket files at every start).
PRIVATE_DIR_ENV = "LIFECYCLE_PRIVATE_DIR_ENV"
# the last line of a Python traceback (``RuntimeError: ...``), bare or as vLLM logs it at ERROR level
# (``(Worker pid=12386) ERROR 12-06 08:27:36 [multiproc_executor.py:1063] RuntimeError: ...``)
ERROR_PATTERN = re.compile(
    r"^(?:\(\S+ pid=\d+\) )?(?:ERROR \S+ \S+ \[[^\]]*\] )?([A-Za-z_][\w.]*(?:Error|Exception|Exit)): \S.*$"
)


def torch_engine_command(
    port: int = 0,
    seed: int = 0,
    *,
    host: str = "127.0.0.1",
    api_key: str | None = None,
    weights: str | os.PathLike[str] | None = None,
    weight_version: str | None = None,
    model_size: str = "tiny",
    max_running_requests: int | None = None,
    step_delay_s: float | None = None,
    startup_delay_s: float | None = None,
    weight_group_timeout_s: float | None = None,
    python: str | None = None,
) -> list[str]:
    """The CPU torch engine's command line (``port`` 0: the engine picks a free port, reported by READY)."""
    cmd = [python or sys.executable, "-m", "engines.cpu", "--host", host, "--port", str(port)]
    cmd += ["--seed", str(seed), "--model-size", model_size]
    if api_key is not None:
        cmd += ["--api-key", api_key]
    if weights is not None:
        cmd += ["--weights", os.fspath(weights)]
    if weight_version is not None:
        cmd += ["--weight-version", weight_version]
    if max_running_requests is not None:
        cmd += ["--max-running-requests", str(max_running_requests)]
    if step_delay_s is not None:
        cmd += ["--step-delay-s", repr(step_delay_s)]
    if startup_delay_s is not None:
        cmd += ["--startup-delay-s", repr(startup_delay_s)]
    if weight_group_timeout_s is not None:
        cmd += ["--weight-group-timeout-s", repr(weight_group_timeout_s)]
    return cmd


def _libc_prctl() -> Any:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: no parent-death signal
        return None


_PRCTL = _libc_prctl()  # looked up before any fork: the child only calls it
PR_SET_PDEATHSIG = 1
REAPER_DEATH_SIGNAL = signal.SIGUSR1  # engines.reaper.DEATH_SIGNAL: what it kills the server's tree on


PID_WAIT = 10.0  # seconds for a reaper to report its server's pid (a python start on busy cores)
REAPER = str(Path(__file__).with_name("reaper.py"))  # stdlib only: runs with -S -I, whatever the server's python


def _die_with_parent(parent: int) -> None:
    """In the child (the reaper), before exec: its parent-death signal, sent when the spawning thread dies (and
    exit now if the parent died already, between the fork and this call: the signal would never come). The
    reaper turns that signal into the death of the server's whole process tree."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, REAPER_DEATH_SIGNAL)
        if os.getppid() != parent:
            os._exit(1)


def _reaped(command: Sequence[str], pid_fd: int) -> list[str]:
    """The command run by the reaper, its parent: a server's own children (vLLM's engine core) die with it."""
    return [sys.executable, "-S", "-I", REAPER, str(os.getpid()), str(pid_fd), *command]


class ServerProcess:
    """One server process. ``start()`` spawns it and waits (bounded) until it is ready.

    ``url`` is the base URL (from READY, or the one given); ``kill()`` is SIGKILL and ``terminate()``
    SIGTERM, both to the whole process group; ``wait_dead(timeout)`` confirms the death.
    """

    def __init__(
        self,
        command: Sequence[str],
        *,
        engine_id: str = "engine",
        url: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        log_path: str | os.PathLike[str] | None = None,
        health_path: str = "/health",
        tail_lines: int = 60,
        die_with_parent: bool = False,
    ) -> None:
        """``die_with_parent``: the server's whole process tree is killed when the thread that spawned it ends
        (Linux ``PR_SET_PDEATHSIG`` on :mod:`engines.reaper`, the server's parent), so a driver or an actor killed
        by SIGKILL leaves no server process behind, not even one the server forked; spawn it from a thread that
        lives as long as the process (the event loop's)."""
        if not command:
            raise ValueError("ServerProcess needs a command")
        self.command = list(command)
        self.engine_id = engine_id
        self._url = url.rstrip("/") if url else None
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.log_path = Path(log_path) if log_path is not None else None
        self.health_path = health_path
        self._tail: collections.deque[str] = collections.deque(maxlen=tail_lines)
        self.first_error: str | None = None  # the first exception it printed: the cause, before its consequences
        self._ready_url: str | None = None
        self._ready = threading.Event()
        self._eof = threading.Event()
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self.die_with_parent = die_with_parent
        self._pid_pipe: int | None = None  # where the reaper writes the server's pid
        self._server_pid: int | None = None
        self._private: str | None = None  # the server's own directory (PRIVATE_DIR_ENV), removed at its death

    # -- starting ------------------------------------------------------------------------------
    def spawn(self) -> None:
        """Start the process without waiting (so several can start in parallel); then ``wait_ready``."""
        if self._proc is not None:
            raise RuntimeError(f"engine {self.engine_id}: process already started (pid {self._proc.pid})")
        env = dict(os.environ if self.env is None else self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        private = env.pop(PRIVATE_DIR_ENV, "")
        if private:
            self._private = env[private] = tempfile.mkdtemp(prefix=re.sub(r"[^\w.-]", "_", self.engine_id) + "-")
        command = self.command
        pid_fd: int | None = None
        if self.die_with_parent and _PRCTL is not None:
            if shutil.which(command[0], path=env.get("PATH", os.defpath)) is None:
                raise EngineStartError(self.engine_id, f"cannot run {command[0]!r}: no such executable")
            self._pid_pipe, pid_fd = os.pipe()
            command = _reaped(command, pid_fd)
        try:
            self._proc = subprocess.Popen(
                command,
                pass_fds=() if pid_fd is None else (pid_fd,),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.cwd,
                start_new_session=True,
                preexec_fn=functools.partial(_die_with_parent, os.getpid()) if self.die_with_parent else None,
            )
        except OSError as exc:
            self._forget_private()
            raise EngineStartError(self.engine_id, f"cannot run {self.command[0]!r}: {exc}") from None
        finally:
            if pid_fd is not None:
                os.close(pid_fd)  # the reaper's copy is the one it writes to
        self._reader = threading.Thread(target=self._drain, name=f"{self.engine_id}-output", daemon=True)
        self._reader.start()

    def wait_ready(self, timeout: float = 60.0) -> str:
        """Block until READY (or /health 200 when the URL is known); returns the URL.

        Raises :class:`EngineStartError` if the process exits first, :class:`EngineStartTimeout`
        (after killing it) if it is not ready within ``timeout`` seconds.
        """
        proc = self._require()
        deadline = time.monotonic() + timeout
        next_probe = 0.0
        while True:
            if self._ready.is_set():
                return self.url
            if proc.poll() is not None:
                self._eof.wait(1.0)  # let the reader collect the last lines
                if self._ready.is_set():
                    return self.url
                first = f"; its first error: {self.first_error}" if self.first_error else ""
                self._forget_private()
                raise EngineStartError(
                    self.engine_id,
                    f"process exited with code {proc.returncode} before it was ready{first}",
                    returncode=proc.returncode,
                    output=self.output_tail(),
                )
            if self._url is not None and time.monotonic() >= next_probe:
                next_probe = time.monotonic() + 0.25
                if self._health_ok():
                    self._ready.set()
                    return self.url
            if time.monotonic() >= deadline:
                self.kill()
                self.wait_dead(10.0)
                raise EngineStartTimeout(self.engine_id, timeout, output=self.output_tail())
            self._ready.wait(0.05)

    def start(self, timeout: float = 60.0) -> str:
        """``spawn()`` then ``wait_ready(timeout)``; returns the URL."""
        self.spawn()
        return self.wait_ready(timeout)

    def _drain(self) -> None:
        proc = self._require()
        assert proc.stdout is not None
        log = open(self.log_path, "ab") if self.log_path is not None else None  # noqa: SIM115 -- closed below
        try:
            for raw in proc.stdout:
                if log is not None:
                    log.write(raw)
                    log.flush()
                line = raw.decode("utf-8", "replace").rstrip("\n")
                self._tail.append(line)
                if self.first_error is None and ERROR_PATTERN.match(line):
                    self.first_error = line[-500:]
                match = READY_PATTERN.match(line)
                if match and not self._ready.is_set():
                    self._ready_url = match.group(1).rstrip("/")
                    self._ready.set()
        finally:
            if log is not None:
                log.close()
            self._eof.set()

    def _health_ok(self) -> bool:
        assert self._url is not None
        try:
            with urllib.request.urlopen(self._url + self.health_path, timeout=2.0) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException):
            return False  # not up yet, or not ours (a port another server took answers in another protocol)

    # -- state -----------------------------------------------------------------------------------
    def _require(self) -> subprocess.Popen[bytes]:
        if self._proc is None:
            raise RuntimeError(f"engine {self.engine_id}: process not started (call start() or spawn())")
        return self._proc

    @property
    def url(self) -> str:
        """The base URL (``http://host:port``), known once the process is ready."""
        url = self._ready_url or (self._url if self._ready.is_set() else None)
        if url is None:
            raise RuntimeError(f"engine {self.engine_id}: not ready yet, no URL")
        return url

    @property
    def pid(self) -> int:
        """The server's pid, the id of its process group (under a reaper: the reaper's child, read once from the
        reaper -- it forks within moments of its start; the reaper's own pid if it ended before)."""
        proc = self._require()
        if self._pid_pipe is not None:
            pipe, self._pid_pipe = self._pid_pipe, None
            try:
                ready, _, _ = select.select([pipe], [], [], PID_WAIT)
                text = os.read(pipe, 64).decode(errors="replace") if ready else ""
            finally:
                os.close(pipe)
            self._server_pid = int(text) if text.strip().isdigit() else None
        return self._server_pid or proc.pid

    @property
    def started(self) -> bool:
        """Spawned (running or ended): a caller asking for its pid meanwhile (another thread) gets none before."""
        return self._proc is not None

    @property
    def alive(self) -> bool:
        """True while the process has not exited (an exited one is reaped here, so no zombie lingers)."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def death(self, code: int) -> str:
        """Why it ended, for the slot's report: its exit code and the first exception it printed (a vLLM server
        whose engine core died exits 0, its own error scrolled away by the shutdown's output)."""
        self._eof.wait(1.0)  # the reader's last lines
        return f"exit code {code}" + (f"; its first error: {self.first_error}" if self.first_error else "")

    def output_tail(self, lines: int | None = None) -> str:
        """The last lines the process printed (stdout and stderr merged)."""
        tail = list(self._tail)
        return "\n".join(tail if lines is None else tail[-lines:])

    # -- stopping ----------------------------------------------------------------------------------
    def _signal_group(self, sig: signal.Signals) -> None:
        proc = self._require()
        try:
            os.killpg(self.pid, sig)  # the server leads its own group (start_new_session, or the reaper's setsid)
        except ProcessLookupError:
            pass
        except PermissionError:
            if proc.poll() is None:
                proc.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL the process group (idempotent); its own directory goes at once (a socket file can be unlinked
        while bound, and a killed server has no use for it)."""
        self._signal_group(signal.SIGKILL)
        self._forget_private()

    def terminate(self) -> None:
        """SIGTERM the process group: the CPU engine aborts in-flight requests and exits 0."""
        self._signal_group(signal.SIGTERM)

    def wait_dead(self, timeout: float | None = 10.0) -> int:
        """Block until the process has exited; its exit code (negative: killed by that signal).

        ``timeout=None`` is a plain blocking ``waitpid``: a death watcher wakes the moment the child
        dies instead of polling. Raises :class:`EngineTimeout` if it is still alive after ``timeout``.
        """
        try:
            code = self._require().wait(timeout)
        except subprocess.TimeoutExpired:
            waited = float(timeout or 0.0)  # only a finite timeout can expire
            raise EngineTimeout(
                self.engine_id, "process", waited, f"process {self.pid} still alive {waited:g}s later"
            ) from None
        self._forget_private()
        return code

    def _forget_private(self) -> None:
        """The server's own directory goes with it (idempotent: a death watch and a caller may both see the death)."""
        private, self._private = self._private, None
        if private is not None:
            shutil.rmtree(private, ignore_errors=True)

    def close(self, timeout: float = 5.0) -> None:
        """SIGTERM, then SIGKILL if it has not exited within ``timeout`` (no-op if never started or dead)."""
        if self._proc is None or self._proc.poll() is not None:
            return
        self.terminate()
        try:
            self.wait_dead(timeout)
        except EngineError:
            self.kill()
            self.wait_dead(timeout)

    def __enter__(self) -> ServerProcess:
        if self._proc is None:
            self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "not started" if self._proc is None else ("alive" if self.alive else f"exited {self.returncode}")
        return f"ServerProcess({self.engine_id!r}, pid={self._proc.pid if self._proc else None}, {state})"
