#!/usr/bin/env python
"""GPU host check: the project's own loop against real SGLang or vLLM servers on a GPU. Not part of CI.

What it runs: ``trainer.app.loop.run`` -- the loop ``lifecycle run`` runs -- with every rollout engine a real
SGLang server (``engines.sglang.SGLangBackend``) started on a Hugging Face checkpoint directory (the tiny
Llama the project builds, or ``--hf-checkpoint DIR``), the real SMG gateway in the path, the
trainer on CPU writing one checkpoint directory per step that the servers load with
``/update_weights_from_disk``. What it checks, and prints as one JSON report (also ``RUN_DIR/gpu_check.json``):

* the run completes: every step's weight update reached every server (the loop's own checks: a server
  whose ``/model_info`` does not report the pushed version is marked, and without rollout FT stops the run);
* the event log shows ``route_traffic``/``stop_routing`` as effects of the engines' transitions;
* the reward of the last steps is not below the first steps' (a tiny model on few steps: a smoke check,
  not a learning benchmark).

``--rollout-backend vllm``: every engine a real ``vllm.entrypoints.openai.api_server`` on the GPU
(``--rollout-device cuda``: its sleep mode may offload, so ``--offload`` is accepted there), launched by
``engines.vllm.launcher`` from the python of an environment with vLLM and this package installed
(``--vllm-python``; the package's ``vllm.general_plugins`` entry registers our transfer engine), routed
through the SMG gateway (its /v1/completions), updated in vLLM's own weight-update session.

Needs: a CUDA GPU and, for SGLang, ``pip install 'rl-lifecycle[sglang,router,hf]'`` (sglang pins its own torch:
use a separate environment from the CPU one); for vLLM, ``pip install vllm`` and ``pip install -e .`` in an
environment of their own, and ``rl-lifecycle[hf]`` in this one. Examples::

    python scripts/gpu_check.py --engines 2 --steps 8
    python scripts/gpu_check.py --rollout-backend vllm --vllm-python /opt/vllm-env/bin/python --offload
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import time
from pathlib import Path
from typing import Any


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--engines", type=int, default=2, help="SGLang servers (one GPU share each; default 2)")
    p.add_argument("--steps", type=int, default=8, help="RL steps (default 8)")
    p.add_argument(
        "--hf-checkpoint", default=None, metavar="DIR", help="start from this HF directory (default: build tiny-llama)"
    )
    p.add_argument("--run-dir", default=None, metavar="DIR", help="output folder (default runs/gpu-check-<time>)")
    p.add_argument("--mem-fraction-static", type=float, default=None, help="per server (default 0.8 / engines)")
    p.add_argument("--startup-timeout", type=float, default=900.0, help="seconds per server start (default 900)")
    p.add_argument(
        "--sglang-arg",
        action="append",
        default=None,
        metavar="ARG",
        help="extra sglang.launch_server argument (repeatable); default: --attention-backend torch_native "
        "--disable-cuda-graph (the tiny model's head size suits no fused kernel)",
    )
    p.add_argument(
        "--rollout-backend", choices=("sglang", "vllm"), default="sglang", help="the servers (default sglang)"
    )
    p.add_argument("--vllm-python", default=None, metavar="PATH", help="vLLM: its environment's python")
    p.add_argument("--offload", action="store_true", help="release engine memory around every training step")
    ns = p.parse_args(argv)

    from engines.engine import Timeouts
    from engines.models import build_tiny_llama
    from engines.sglang import SGLangBackend, SGLangServerArgs, require_sglang
    from lifecycle.decide.config import LifecycleConfig
    from lifecycle.decide.events import read_jsonl
    from trainer.app.loop import VLLM_TINY_LLAMA, RunOptions, run

    vllm = ns.rollout_backend == "vllm"
    if not vllm:
        require_sglang()
    run_dir = Path(ns.run_dir or f"runs/gpu-check-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    sizes = VLLM_TINY_LLAMA if vllm else {}
    checkpoint = Path(ns.hf_checkpoint).resolve() if ns.hf_checkpoint else build_tiny_llama(run_dir / "model", **sizes)
    config = LifecycleConfig.from_mapping(
        {
            "rollout_num_gpus": ns.engines,
            "rollout_backend": ns.rollout_backend,
            "rollout_device": "cuda",
            "offload_rollout": ns.offload,
        }
    )
    default_extra = ["--attention-backend", "torch_native", "--disable-cuda-graph"]
    extra = ns.sglang_arg if ns.sglang_arg is not None else default_extra
    fraction = ns.mem_fraction_static or round(0.8 / ns.engines, 3)

    def launcher(engine_id: str) -> SGLangBackend:
        args = SGLangServerArgs.from_config(
            config,
            str(checkpoint),
            _free_port(),
            mem_fraction_static=fraction,
            weight_version="0",
            random_seed=0,
            extra_args=extra,
        )
        return SGLangBackend(engine_id, args, startup_timeout=ns.startup_timeout, log_path=run_dir / f"{engine_id}.log")

    opts = RunOptions(
        steps=ns.steps,
        run_dir=run_dir,
        hf_checkpoint=checkpoint,
        engine_launcher=None if vllm else launcher,  # vLLM: the Job launches --rollout-backend's servers
        router=True,
        timeouts=Timeouts(startup=ns.startup_timeout, request=120.0, death=30.0),
        vllm_python=ns.vllm_python,
    )
    t0 = time.monotonic()
    result = run(config, opts)
    events = read_jsonl(run_dir / "events.jsonl")
    effects = {e for ev in events for e in ev.get("effects", ()) if ev.get("machine") == "engine"}
    last = [m for m in result.metrics if m.get("step") == ns.steps - 1]
    report: dict[str, Any] = {
        "engines": ns.engines,
        "steps": ns.steps,
        "checkpoint": str(checkpoint),
        "seconds": round(time.monotonic() - t0, 1),
        "reward_first5": round(result.first5, 4),
        "reward_last5": round(result.last5, 4),
        "route_effects": sorted(effects & {"route_traffic", "stop_routing"}),
        "last_step": last[-1] if last else None,
    }
    problems = []
    if not vllm and {"route_traffic", "stop_routing"} - effects:
        problems.append("route_traffic/stop_routing missing from the engines' transitions")
    if result.last5 < result.first5:
        problems.append("the reward fell")
    report["problems"] = problems
    (run_dir / "gpu_check.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
