"""The optional compiled checker. ``make compiled`` (``LIFECYCLE_COMPILE=1 python setup.py build_ext --inplace``) or
``LIFECYCLE_COMPILE=1 pip install .`` compiles the core and the checker's explorer (:data:`lifecycle.compiled.MODULES`)
with mypyc. Without LIFECYCLE_COMPILE, or where the compile cannot run (no mypyc, no C compiler, a mypyc error), the
install is the pure-Python package it always was: one warning, never a failed install. At run time
:mod:`lifecycle.compiled` uses the compiled modules only where every one was built from the sources beside it."""

from __future__ import annotations

import json
import os
import runpy
import sys
from pathlib import Path
from typing import Any

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
_compiled = runpy.run_path(str(HERE / "lifecycle" / "compiled.py"))  # stdlib only: the package is not imported
MODULES: tuple[str, ...] = _compiled["MODULES"]


def _warn(what: str) -> None:
    print(f"warning: {what}; the pure-Python modules are used", file=sys.stderr)


class OptionalBuildExt(build_ext):
    """Builds the compiled modules, then records the sources they were built from (lifecycle/compiled.json); a
    failure leaves the pure package (no record: the extensions that did build are never imported)."""

    def run(self) -> None:
        self._failed = not self.extensions
        try:
            super().run()
        except Exception as exc:  # any toolchain error: the pure modules remain
            self._failed = True
            _warn(f"the compiled checker was not built ({exc})")
        if self._failed:
            return
        manifest = {m: _compiled["digest"](HERE.joinpath(*m.split(".")).with_suffix(".py")) for m in MODULES}
        base = HERE if self.inplace else Path(self.build_lib)
        target = base / "lifecycle" / _compiled["MANIFEST"]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")

    def build_extension(self, ext: Any) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            self._failed = True
            _warn(f"{ext.name} was not compiled ({exc})")


def _extensions() -> list[Any]:
    if os.environ.get("LIFECYCLE_COMPILE", "") != "1":
        return []
    try:
        from mypyc.build import mypycify
    except ImportError:
        _warn("LIFECYCLE_COMPILE=1 but mypyc is not installed (pip install mypy)")
        return []
    paths = [str(Path(*m.split(".")).with_suffix(".py")) for m in MODULES]
    try:
        return list(mypycify(paths, opt_level="3", group_name="lifecycle.checker"))
    except BaseException as exc:  # mypyc reports its own errors by exiting (SystemExit): still the pure package
        _warn(f"mypyc could not compile the checker ({exc!r})")
        return []


setup(ext_modules=_extensions(), cmdclass={"build_ext": OptionalBuildExt})
