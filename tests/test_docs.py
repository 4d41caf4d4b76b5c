"""The docs keep what the one-page README said, and every file or module they name is in the tree.

The README was cut to a first screen and a site (``docs/``, built by ``make docs``); the text moved to pages
rather than being lost. ``OLD_HEADINGS`` are the headings of the README before the cut: each must still be a
heading somewhere in ``docs/`` or the README. A page that names a path or a dotted module that is not in the
tree sends a newcomer nowhere, so those are checked too.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("lifecycle", "engines", "rollout", "trainer")

# Every `#`, `##` and `###` heading of the README before the docs site (code blocks' comments excluded).
OLD_HEADINGS = [
    "rl-lifecycle",
    "What is here",
    "The command line",
    "The public API (embedding the lifecycle in your own loop)",
    "Predicates (the only guards)",
    "The machines",
    "Engines: real processes behind the engine machine",
    "The gateway: SMG in the rollout path",
    "Engine backends: SGLang's API and real vLLM servers (`--rollout-backend sglang|vllm`)",
    "A GPU host: `scripts/gpu_check.py`",
    "The RL loop (`lifecycle run`)",
    "Observability: metrics, the live invariant monitor, the run timeline",
    "Reliability: faults, the matrix, nothing lost",
    "Bad input: one paragraph, nothing lost",
    "Invariants, and how they are checked",
    "Mutation proof: the miles bugs, re-introduced",
    "Measured (this 2-core machine, ratios from the same run)",
    "Tests",
    "Design notes (where the code and `DESIGN.md` differ)",
]
# A heading whose old wording was wrong keeps its section under a corrected name: the design brief is not a file
# of this repository.
RENAMED = {
    "Design notes (where the code and `DESIGN.md` differ)": "Design notes (where the code and the design brief differ)",
}

FENCE = re.compile(r"^```.*?^```", re.M | re.S)
HEADING = re.compile(r"^#{1,6} (.+?)\s*$", re.M)
CODE_SPAN = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
PATH = re.compile(
    r"(?<![\w./-])((?:tests|benchmarks|scripts|examples|docs|lifecycle|engines|rollout|trainer)/[\w./*-]*)"
)
DOTTED = re.compile(r"(?<![\w./-])((?:lifecycle|engines|rollout|trainer)(?:\.[A-Za-z_]\w*)+)")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def headings(text: str) -> set[str]:
    return set(HEADING.findall(FENCE.sub("", text)))


def mentions(text: str) -> tuple[set[str], set[str]]:
    """The paths and dotted module names a page's code (spans and blocks) and link targets name."""
    code = CODE_SPAN.findall(FENCE.sub("", text)) + FENCE.findall(text) + LINK.findall(text)
    paths = {m.rstrip(".,:;") for chunk in code for m in PATH.findall(chunk)}
    dotted = {m for chunk in code for m in DOTTED.findall(chunk)}
    return paths, dotted


def path_exists(path: str) -> bool:
    if "*" in path:
        return any(ROOT.glob(path))
    return (ROOT / path).exists()


def module_of(dotted: str) -> tuple[Path, list[str]] | None:
    """The longest prefix of ``dotted`` that is a module of the tree, and the names after it."""
    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:k])
        for candidate in (base / "__init__.py", base.with_suffix(".py")):
            if candidate.is_file():
                return candidate, parts[k:]
    return None


def dotted_is_real(dotted: str) -> bool:
    """A module, or a module and a name its source defines or re-exports.

    A two-part name that is no module (``lifecycle.started``, ``rollout.init``) is an event or a trigger of
    the same spelling, not a claim about the code: it is not judged."""
    found = module_of(dotted)
    if found is None:
        return False
    source, rest = found
    if not rest:
        return True
    if len(dotted.split(".")) == 2:
        return True
    return re.search(rf"\b{re.escape(rest[0])}\b", source.read_text()) is not None


def test_every_old_readme_heading_is_a_heading_of_the_docs_or_the_readme():
    found = set().union(*(headings(p.read_text()) for p in pages()))
    missing = [h for h in OLD_HEADINGS if RENAMED.get(h, h) not in found]
    assert not missing, f"sections of the old README that no page holds: {missing}"


def test_the_readme_stays_a_first_screen():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    for stale in (
        "built with\n[`transitions`]",
        "built with [`transitions`]",
        "DESIGN.md` differ",
        "mirrors the packages (`tests/lifecycle/`, …, `tests/trainer/`)",
    ):
        assert stale not in readme


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_and_module_a_page_names_is_in_the_tree(page: Path):
    paths, dotted = mentions(page.read_text())
    missing = sorted(p for p in paths if not path_exists(p))
    unknown = sorted(d for d in dotted if not dotted_is_real(d))
    assert not missing and not unknown, f"{page.relative_to(ROOT)} names what is not in the tree: {missing + unknown}"


def test_the_readme_links_point_at_pages_that_exist():
    for target in LINK.findall((ROOT / "README.md").read_text()):
        if "://" in target or target.startswith("#"):
            continue
        assert (ROOT / target.split("#")[0]).exists(), target
