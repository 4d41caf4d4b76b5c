"""Benchmark P10: a resume that re-adopts the engines a dead driver left (``--detach-engines``) against one that
relaunches them, measured as the time from ``lifecycle run --resume`` starting to its first engine being routed
again -- what a driver's death costs the fleet. Same job, same Ray cluster (``ray start --head``, outliving every
driver), same run of this script: the ratio relaunch / re-adopt is the figure.

Per backend and mode: a ``lifecycle run`` that SIGKILLs itself at a step's start right after a job checkpoint
(``kill-driver``), then the timed ``lifecycle run --resume``. The CPU engine (SGLang's API) starts in seconds;
a vLLM server takes tens of seconds here and minutes for a large model on a GPU, which is where re-adoption pays.

Run: python benchmarks/bench_resume.py [--backend sglang|vllm|both] [--rounds R]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _events(path: Path) -> list[dict[str, Any]]:
    from lifecycle.decide.events import read_jsonl

    return read_jsonl(path)


def _seconds(ts: str) -> float:
    return dt.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


def one(backend: str, mode: str, address: str, env: dict[str, str], base: Path) -> float:
    """Seconds from the resume's start to its first routed engine."""
    run_dir = base / f"{backend}-{mode}-{time.monotonic_ns()}"
    flags = ["--steps", "3", "--run-dir", str(run_dir), "--save", str(run_dir / "ckpt"), "--save-interval", "1"]
    flags += ["--quiet", "--ray-address", address]
    if backend == "vllm":
        flags += ["--rollout-backend", "vllm", "--model", "tiny-llama"]
    if mode == "re-adopt":
        flags += ["--detach-engines", "--engine-lease", "120"]
    cli = [sys.executable, "-m", "lifecycle.cli", "run"]
    died = subprocess.run([*cli, *flags, "--inject", "kill-driver:0@2"], capture_output=True, text=True, env=env)
    if died.returncode != -9:
        raise SystemExit(f"{backend}/{mode}: the first driver did not die as planned:\n{died.stderr[-2000:]}")
    t0 = time.time()
    resume = [*cli, "--resume", str(run_dir), "--quiet", "--ray-address", address]
    resumed = subprocess.run(resume, capture_output=True, text=True, env=env)
    if resumed.returncode != 0:
        raise SystemExit(f"{backend}/{mode}: the resume failed (exit {resumed.returncode}):\n{resumed.stderr[-2000:]}")
    events = _events(run_dir / "events.jsonl")
    start = next(i for i, e in enumerate(events) if e["event"] == "job.resumed")
    routed = next(e for e in events[start:] if e["event"] == "engine.routed")
    adopted = [e for e in events[start:] if e["event"] == "engine.adopted" and e.get("outcome") == "adopted"]
    if (mode == "re-adopt") != bool(adopted):
        raise SystemExit(f"{backend}/{mode}: adopted {len(adopted)} engines")
    return _seconds(routed["ts"]) - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", choices=("sglang", "vllm", "both"), default="sglang")
    ap.add_argument("--rounds", type=int, default=2, help="resumes per backend and mode (the median is kept)")
    args = ap.parse_args()
    from engines.actor import ray_head

    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    with tempfile.TemporaryDirectory(prefix="bench-resume-") as tmp, ray_head(str(Path(tmp) / "ray")) as address:
        base = Path(tmp)
        backends = ("sglang", "vllm") if args.backend == "both" else (args.backend,)
        print("P10: a driver's death -- seconds from `lifecycle run --resume` to the first routed engine")
        for backend in backends:
            times: dict[str, list[float]] = {"relaunch": [], "re-adopt": []}
            for _ in range(args.rounds):  # alternate: the machine's load drifts
                for mode in times:
                    times[mode].append(one(backend, mode, address, env, base))
            relaunch, adopt = statistics.median(times["relaunch"]), statistics.median(times["re-adopt"])
            print(
                f"  {backend:6}  relaunch {relaunch:6.2f} s   re-adopt {adopt:6.2f} s   "
                f"ratio {relaunch / adopt:5.2f}x   (runs: {times})"
            )


if __name__ == "__main__":
    main()
