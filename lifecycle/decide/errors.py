"""Typed errors of the lifecycle layer.

Every error a user can trigger names *what* was wrong (a flag, a file, a machine and state) and
*how to fix it*, so that nothing surfaces later as a ``TypeError`` from deep inside a run.
"""

from __future__ import annotations

import reprlib

ECHO_CHARS = 200  # how much of an offending value an error message echoes


class _Echo(reprlib.Repr):
    """``reprlib``, which stops at a few items per level, plus an int too long to print (Python refuses a repr of
    over 4,300 digits) shown by its size."""

    def repr_int(self, x: int, level: int) -> str:
        digits = int(abs(x).bit_length() * 0.30103) + 1  # log10(2): an estimate, never the 4,300-digit repr
        return super().repr_int(x, level) if digits < 60 else f"<an integer of about {digits} digits>"


_ECHO = _Echo()
_ECHO.maxstring = _ECHO.maxother = ECHO_CHARS
_ECHO.maxlevel, _ECHO.maxlist, _ECHO.maxtuple, _ECHO.maxdict, _ECHO.maxset = 3, 6, 6, 6, 6


def bounded_repr(value: object, limit: int = ECHO_CHARS) -> str:
    """``repr(value)`` cut to about ``limit`` characters, built without ever forming the whole repr: a 225-byte
    YAML alias bomb holds millions of items, so an error echoing its ``repr`` would be megabytes long."""
    text = _ECHO.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class LifecycleError(Exception):
    """Base class for every error raised by rl-lifecycle."""


class ConfigError(LifecycleError, ValueError):
    """An invalid configuration, raised once, at construction.

    ``flag`` is the command-line spelling (``--ft-components``), ``value`` the offending input
    and ``fix`` one sentence telling the user what to do instead.
    """

    def __init__(self, flag: str, value: object, problem: str, fix: str, source: str | None = None) -> None:
        self.flag = flag
        self.value = value
        self.problem = problem
        self.fix = fix
        self.source = source
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{flag}: {problem} (got {bounded_repr(value)}). Fix: {fix}")

    def with_source(self, source: str) -> ConfigError:
        """The same error, saying which file or namespace it came from."""
        return ConfigError(self.flag, self.value, self.problem, self.fix, source=source)


class UsageError(LifecycleError):
    """A command line argparse rejects (unknown flag, ``--steps abc``, a bad ``--format`` choice).

    Raised instead of argparse's exit so the CLI reports it like every other bad input: one
    paragraph naming the flag and the fix, exit 2, a traceback only under ``--debug``.
    """

    def __init__(self, prog: str, message: str) -> None:
        self.prog = prog
        if len(message) > 3 * ECHO_CHARS:  # argparse echoes a value whole: `--launcher <5,000 characters>`
            message = f"{message[: 2 * ECHO_CHARS]}...{message[-ECHO_CHARS // 2 :]}"
        self.message = message
        if "Fix:" in message:  # an argparse ``type`` (a bounded number, a fault spec) already says what to do
            super().__init__(message)
        else:
            super().__init__(f"{message}. Fix: see `{prog} --help` for the accepted flags and values")


class SpecError(LifecycleError):
    """A machine specification that fails definition-time validation.

    Raised when a spec is built, never while a job runs; ``problems`` lists every issue found.
    """

    def __init__(self, machine: str, problems: list[str]) -> None:
        self.machine = machine
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"machine spec {machine!r} is invalid:\n{lines}")


class IllegalTransition(LifecycleError):
    """An event fired in a state that has no transition for it."""

    def __init__(self, machine: str, instance: str, state: str, trigger: str, allowed: list[str]) -> None:
        self.machine = machine
        self.instance = instance
        self.state = state
        self.trigger = trigger
        self.allowed = list(allowed)
        super().__init__(
            f"{machine}[{instance}]: event {trigger!r} is not allowed in state {state!r}; "
            f"allowed events there: {', '.join(sorted(self.allowed)) or '(none: terminal state)'}"
        )
