"""The engine programs' flags (``python -m engines.cpu``, ``python -m engines.sim``): bounded at parse time.

A number that parses can still overflow where it is used (a seed past 64 bits in torch, a KV pool sized
from ``--max-running-requests``, an infinite timeout in a ``timedelta``), after seconds of start-up and as
a traceback. Each flag's type here checks the range where it is parsed, and every refusal is one line
``PROG: error: argument --FLAG: what is wrong; Fix: ...`` with exit 2 (no usage block). No torch here.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import NoReturn

SHOWN_CHARS = 40
MAX_SECONDS = 86_400.0  # a day: longer than any delay or deadline an engine is given, and a finite timedelta


def shown(text: str) -> str:
    """The flag's value as given, cut short (a 5,000-digit number is not echoed whole)."""
    return text if len(text) <= SHOWN_CHARS else f"{text[: SHOWN_CHARS - 3]}... ({len(text)} characters)"


class OneLineParser(argparse.ArgumentParser):
    """argparse's refusals as ONE line naming the flag (its usage block would bury it), exit 2."""

    def error(self, message: str) -> NoReturn:
        text = " ".join(message.split())
        if "Fix:" not in text:  # argparse's own refusals (a choice, a required flag) say what, not how
            text += f"; Fix: see {self.prog} --help"
        self.exit(2, f"{self.prog}: error: {text}\n")


def bounded_int(low: int, high: int, fix: str) -> Callable[[str], int]:
    """An argparse type: a whole number in ``[low, high]``, else one message with ``fix``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{shown(text)!r} is not a whole number; Fix: {fix}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be in {low}..{high}, got {shown(text)}; Fix: {fix}")
        return value

    return parse


def bounded_seconds(fix: str, high: float = MAX_SECONDS) -> Callable[[str], float]:
    """An argparse type: finite seconds in ``[0, high]``, else one message with ``fix``."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and 0 <= value <= high):
            raise argparse.ArgumentTypeError(f"must be seconds in 0..{high:g}, got {shown(text)!r}; Fix: {fix}")
        return value

    return parse


port = bounded_int(0, 65535, "give a TCP port, or 0 for a free one")
