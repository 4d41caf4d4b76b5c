#!/usr/bin/env python
"""Proof that our vLLM weight-transfer engines (engines/vllm/plugin.py) drive real vLLM servers on CPU. Not CI.

Runs in the vLLM environment (``.venv-vllm``, with our package installed there: ``pip install --no-deps -e .``
plus ``transitions`` and ``structlog``, which ``engines.models`` imports through ``lifecycle``)::

    .venv-vllm/bin/python scripts/vllm_plugin_check.py [--keep DIR] [--either]

It builds tiny Llama checkpoints A and B (two seeds) and two wrong ones with the main venv, then starts two
real ``vllm.entrypoints.openai.api_server`` processes (each in its own session; the groups are killed at the
end): S1 on A with ``lifecycle_disk``, S2 on B with ``lifecycle_gloo``.

- disk (S1): start / update {"path": B} / finish "1": /weight_info "1"; /weight_checker checksums equal
  S2's (a server that loaded B itself); the temperature-0 completion (token ids + logprobs) equals S2's;
  between update and finish the server still answers with A's weights (updates are staged).
- disk failures (S1): a missing path, a checkpoint of other shapes, another architecture, a broadcast bucket
  sent to a disk-only backend: the HTTP status/body of each, then /health, /weight_info, checksums and the
  completion unchanged, and what /finish_weight_update answers after the failed update.
- gloo (S2): this process is rank 0 of a WeightGroup (as trainer worker 0 is) and broadcasts A's tensors
  bucket by bucket while S2's /update_weights receives them; after finish "g1" S2's checksums equal S1's
  initial ones (A loaded from disk) and its completion equals A's.
- gloo failures (S2): a trainer process killed mid-bucket, and a trainer that stays silent: each
  /update_weights fails within the group timeout; health, version and weights unchanged.
- ``--either``: afterwards S3 on A with the combined backend ``lifecycle`` does a disk and a gloo update.

Prints one PASS/FAIL line per check and a JSON summary (timings included); exit status 1 if any check failed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from safetensors.torch import load_file

from engines.models.weight_group import WeightGroup, buckets, dtype_name, metas_of

ROOT = Path(__file__).resolve().parent.parent
MAIN_PY = ROOT / ".venv" / "bin" / "python"
PROMPT = [1, 10, 20, 30, 40, 50, 60, 70]  # token ids: the checkpoints' tokenizers differ with the seed
SIZES = "hidden_size=128, num_attention_heads=2, num_key_value_heads=2, intermediate_size=256"
RESULTS: list[tuple[str, bool, str]] = []
SUMMARY: dict[str, Any] = {}


def check(name: str, ok: bool, detail: Any = "") -> bool:
    RESULTS.append((name, bool(ok), str(detail)))
    print(f"{'PASS' if ok else 'FAIL'} {name}" + (f" -- {detail}" if detail != "" else ""), flush=True)
    return bool(ok)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def build(directory: Path, seed: int, sizes: str = SIZES) -> None:
    call = f"build_tiny_llama({str(directory)!r}, seed={seed}, {sizes})"
    code = f"from engines.models.tiny_llama import build_tiny_llama; {call}"
    subprocess.run([str(MAIN_PY), "-c", code], cwd=ROOT, check=True)


class Server:
    def __init__(self, name: str, model: Path, backend: str, logs: Path) -> None:
        self.name, self.model, self.port = name, model, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = logs / f"{name}.log"
        cmd = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
            "--dtype", "float32", "--max-model-len", "128", "--host", "127.0.0.1", "--port", str(self.port),
            "--gpu-memory-utilization", "0.05", "--weight-transfer-config", json.dumps({"backend": backend}),
        ]  # fmt: skip
        env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1"}
        self.started = time.monotonic()
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.start_s: float | None = None

    def wait_healthy(self, limit: float = 420.0) -> float:
        while time.monotonic() - self.started < limit:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; see {self.log}")
            try:
                if self.request("GET", "/health", timeout=5)[0] == 200:
                    self.start_s = round(time.monotonic() - self.started, 1)
                    return self.start_s
            except OSError:
                pass
            time.sleep(1.0)
        raise RuntimeError(f"{self.name} not healthy within {limit:g}s; see {self.log}")

    def request(self, method: str, path: str, body: Any = None, timeout: float = 300.0) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                raw = r.read()
                status = r.status
        except urllib.error.HTTPError as e:
            raw, status = e.read(), e.code
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode(errors="replace")

    def ok(self, method: str, path: str, body: Any = None, timeout: float = 300.0) -> Any:
        status, out = self.request(method, path, body, timeout)
        if status != 200:
            raise RuntimeError(f"{self.name} {method} {path} -> {status} {out}")
        return out

    def version(self) -> str:
        return str(self.ok("GET", "/weight_info")["weight_version"])

    def checksums(self) -> dict[str, str]:
        return dict(self.ok("POST", "/weight_checker", {"action": "checksum"})["checksums"])

    def complete(self) -> tuple[list[int], list[float]]:
        body = {
            "model": str(self.model), "prompt": PROMPT, "max_tokens": 8, "temperature": 0,
            "logprobs": 0, "return_token_ids": True, "ignore_eos": True,
        }  # fmt: skip
        choice = self.ok("POST", "/v1/completions", body)["choices"][0]
        return list(choice["token_ids"]), [float(x) for x in choice["logprobs"]["token_logprobs"]]

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=20)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)  # workers left behind by the group


def same(a: tuple[list[int], list[float]], b: tuple[list[int], list[float]], tol: float = 1e-4) -> bool:
    return a[0] == b[0] and len(a[1]) == len(b[1]) and all(abs(x - y) <= tol for x, y in zip(a[1], b[1], strict=True))


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t = time.monotonic()
    out = fn()
    return out, round(time.monotonic() - t, 2)


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def run() -> None:
        t = time.monotonic()
        try:
            box["out"] = fn()
        except BaseException as exc:
            box["err"] = exc
        box["s"] = round(time.monotonic() - t, 2)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


def unchanged(s: Server, label: str, version: str, sums: dict[str, str], answer: Any) -> None:
    check(f"{label}: /health 200 afterwards", s.request("GET", "/health", timeout=10)[0] == 200)
    check(f"{label}: /weight_info still {version!r}", s.version() == version, s.version())
    check(f"{label}: weights unchanged (checksums)", s.checksums() == sums)
    check(f"{label}: completion unchanged", same(s.complete(), answer))


# -- disk --------------------------------------------------------------------------------------------------
def disk_phase(s1: Server, s2: Server, ckpt: dict[str, Path]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    a_sums, a_answer = s1.checksums(), s1.complete()
    b_sums, b_answer = s2.checksums(), s2.complete()
    check("A and B differ (checksums and completion)", a_sums != b_sums and not same(a_answer, b_answer))
    check("S1 /weight_info is 'default' at start", s1.version() == "default", s1.version())

    _, out["start_s"] = timed(lambda: s1.ok("POST", "/start_weight_update"))
    _, out["update_s"] = timed(lambda: s1.ok("POST", "/update_weights", {"update_info": {"path": str(ckpt["B"])}}))
    check("disk: staged update leaves A serving until finish", same(s1.complete(), a_answer))
    check("disk: version unpublished before finish", s1.version() == "default", s1.version())
    _, out["finish_s"] = timed(lambda: s1.ok("POST", "/finish_weight_update", {"weight_version": "1"}))
    check("disk: /weight_info == '1' after finish", s1.version() == "1", s1.version())
    sums = s1.checksums()
    check("disk: checksums equal a server started on B", sums == b_sums, f"{len(sums)} tensors")
    cmp = s1.ok("POST", "/weight_checker", {"action": "compare", "baseline": b_sums})
    check("disk: /weight_checker compare with B's baseline matches", cmp.get("match") is True, cmp)
    check("disk: completion now equals B's", same(s1.complete(), b_answer))

    failures: dict[str, Any] = {}
    bad = {
        "missing_path": {"path": str(ckpt["B"].parent / "no-such-checkpoint")},
        "other_shapes": {"path": str(ckpt["C"])},
        "other_architecture": {"path": str(ckpt["D"])},
        "bucket_to_disk_backend": {"names": ["lm_head.weight"], "dtype_names": ["float32"], "shapes": [[128, 128]]},
    }
    for label, info in bad.items():
        s1.ok("POST", "/start_weight_update")
        (status, body), secs = timed(lambda info=info: s1.request("POST", "/update_weights", {"update_info": info}))
        fin = s1.request("POST", "/finish_weight_update", {"weight_version": "bad"})
        failures[label] = {"update_status": status, "update_body": body, "update_s": secs, "finish_after": fin}
        check(f"disk failure {label}: /update_weights is an error", status >= 400, f"{status} {body}")
        check(f"disk failure {label}: finish afterwards refused", fin[0] >= 400, fin)
        unchanged(s1, f"disk failure {label}", "1", sums, b_answer)
    # a second start inside a session, then the abort: staged A is dropped, B and version "1" stay
    s1.ok("POST", "/start_weight_update")
    s1.ok("POST", "/update_weights", {"update_info": {"path": str(ckpt["A"])}})
    again = s1.request("POST", "/start_weight_update")
    abort = s1.request("POST", "/update_weights", {"update_info": {"abort": True}})
    fin = s1.request("POST", "/finish_weight_update", {"weight_version": "bad"})
    failures["start_twice"], failures["abort"] = again, {"update": abort, "finish_after": fin}
    check("disk: a second start inside a session is refused", again[0] >= 400, again)
    check("disk: update_info {'abort': true} ends the session", abort[0] >= 400 and fin[0] >= 400, abort)
    unchanged(s1, "disk abort", "1", sums, b_answer)
    # a new session after the failures still works (back to A)
    s1.ok("POST", "/start_weight_update")
    s1.ok("POST", "/update_weights", {"update_info": {"path": str(ckpt["A"])}})
    s1.ok("POST", "/finish_weight_update", {"weight_version": "2"})
    check("disk: a session after the failures works (back to A)", s1.checksums() == a_sums and s1.version() == "2")
    out["failures"] = failures
    out["a_sums"], out["a_answer"] = a_sums, a_answer
    return out


# -- gloo --------------------------------------------------------------------------------------------------
TRAINER_DIES = """
import os, sys
from safetensors.torch import load_file
from engines.models.weight_group import WeightGroup
port, path, names, k = int(sys.argv[1]), sys.argv[2], sys.argv[3].split(","), int(sys.argv[4])
state = load_file(path)
g = WeightGroup("127.0.0.1", port, 0, 2, timeout=30.0, name="weight_update_group")
print("joined", flush=True)
sys.stdin.readline()  # go: the engine's /update_weights is in flight
g.broadcast([state[n] for n in names[:k]])
os._exit(1)  # dies mid-bucket
"""


def join(s: Server, timeout: float) -> tuple[WeightGroup, dict[str, Any]]:
    port = free_port()
    info = {"address": "127.0.0.1", "port": port, "rank": 1, "world_size": 2, "timeout": timeout}
    t, box = in_thread(lambda: s.request("POST", "/init_weight_transfer_engine", {"init_info": info}, timeout + 30))
    group = WeightGroup("127.0.0.1", port, 0, 2, timeout=timeout, name="weight_update_group")
    t.join()
    return group, box


def gloo_phase(s2: Server, ckpt: dict[str, Path], a_sums: dict[str, str], a_answer: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    state = load_file(str(ckpt["A"] / "model.safetensors"))
    plan = buckets(metas_of(state), 256 * 1024)
    b_sums, b_answer = s2.checksums(), s2.complete()
    (group, box), out["init_s"] = timed(lambda: join(s2, 30.0))
    check("gloo: /init_weight_transfer_engine joins the trainer's group", box.get("out", (0,))[0] == 200, box)
    s2.ok("POST", "/start_weight_update")
    t0 = time.monotonic()
    for bucket in plan:
        info = {"names": [m.name for m in bucket], "dtype_names": [m.dtype for m in bucket],
                "shapes": [list(m.shape) for m in bucket]}  # fmt: skip
        t, box = in_thread(lambda info=info: s2.request("POST", "/update_weights", {"update_info": info}))
        group.broadcast([state[m.name] for m in bucket])
        t.join()
        if box.get("out", (0,))[0] != 200:
            check("gloo: every bucket's /update_weights 200", False, box)
            break
    out["buckets"], out["update_s"] = len(plan), round(time.monotonic() - t0, 2)
    _, out["finish_s"] = timed(lambda: s2.ok("POST", "/finish_weight_update", {"weight_version": "g1"}))
    check("gloo: /weight_info == 'g1'", s2.version() == "g1", s2.version())
    check("gloo: checksums equal A loaded from disk (tensor for tensor)", s2.checksums() == a_sums)
    check("gloo: completion equals A's", same(s2.complete(), a_answer))
    group.close()
    s2.ok("POST", "/shutdown_weight_transfer_engine")

    # trainer process killed mid-bucket
    failures: dict[str, Any] = {}
    port = free_port()
    big = max(plan, key=len)
    names = ",".join(m.name for m in big)
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER_DIES, str(port), str(ckpt["B"] / "model.safetensors"), names, "1"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
    )  # fmt: skip
    info = {"address": "127.0.0.1", "port": port, "rank": 1, "world_size": 2, "timeout": 30.0}
    assert s2.request("POST", "/init_weight_transfer_engine", {"init_info": info}, 60)[0] == 200
    assert trainer.stdout is not None and trainer.stdin is not None
    trainer.stdout.readline()
    s2.ok("POST", "/start_weight_update")
    upd = {"names": [m.name for m in big], "dtype_names": [m.dtype for m in big],
           "shapes": [list(m.shape) for m in big]}  # fmt: skip
    t, box = in_thread(lambda: s2.request("POST", "/update_weights", {"update_info": upd}, 120))
    time.sleep(1.0)
    trainer.stdin.write("go\n")
    trainer.stdin.flush()
    trainer.wait(30)
    t.join(120)
    status, body = box.get("out", (None, box.get("err")))
    failures["trainer_killed"] = {"update_status": status, "update_body": body, "update_s": box.get("s")}
    failed = status is not None and status >= 400
    check("gloo failure trainer_killed: /update_weights fails", failed, f"{status} {body}")
    check("gloo failure trainer_killed: within the 30 s group timeout", (box.get("s") or 1e9) < 30, box.get("s"))
    failures["trainer_killed"]["finish_after"] = s2.request("POST", "/finish_weight_update", {"weight_version": "bad"})
    unchanged(s2, "gloo failure trainer_killed", "g1", a_sums, a_answer)

    # trainer alive but silent: the engine's deadline (5 s here)
    group, box = join(s2, 5.0)
    s2.ok("POST", "/start_weight_update")
    t, box = in_thread(lambda: s2.request("POST", "/update_weights", {"update_info": upd}, 120))
    t.join(120)
    group.close()
    status, body = box.get("out", (None, box.get("err")))
    failures["trainer_silent"] = {"update_status": status, "update_body": body, "update_s": box.get("s")}
    failed = status is not None and status >= 400
    check("gloo failure trainer_silent: /update_weights fails", failed, f"{status} {body}")
    check("gloo failure trainer_silent: near the 5 s timeout", 4 <= (box.get("s") or 1e9) < 20, box.get("s"))
    unchanged(s2, "gloo failure trainer_silent", "g1", a_sums, a_answer)

    # a bucket without a group (after the failure the engine left it)
    s2.ok("POST", "/start_weight_update")
    failures["no_group"] = s2.request("POST", "/update_weights", {"update_info": upd})
    check("gloo failure no_group: a clear error", failures["no_group"][0] >= 400, failures["no_group"])
    out["failures"] = failures
    del b_sums, b_answer
    return out


def either_phase(s3: Server, ckpt: dict[str, Path], b_sums: dict[str, str], a_sums: dict[str, str]) -> None:
    s3.ok("POST", "/start_weight_update")
    s3.ok("POST", "/update_weights", {"update_info": {"path": str(ckpt["B"])}})
    s3.ok("POST", "/finish_weight_update", {"weight_version": "d"})
    check("either: disk update on backend 'lifecycle'", s3.checksums() == b_sums and s3.version() == "d")
    state = load_file(str(ckpt["A"] / "model.safetensors"))
    group, _ = join(s3, 30.0)
    s3.ok("POST", "/start_weight_update")
    names = list(state)
    info = {"names": names, "dtype_names": [dtype_name(state[n].dtype) for n in names],
            "shapes": [list(state[n].shape) for n in names]}  # fmt: skip
    t, _ = in_thread(lambda: s3.request("POST", "/update_weights", {"update_info": info}))
    group.broadcast([state[n] for n in names])
    t.join()
    s3.ok("POST", "/finish_weight_update", {"weight_version": "g"})
    group.close()
    check("either: gloo update on backend 'lifecycle'", s3.checksums() == a_sums and s3.version() == "g")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keep", type=Path, help="work directory to keep (default: a temporary one, removed)")
    parser.add_argument("--either", action="store_true", help="also check the combined 'lifecycle' backend")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="vllm-plugin-check-"))
    work.mkdir(parents=True, exist_ok=True)
    servers: list[Server] = []
    try:
        ckpt = {k: work / k for k in "ABCD"}
        t = time.monotonic()
        build(ckpt["A"], 1)
        build(ckpt["B"], 2)
        build(ckpt["C"], 3, "hidden_size=64, num_attention_heads=1, num_key_value_heads=1, intermediate_size=128")
        shutil.copytree(ckpt["B"], ckpt["D"])
        config = json.loads((ckpt["D"] / "config.json").read_text())
        config["architectures"] = ["MistralForCausalLM"]
        (ckpt["D"] / "config.json").write_text(json.dumps(config))
        SUMMARY["build_s"] = round(time.monotonic() - t, 1)
        s1 = Server("s1-A-lifecycle_disk", ckpt["A"], "lifecycle_disk", work)
        s2 = Server("s2-B-lifecycle_gloo", ckpt["B"], "lifecycle_gloo", work)
        servers += [s1, s2]
        SUMMARY["start_s"] = {s1.name: s1.wait_healthy(), s2.name: s2.wait_healthy()}
        b_sums = s2.checksums()
        disk = disk_phase(s1, s2, ckpt)
        a_sums, a_answer = disk.pop("a_sums"), disk.pop("a_answer")
        SUMMARY["disk"] = disk
        SUMMARY["gloo"] = gloo_phase(s2, ckpt, a_sums, a_answer)
        if args.either:
            for s in servers:
                s.stop()
            s3 = Server("s3-A-lifecycle", ckpt["A"], "lifecycle", work)
            servers.append(s3)
            SUMMARY["start_s"][s3.name] = s3.wait_healthy()
            either_phase(s3, ckpt, b_sums, a_sums)
    except Exception as exc:
        check("the check ran to the end", False, f"{type(exc).__name__}: {exc}")
    finally:
        for s in servers:
            s.stop()
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    failed = [name for name, ok, _ in RESULTS if not ok]
    SUMMARY["checks"], SUMMARY["failed"] = len(RESULTS), failed
    print(json.dumps(SUMMARY, indent=2, default=str))
    print("ALL PASS" if not failed else f"{len(failed)} FAILED")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
