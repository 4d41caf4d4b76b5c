"""What `pip install rl-lifecycle` puts on a user's import path, and that it lives beside a user's own code.

Most ML projects have a ``models/`` (or ``telemetry/``...) package of their own; whichever comes first on
``sys.path`` wins, on the driver and again on every Ray worker (Ray puts the driver's directory on the
workers' path). So the wheel must hold only the card's four packages, and none of our code may import a
top-level name it does not own. Both are checked against a wheel built from a clean copy of the tree (as
from a fresh clone: a stale ``build/`` in the checkout leaks old modules into a wheel), and the README's
embedding example runs from a user project whose ``models/``, ``telemetry/``, ``cpu_engine/`` and
``sim_engine/`` raise on import and leave a mark, with the wheel's files (not the checkout) on its path.
"""

from __future__ import annotations

import ast
import configparser
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
import zipfile
from collections.abc import Iterable, Iterator
from importlib.metadata import version
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OURS = {"lifecycle", "engines", "rollout", "trainer"}
# the names the four folded-in packages had: a user's own packages of these names must never be imported
USERS = ("models", "telemetry", "cpu_engine", "sim_engine")
MARKER = "LIFECYCLE_INSTALL_TEST"  # in the environment of every process the user's run spawns


def top_level_names(wheel_files: Iterable[str]) -> set[str]:
    """The names a wheel installs at the top of site-packages (what lands on a user's import path)."""
    names = set()
    for name in wheel_files:
        parts = name.split("/")
        if parts[0].endswith(".data") and len(parts) > 2 and parts[1] in ("purelib", "platlib"):
            parts = parts[2:]  # installed into site-packages as well
        elif parts[0].endswith((".dist-info", ".data")):
            continue
        head = parts[0]
        names.add(head.removesuffix(".py") if len(parts) == 1 else head)
    return names


def _source_tree(dest: Path) -> Path:
    """A copy of the checkout as a fresh clone has it: tracked and new files, nothing git ignores."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for rel in filter(None, listed.split("\0")):
        src = ROOT / rel
        if src.is_file():  # a tracked file deleted in the work tree is not part of it
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the source copy, the wheel built from it with ``pip wheel --no-deps``)."""
    base = tmp_path_factory.mktemp("wheel")
    source = _source_tree(base / "src")
    # offline and fast with the environment's setuptools when it meets [build-system]; else pip's isolation
    have = tuple(int(x) for x in re.findall(r"\d+", version("setuptools"))[:1])
    isolation = ["--no-build-isolation"] if have >= (77,) else []
    out = base / "dist"
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-w", str(out), str(source)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (wheel,) = out.glob("rl_lifecycle-*.whl")
    return source, wheel


def _wheel_files(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        return [n for n in z.namelist() if not n.endswith("/")]


def _dist_info(wheel: Path, name: str) -> str:
    with zipfile.ZipFile(wheel) as z:
        (path,) = [n for n in z.namelist() if n.split("/")[0].endswith(".dist-info") and n.endswith("/" + name)]
        return z.read(path).decode()


def test_top_level_names_sees_every_kind_of_extra() -> None:
    """The check below can fail: a stray package, module or purelib entry is reported by name."""
    files = [
        "lifecycle/__init__.py",
        "models/__init__.py",
        "telemetry.py",
        "x-1.data/purelib/cpu_engine/__init__.py",
        "x-1.data/scripts/lifecycle",
        "x-1.dist-info/RECORD",
    ]
    assert top_level_names(files) == {"lifecycle", "models", "telemetry", "cpu_engine"}


def test_the_wheel_holds_exactly_the_four_packages(built: tuple[Path, Path]) -> None:
    _, wheel = built
    files = _wheel_files(wheel)
    assert top_level_names(files) == OURS
    assert set(_dist_info(wheel, "top_level.txt").split()) == OURS


def test_the_wheel_holds_every_file_of_the_four_packages(built: tuple[Path, Path]) -> None:
    """Every module and data file of the source packages is in the wheel (a sub-package without
    ``__init__.py`` or a data file missing from package-data would be silently left out)."""
    source, wheel = built
    in_source = {
        p.relative_to(source).as_posix()
        for pkg in OURS
        for p in (source / pkg).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    shipped = {n for n in _wheel_files(wheel) if n.split("/")[0] in OURS}
    assert shipped == in_source, {"missing": sorted(in_source - shipped), "extra": sorted(shipped - in_source)}
    for pkg in OURS:
        assert f"{pkg}/py.typed" in shipped  # type checkers read the annotations of the installed package
    assert [n for n in shipped if re.fullmatch(r"lifecycle/defaults/[^/]+\.toml", n)]
    assert [n for n in shipped if n.startswith("lifecycle/graph/assets/")]


def _defines(source: str, attr: str) -> bool:
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and node.name == attr:
            return True
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == attr for t in node.targets):
            return True
        if isinstance(node, ast.ImportFrom | ast.Import) and any((a.asname or a.name) == attr for a in node.names):
            return True
    return False


def test_every_entry_point_names_a_function_in_the_wheel(built: tuple[Path, Path]) -> None:
    _, wheel = built
    files = set(_wheel_files(wheel))
    parser = configparser.ConfigParser(delimiters=("=",))
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(_dist_info(wheel, "entry_points.txt"))
    points = {(group, name): parser[group][name] for group in parser.sections() for name in parser[group]}
    assert {("console_scripts", "lifecycle"), ("console_scripts", "lifecycle-torch-engine")} <= set(points)
    assert ("rl_lifecycle.commands", "run") in points
    with zipfile.ZipFile(wheel) as z:
        for (group, name), target in points.items():
            module, _, attr = target.partition(":")
            path = module.replace(".", "/")
            found = [p for p in (f"{path}.py", f"{path}/__init__.py") if p in files]
            assert found, f"[{group}] {name} = {target}: no module {module} in the wheel"
            assert _defines(z.read(found[0]).decode(), attr), f"[{group}] {name} = {target}: {module} has no {attr}"


# ---- the README's embedding example, run from a user's project against the installed wheel ----


def readme_example() -> str:
    """The README's embedding example: the python block with the user's own ``async def main(`` loop."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    found = [b for b in blocks if "async def main(" in b and "asyncio" in b]
    assert found, "README lost its embedding example (a python block with `async def main(`)"
    return found[0]


RUNNER = """\
import asyncio, importlib.util, json, sys

import ray

import engines, lifecycle, rollout, trainer
from user_job import main

rewards = asyncio.run(main(steps=1, run_dir=sys.argv[1]))


@ray.remote
def where() -> dict:
    # where a Ray worker would find each name (find_spec does not import: nothing is marked)
    return {n: getattr(importlib.util.find_spec(n), "origin", None) for n in sys.argv[2:]}


print("RESULT " + json.dumps({
    "rewards": rewards,
    "ours": {m.__name__: m.__file__ for m in (engines, lifecycle, rollout, trainer)},
    "worker_sees": ray.get(where.remote()),
}))
"""


def _user_project(base: Path) -> Path:
    """A user's project: its own packages named like our old ones (each raising, and leaving a mark, when
    imported), its own trainer backend module, the README's example as its job and a runner."""
    project = base / "project"
    for name in USERS:
        (project / name).mkdir(parents=True)
        (project / name / "__init__.py").write_text(
            "import os, pathlib\n"
            f"pathlib.Path(__file__).parents[1].joinpath('imported-{name}-' + str(os.getpid())).touch()\n"
            f'raise ImportError("the user\'s own {name} was imported")\n'
        )
    (project / "examples").mkdir()  # the README's BackendSpec names examples.embed_reverse: here, the user's own
    shutil.copy2(ROOT / "examples" / "embed_reverse.py", project / "examples" / "embed_reverse.py")
    (project / "user_job.py").write_text(readme_example())
    (project / "run_job.py").write_text(RUNNER.replace("sys.argv[2:]", repr(list(USERS))))
    return project


