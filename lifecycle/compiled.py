"""The optional compiled checker: which modules it holds, and whether this process runs them.

``make compiled`` (or ``LIFECYCLE_COMPILE=1 pip install .``) compiles the core and the checker's explorer with mypyc
into extension modules beside their sources; Python imports an extension before a source of the same name. This
module decides, once, before any of them is imported, whether that is allowed: the compiled modules are used only
all together (compiled code calls its group's classes directly, so a half-compiled import would hold two classes of
one name), and only when each source is exactly the one compiled (the build records each source's hash: an edited
source is never shadowed by a stale build). ``LIFECYCLE_PURE=1`` imports the pure modules regardless -- what the
test suite does, whose tests patch the core at run time (compiled functions and classes cannot be patched).
Stdlib only: ``setup.py`` reads :data:`MODULES` from this file without importing the package.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

# What the checker runs per state: the core's step function and the explorer around it
MODULES: tuple[str, ...] = (
    "lifecycle.decide.core.core",
    "lifecycle.decide.core.draft",
    "lifecycle.decide.core.engines",
    "lifecycle.decide.core.model",
    "lifecycle.decide.core.operations",
    "lifecycle.decide.core.parts",
    "lifecycle.decide.core.phases",
    "lifecycle.decide.core.plan",
    "lifecycle.decide.core.reports",
    "lifecycle.decide.core.step",
    "lifecycle.decide.core.tables",
    "lifecycle.decide.core.trainer",
    "lifecycle.decide.core.weights",
    "lifecycle.check.world",
    "lifecycle.check.invariants",
    "lifecycle.check.explore",
)
MANIFEST = "compiled.json"  # beside this file: {module: sha256 of the source it was compiled from}
PURE_ENV = "LIFECYCLE_PURE"
ROOT = Path(__file__).resolve().parent  # the lifecycle package


def source_of(module: str) -> Path:
    return ROOT.parent.joinpath(*module.split(".")).with_suffix(".py")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _extension(module: str) -> Path | None:
    base = source_of(module)
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = base.with_suffix(suffix)
        if candidate.is_file():
            return candidate
    return None


def built() -> str | None:
    """Why the compiled build cannot be used here (None: it can): absent, partial, or older than its sources."""
    try:
        recorded = json.loads((ROOT / MANIFEST).read_text())
    except (OSError, ValueError):
        return "no compiled build (make compiled)"
    for module in MODULES:
        if _extension(module) is None:
            return f"no compiled {module} (make compiled)"
        if recorded.get(module) != digest(source_of(module)):
            return f"{source_of(module).name} changed since it was compiled (make compiled again)"
    return None


def wanted() -> bool:
    """Whether this process imports the compiled modules: built for these sources, and LIFECYCLE_PURE unset."""
    return os.environ.get(PURE_ENV, "") != "1" and built() is None


def in_use() -> bool:
    """Whether the checker this process imported is the compiled one."""
    world = sys.modules.get("lifecycle.check.world")
    if world is None:
        return _CHOICE
    return Path(world.__file__ or "").suffix != ".py"


class _PureFinder(importlib.machinery.PathFinder):
    """Finds the source of each compiled module, ahead of the extension beside it."""

    @classmethod
    def find_spec(
        cls, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _NAMES:
            return None
        return importlib.util.spec_from_file_location(fullname, source_of(fullname))


_NAMES = frozenset(MODULES)
_CHOICE = False


def choose() -> bool:
    """Decide once, before the first compiled module is imported (``lifecycle/__init__``): True, compiled."""
    global _CHOICE
    _CHOICE = wanted()
    if not _CHOICE and _PureFinder not in sys.meta_path and any(_extension(m) for m in MODULES):
        sys.meta_path.insert(0, _PureFinder)  # (without any extension, the ordinary import finds the sources)
    return _CHOICE


if __name__ == "lifecycle.compiled":  # imported by the package (setup.py runs this file only to read MODULES)
    choose()
