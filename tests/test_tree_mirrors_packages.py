"""``tests/`` mirrors the packages: the tests of ``engines/cpu`` are in ``tests/engines/cpu``, and so on, so a
reader finds a module's tests by its path. A folder of ``tests/`` is one of

* a package folder's mirror (``tests/lifecycle/decide`` for ``lifecycle/decide/``),
* a suite that cuts across the packages (:data:`CROSS_CUTTING`, at the top of ``tests/`` only),
* a folder of checked-in inputs (:data:`DATA`: event logs, golden files), inside either of the above,
* a package the tests beside it plug in (:data:`FIXTURES`), declared with the test that uses it.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("lifecycle", "engines", "rollout", "trainer")
CROSS_CUTTING = {
    "reliability": "the fault matrix and the bad-input corpus, across every layer",
    "mutants": "mutation proofs of the checker and of the runtime",
    "model_based": "hypothesis state machines over the core and the real runtime",
    "browser": "the HTML pages in headless chromium",
    "examples": "the examples/ folder, run as a user runs them",
}
DATA = {"data", "golden"}
FIXTURES = {
    "engines/third_backend": "a third engine backend, one row plus one package (tests/engines/test_third_backend.py)",
}


def misplaced(root: Path) -> list[str]:
    """The folders under ``root/tests`` that mirror no package folder of ``root`` and are not declared."""
    tests = root / "tests"
    found = []
    for folder in sorted(p for p in tests.rglob("*") if p.is_dir()):
        parts = folder.relative_to(tests).parts
        if any(part == "__pycache__" or part.startswith(".") for part in parts):
            continue
        if parts[-1] in DATA and len(parts) > 1:
            continue
        if parts[0] in CROSS_CUTTING and len(parts) == 1:
            continue
        if "/".join(parts) in FIXTURES:
            continue
        if parts[0] in PACKAGES and (root.joinpath(*parts) / "__init__.py").is_file():
            continue
        found.append(folder.relative_to(root).as_posix())
    return found


def _tree(root: Path, *folders: str) -> Path:
    for folder in folders:
        (root / folder).mkdir(parents=True, exist_ok=True)
        if not folder.startswith("tests"):
            (root / folder / "__init__.py").touch()
    return root


def test_every_test_folder_mirrors_a_package_or_is_declared() -> None:
    assert not misplaced(ROOT), (
        f"these test folders mirror no package folder: {misplaced(ROOT)}; move their tests to tests/<package path> "
        "(or, for a suite across the packages, add it to CROSS_CUTTING with why)"
    )


def test_a_folder_named_after_no_package_is_found(tmp_path: Path) -> None:
    root = _tree(tmp_path, "engines", "engines/cpu", "tests/engines/cpu", "tests/engines/cpu/data", "tests/mutants")
    assert misplaced(root) == []
    _tree(root, "tests/cpu_engine", "tests/engines/sim", "tests/telemetry/data", "tests/mutants/extra")
    assert misplaced(root) == ["tests/cpu_engine", "tests/engines/sim", "tests/mutants/extra", "tests/telemetry"]


def test_the_scan_sees_the_real_mirrors() -> None:
    """Blind scans pass too: the real tree has folders of each kind for the rules to accept."""
    tests = ROOT / "tests"
    for folder in ("engines/cpu", "lifecycle/decide", "trainer/app", "lifecycle/data", "reliability"):
        assert (tests / folder).is_dir(), folder
