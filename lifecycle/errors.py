"""Typed errors of the lifecycle layer.

Every error a user can trigger names *what* was wrong (a flag, a file, a machine and state) and
*how to fix it*, so that nothing surfaces later as a ``TypeError`` from deep inside a run.
"""

from __future__ import annotations


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
        super().__init__(f"{where}{flag}: {problem} (got {value!r}). Fix: {fix}")

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
        self.message = message
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