def _marked_pids(token: str) -> set[int]:
    needle = f"{MARKER}={token}".encode()
    found = set()
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, IndexError):
            live = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z" if entry.name.isdigit() else False
            if live and needle in (entry / "environ").read_bytes().split(b"\0"):
                found.add(int(entry.name))
    return found


@pytest.fixture
def user_env(built: tuple[Path, Path], tmp_path: Path) -> Iterator[dict[str, str]]:
    """The environment of a user's run: the wheel installed (its files first after the user's project, before
    the development checkout's editable install), no cluster to join, and a marker; no marked process (Ray's,
    the engines') outlives the test."""
    _, wheel = built
    site = tmp_path / "site"
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "--target", str(site), str(wheel)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    token = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RAY_ADDRESS")}
    yield {**env, "PYTHONPATH": str(site), MARKER: token, "PYTHONUNBUFFERED": "1"}
    deadline = time.monotonic() + 30  # the driver shut Ray down as it exited: give its processes a moment
    while _marked_pids(token) and time.monotonic() < deadline:
        time.sleep(0.5)
    for pid in _marked_pids(token):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_the_users_packages_are_live_on_its_path(tmp_path: Path) -> None:
    """The witness for the test below: in the user's project, ``import models`` (etc.) reaches the user's
    package and marks it -- so a run with no mark and no error never imported them."""
    project = _user_project(tmp_path)
    for name in USERS:
        done = subprocess.run([sys.executable, "-c", f"import {name}"], cwd=project, capture_output=True, text=True)
        assert done.returncode == 1 and f"the user's own {name} was imported" in done.stderr, done.stderr
        assert list(project.glob(f"imported-{name}-*"))


@pytest.mark.slow
def test_the_readme_example_runs_beside_a_users_own_packages(tmp_path: Path, user_env: dict[str, str]) -> None:
    project = _user_project(tmp_path)
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "run_job.py", str(run_dir)],
        cwd=project,  # the user's packages first on the driver's path, and Ray's workers get this directory
        env=user_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
    assert "was imported" not in err, err[-5000:]
    assert proc.returncode == 0, err[-5000:]
    (line,) = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    result = json.loads(line.removeprefix("RESULT "))
    assert len(result["rewards"]) == 1 and 0.0 <= result["rewards"][0] <= 1.0
    site = Path(user_env["PYTHONPATH"])
    assert all(Path(f).is_relative_to(site) for f in result["ours"].values()), result["ours"]  # the wheel's code ran
    # the Ray workers had the user's packages on their path too: with no mark, no process imported them
    assert result["worker_sees"] == {n: str(project / n / "__init__.py") for n in USERS}, result["worker_sees"]
    assert not list(project.glob("imported-*")), sorted(p.name for p in project.glob("imported-*"))
    assert (run_dir / "events.jsonl").is_file()
