"""Every Ray call of the engines package, in one place (as Ray Serve's ActorReplicaWrapper).

An :class:`EngineActor` owns one engine server process; :class:`RayLauncher` is the engine
slot's handle on it (an :class:`engines.launcher.Launcher`). Fault hooks (``kill``: the HTTP server
dies while the actor lives; ``crash``: the actor process itself dies; ``pause_server``: SIGSTOP, the
server hangs without dying) serve fault injection (``trainer.app.faults``). ``watch()`` resolves the moment the server
process exits -- or raises when the actor dies -- so death is detected from Ray itself, not at
the next health probe.

``init_local_cluster(nodes=N)`` starts a head plus N-1 worker nodes on this machine
(``ray.cluster_utils.Cluster``); worker nodes carry the ``rollout_engine`` resource and engine
actors are spread over them, so removing a node (``remove_node``) loses real engines and
recovery relaunches them on a node that is still alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from engines.apikey import key_env
from engines.errors import EngineStartError
from engines.ledger import KEEP_NAMESPACE, RENEWAL_TIMEOUT, RENEWALS_PER_LEASE
from engines.process import ServerProcess
from engines.rayconnect import (
    check_gcs,
    check_token,
    connection_error,
    own_cluster_auth,
    use_cluster_token,
)

if TYPE_CHECKING:
    from engines.api import APIFactory


@ray.remote(num_cpus=0, max_restarts=0, max_concurrency=8)  # type: ignore[call-overload]  # ray stubs lack actor options
class EngineActor:
    """Runs in its own Ray worker process; the server is a child process of the actor."""

    def __init__(self, engine_id: str, lease: float | None = None) -> None:
        self.engine_id = engine_id
        self.process: ServerProcess | None = None
        self.epoch: int | None = None  # the generation of the process it runs (a driver's core counted it)
        # a detached engine must not live for ever when its driver never comes back: unless renewed within
        # ``lease`` seconds, it kills its server and exits (the lease starts at creation)
        self.lease = lease
        self._deadline = time.monotonic() + lease if lease else None
        self._crashing = False  # crash() is taking the actor down: its own death is the news, not the server's
        # the server's parent-death signal fires when the thread that spawned it ends, and the threads Ray runs
        # calls on are its own: a thread of ours that lives as long as the actor spawns it, so however the actor
        # dies (SIGKILL, OOM, a lost worker) its server dies too, never orphaned with its port and memory
        self._spawner = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{engine_id}-spawner")
        if lease:
            threading.Thread(target=self._expire, name=f"{engine_id}-lease", daemon=True).start()

    def _expire(self) -> None:
        while True:
            deadline = self._deadline
            if deadline is None:
                return
            left = deadline - time.monotonic()
            if left <= 0:
                if self.process is not None and self.process.alive:
                    self.process.kill()
                    self.process.wait_dead(10.0)
                os._exit(0)  # the actor ends: Ray frees its name and its resources
            time.sleep(min(left, 1.0))

    def renew(self, lease: float) -> float:
        """The driver is alive: the engine stays another ``lease`` seconds; the new deadline's distance."""
        self.lease = lease
        self._deadline = time.monotonic() + lease
        return lease

    def identity(self) -> dict[str, Any]:
        """What a new driver checks before it adopts the engine: whose it is, which generation, its server."""
        return {
            "engine_id": self.engine_id,
            "epoch": self.epoch,
            "server_pid": self.process.pid if self.process is not None and self.process.started else None,
            "alive": bool(self.process and self.process.alive),
            "url": self.process.url if self.process is not None and self.process.alive else None,
            "lease": self.lease,
        }

    def start(
        self,
        command: Sequence[str],
        timeout: float,
        url: str | None,
        health_path: str,
        env: dict[str, str] | None = None,
        epoch: int | None = None,
    ) -> str:
        """``env``: added to the actor's environment for the server (the API key travels here, not in argv)."""
        if self.process is not None and self.process.alive:
            self.process.kill()
            self.process.wait_dead(10.0)
        full = {**os.environ, **env} if env else None
        self.epoch = epoch
        self.process = ServerProcess(
            command, engine_id=self.engine_id, url=url, health_path=health_path, env=full, die_with_parent=True
        )
        self._spawner.submit(self.process.spawn).result()
        return self.process.wait_ready(timeout)

    def info(self) -> dict[str, Any]:
        ctx = ray.get_runtime_context()
        return {
            "engine_id": self.engine_id,
            "node_id": ctx.get_node_id(),
            "actor_pid": os.getpid(),
            "server_pid": self.process.pid if self.process is not None and self.process.started else None,
            "alive": bool(self.process and self.process.alive),
        }

    def alive(self) -> bool:
        return bool(self.process and self.process.alive)

    def kill_server(self) -> None:
        """SIGKILL the server process; the actor stays (fault: HTTP server death with a live actor)."""
        if self.process is not None:
            self.process.kill()

    def wait_dead(self, timeout: float) -> bool:
        if self.process is None:
            return True
        try:
            self.process.wait_dead(timeout)
        except Exception:
            return False
        return True

    def watch(self) -> str:
        """Block until the server process exits; the reason."""
        if self.process is None:
            return "never started"
        code = self.process.wait_dead(None)  # blocking waitpid: no polling
        if self._crashing:
            # crash() killed the server on the actor's way out: answering now would report "exit code -9" before
            # Ray reports the actor's death (a lost actor read as a dead server). Wait for os._exit, bounded.
            time.sleep(CALL_TIMEOUT)
        return self.process.death(code)

    def pause_server(self) -> int:
        """SIGSTOP the server's process group: it hangs (health and generate stall) without dying."""
        if self.process is None or not self.process.alive:
            return -1
        try:
            os.killpg(self.process.pid, signal.SIGSTOP)
        except PermissionError:
            os.kill(self.process.pid, signal.SIGSTOP)
        return self.process.pid

    def crash(self) -> None:
        """The actor process dies (fault: actor/node loss); its server goes with it."""
        self._crashing = True  # before the kill: watch() must not report the server's exit first
        if self.process is not None:
            self.process.kill()
        os._exit(1)


CALL_TIMEOUT = RENEWAL_TIMEOUT  # bound on a control call to an engine actor (kill, info, renewals, fault hooks)


class RayLauncher:
    """An engine slot's handle on its actor. All Ray calls go through here."""

    def __init__(
        self,
        engine_id: str,
        command: Any,
        *,
        startup_timeout: float = 60.0,
        url: str | None = None,
        health_path: str = "/health",
        options: dict[str, Any] | None = None,
        api_key: str | None = None,
        env: dict[str, str] | None = None,
        keep: Keep | None = None,
        api: APIFactory | None = None,
    ) -> None:
        self.engine_id = engine_id
        if api is None:  # imported here: the actor's own process (this module) needs no HTTP client
            from engines.api import sglang_api

            api = sglang_api
        self.api: APIFactory = api  # what the server speaks (the CPU engine: SGLang's)
        self.keep = keep  # --detach-engines: a named, detached actor with a lease this driver renews
        self.epoch: int | None = None  # the generation of the process it launches next (set by its slot's owner)
        self._renewal: asyncio.Task[None] | None = None
        self.command = command
        self.api_key = api_key  # the server requires it; the engine slot sends it
        self.env = dict(env or {})  # added to the server's environment (e.g. vLLM's VLLM_SERVER_DEV_MODE)
        self.startup_timeout = startup_timeout
        self.url = url
        self.health_path = health_path
        self.options = dict(options or {})
        self.actor: Any = None
        self._alive = False
        self._creating = asyncio.Lock()  # one actor per slot: a second caller waits for the first's, never kills it

    async def _ensure_actor(self) -> Any:
        if self.actor is not None:
            return self.actor
        async with self._creating:
            if self.actor is not None:
                return self.actor
            options = self.options or engine_placement(self.engine_id)
            keep = self.keep
            if keep is None:
                self.actor = EngineActor.options(name=None, **options).remote(self.engine_id)  # type: ignore[attr-defined]
            else:  # outlives this driver: found again by name; exits unless the lease is renewed
                self.actor = await self._named_actor(keep, options)
                self._renew()
        return self.actor

    async def _named_actor(self, keep: Keep, options: dict[str, Any]) -> Any:
        """The slot's detached actor; a previous one still holding the name (a hung or foreign process the new
        driver disowned) is killed first -- bounded: Ray frees a killed actor's name within moments. The waits
        and the name lookup leave the event loop free (the other slots' launches and the renewals go on)."""
        name = keep.actor_name(self.engine_id)
        detached = {"name": name, "namespace": keep.namespace, "lifetime": "detached"}
        deadline = time.monotonic() + CALL_TIMEOUT
        killed = False
        while True:
            try:
                return EngineActor.options(**detached, **options).remote(self.engine_id, keep.lease)  # type: ignore[attr-defined]
            except ValueError:  # the name is taken
                if not killed:
                    with contextlib.suppress(ValueError):
                        holder = await asyncio.to_thread(ray.get_actor, name, namespace=keep.namespace)
                        ray.kill(holder, no_restart=True)
                    killed = True
                if time.monotonic() > deadline:
                    raise EngineStartError(self.engine_id, f"the name {name} stays taken by another actor") from None
                await asyncio.sleep(0.2)

    def _renew(self) -> None:
        """Renew the actor's lease every third of it, for as long as this driver (its event loop) lives (a lease
        shorter than ``engines.ledger.MIN_LEASE`` may lapse between two renewals: the options refuse one)."""
        keep = self.keep
        if keep is None or (self._renewal is not None and not self._renewal.done()):
            return

        async def renew() -> None:
            while self.actor is not None:
                with contextlib.suppress(RayActorError, TimeoutError):
                    await asyncio.wait_for(self.actor.renew.remote(keep.lease), CALL_TIMEOUT)
                await asyncio.sleep(keep.lease / RENEWALS_PER_LEASE)

        self._renewal = asyncio.get_running_loop().create_task(renew(), name=f"{self.engine_id}-renew")

    def kept_name(self) -> str:
        return self.keep.actor_name(self.engine_id) if self.keep is not None else ""

    async def adopt(self, epoch: int, server_pid: int | None) -> str:
        """Find a previous driver's engine by name (bounded) and check it is the process the ledger names: the
        same generation and server pid, alive. Its URL; :class:`EngineStartError` when it is not adoptable."""
        keep = self.keep
        if keep is None:
            raise EngineStartError(self.engine_id, "engines are not kept (--detach-engines): nothing to adopt")
        name = keep.actor_name(self.engine_id)
        try:
            actor = await asyncio.wait_for(
                asyncio.to_thread(ray.get_actor, name, namespace=keep.namespace), CALL_TIMEOUT
            )
        except (ValueError, TimeoutError) as exc:  # ValueError: no actor of that name
            raise EngineStartError(self.engine_id, f"kept engine {name} cannot be reached: {exc!r}") from None
        self.actor = actor  # ours now: renewed by this driver, killed by it if it is not adopted
        self._renew()
        try:
            who: dict[str, Any] = dict(await asyncio.wait_for(actor.identity.remote(), CALL_TIMEOUT))
        except (RayActorError, TimeoutError) as exc:  # a hung actor: the disown's kill ends it
            raise EngineStartError(self.engine_id, f"kept engine {name} does not answer: {exc!r}") from None
        problems = [
            f"{k} is {who.get(k)!r}, the ledger says {v!r}"
            for k, v in (("engine_id", self.engine_id), ("epoch", epoch), ("server_pid", server_pid))
            if who.get(k) != v
        ]
        if not who.get("alive") or not who.get("url"):
            problems.append("its server process is not running")
        if problems:
            raise EngineStartError(self.engine_id, f"kept engine {name} is not the ledger's: " + "; ".join(problems))
        self.epoch, self._alive = epoch, True
        return str(who["url"])

    async def launch(self) -> str:
        if self.actor is not None and not self.options and await self.node_id() in _leaving_nodes():
            self.shutdown()  # its node is draining or gone: a new actor, placed again on a node that stays
        actor = await self._ensure_actor()
        try:
            url = await actor.start.remote(
                list(self.command()),
                self.startup_timeout,
                self.url,
                self.health_path,
                {**self.env, **key_env(self.api_key)},
                self.epoch,
            )
        except RayActorError as exc:
            self.actor = None
            raise EngineStartError(self.engine_id, f"engine actor died while starting: {exc}") from None
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause if isinstance(getattr(exc, "cause", None), Exception) else exc
            raise EngineStartError(self.engine_id, str(cause)) from None
        except ray.exceptions.RayError as exc:  # e.g. a start error Ray could not deserialize: still a failed start
            raise EngineStartError(self.engine_id, str(exc).splitlines()[-1] if str(exc) else repr(exc)) from None
        self._alive = True
        return str(url)

    async def kill(self) -> None:
        """SIGKILL the server (bounded: an actor that does not answer is killed by Ray instead)."""
        if self.actor is None:
            return
        try:
            await asyncio.wait_for(self.actor.kill_server.remote(), CALL_TIMEOUT)
        except RayActorError:
            self.actor = None
        except TimeoutError:
            self.shutdown()

    async def wait_dead(self, timeout: float) -> bool:
        if self.actor is None:
            return True
        try:
            return bool(await asyncio.wait_for(self.actor.wait_dead.remote(timeout), timeout + CALL_TIMEOUT))
        except RayActorError:
            self.actor = None
            return True
        except TimeoutError:
            return False

    def alive(self) -> bool:
        if self.actor is None:
            return False
        try:
            return bool(ray.get(self.actor.alive.remote(), timeout=5.0))
        except (RayActorError, GetTimeoutError):
            return False

    async def watch(self) -> str:
        """Resolves when the server process exits, or when Ray reports the actor dead."""
        if self.actor is None:
            return "no actor"
        try:
            return str(await self.actor.watch.remote())
        except RayActorError as exc:
            self.actor = None
            return f"actor died: {type(exc).__name__}"

    async def info(self) -> dict[str, Any]:
        return dict(await asyncio.wait_for((await self._ensure_actor()).info.remote(), CALL_TIMEOUT))

    def crash(self) -> None:
        """Fault hook: the actor process dies (fire and forget); Ray reports the death to ``watch``."""
        if self.actor is not None:
            self.actor.crash.remote()

    async def pause_server(self) -> int:
        """Fault hook: the server hangs (SIGSTOP), the actor lives; the server pid."""
        return int(await asyncio.wait_for((await self._ensure_actor()).pause_server.remote(), CALL_TIMEOUT))

    async def node_id(self) -> str | None:
        """The Ray node its actor runs on (None: no actor now), read from the actor (bounded)."""
        if self.actor is None:
            return None
        try:
            return str((await self.info())["node_id"])
        except (RayActorError, TimeoutError):
            return None

    async def server_pid(self) -> int | None:
        """The server process id (same machine: a local multi-node cluster), for a synchronous kill."""
        pid = (await self.info())["server_pid"]
        return None if pid is None else int(pid)

    def shutdown(self) -> None:
        if self._renewal is not None:
            self._renewal.cancel()
            self._renewal = None
        if self.actor is not None:
            try:
                ray.kill(self.actor, no_restart=True)
            finally:
                self.actor = None


class Keep:
    """How a job's engines outlive its driver (--detach-engines): detached actors named after the job, in one Ray
    namespace, each with a lease (seconds) the driver renews -- an engine whose driver never comes back exits."""

    DEFAULT_LEASE = 120.0  # long enough for a driver to restart and re-adopt; short enough not to hoard GPUs

    def __init__(self, job_id: str, namespace: str = KEEP_NAMESPACE, lease: float = DEFAULT_LEASE) -> None:
        if lease <= 0:
            raise ValueError("an engine lease must be positive (seconds)")
        self.job_id, self.namespace, self.lease = job_id, namespace, lease

    def actor_name(self, engine_id: str) -> str:
        return f"{self.job_id}-{engine_id}"


ENGINE_RESOURCE = "rollout_engine"
_cluster: Any = None  # the ray.cluster_utils.Cluster this process started (init_local_cluster(nodes>1))
_removed: set[str] = set()  # node ids removed by remove_node (placement avoids them)


def init_local_cluster(num_cpus: int = 2, address: str | None = None, nodes: int = 1) -> None:
    """Start (or connect to) Ray once; a small local cluster by default.

    ``address``: join that cluster (``engines.rayconnect``: refused within seconds where no Ray head answers,
    this machine's Ray auth token sent where one is available, every failure a ConfigError naming
    ``--ray-address``).
    ``nodes > 1``: a head (the driver, trainer) plus ``nodes - 1`` worker nodes on this machine,
    each offering ``rollout_engine`` slots, so engines live on other nodes than the trainer and a
    node can be removed (fault ``lose-node``). The cluster is shut down when this process exits.
    """
    global _cluster
    if ray.is_initialized():
        return
    if address:  # someone else's cluster: asked first (bounded), with this machine's token, any failure one error
        check_gcs(address)
        use_cluster_token(address)
        check_token(address)
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError, ray.exceptions.RayError) as exc:
            raise connection_error(address, exc) from exc
    elif nodes > 1:
        from ray.cluster_utils import Cluster

        own_cluster_auth()

        _cluster = Cluster(
            initialize_head=True,
            head_node_args={"num_cpus": num_cpus, "include_dashboard": False},
            shutdown_at_exit=True,
        )
        for _ in range(nodes - 1):
            _cluster.add_node(num_cpus=1, resources={ENGINE_RESOURCE: 4})
        _cluster.wait_for_nodes()
        ray.init(address=_cluster.address, include_dashboard=False, log_to_driver=False)
    else:  # "local": our own instance, never a cluster someone else started on this machine (/tmp/ray)
        own_cluster_auth()
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)


def _engine_nodes() -> list[str]:
    """Alive nodes offering engine slots, in a stable order; a draining node is not offered (an actor asked onto
    it, even softly, is never scheduled: measured on Ray 2.60, a 10 s wait that never ends)."""
    nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get(ENGINE_RESOURCE, 0) > 0]  # type: ignore[no-untyped-call]
    # a removed node stays "Alive" in the GCS until its health checks time out: skip it at once
    return sorted(str(n["NodeID"]) for n in nodes if str(n["NodeID"]) not in _leaving_nodes())


def _leaving_nodes() -> set[str]:
    """Nodes this driver removed, and the ones Ray is draining."""
    return _removed | set(draining_nodes())


# -- node draining (a preemption notice from Ray) ---------------------------------------------------------------------
DRAIN_REASON_PREEMPTION = "DRAIN_NODE_REASON_PREEMPTION"
GCS_TIMEOUT = 5.0  # one GCS call of the draining API


def _gcs() -> Any:
    """This driver's GCS client (the one ``ray drain-node`` builds: ``ray._raylet.GcsClient``)."""
    return ray._raylet.GcsClient(address=ray.get_runtime_context().gcs_address)  # type: ignore[attr-defined]


def drain_node(node_id: str, deadline_s: float, message: str = "preempted", *, timeout: float = GCS_TIMEOUT) -> None:
    """Ask the GCS to drain ``node_id`` for preemption, with a deadline ``deadline_s`` from now (what a cloud's
    notice or a SIGTERMed raylet does). The node is only marked: nothing is scheduled onto it, what runs there
    runs on, and taking it away at the deadline is the caller's (``remove_node``). A preemption drain is never
    rejected by Ray; a rejection raises ``RuntimeError`` with its reason."""
    from ray.core.generated import autoscaler_pb2

    reason = autoscaler_pb2.DrainNodeReason.Value(DRAIN_REASON_PREEMPTION)  # type: ignore[attr-defined]
    deadline_ms = int(time.time() * 1000 + max(0.0, deadline_s) * 1000)
    accepted, why = _gcs().drain_node(node_id, reason, message, deadline_ms, timeout=timeout)
    if not accepted:
        raise RuntimeError(f"Ray refused to drain node {node_id}: {why}")


def draining_nodes(*, timeout: float = GCS_TIMEOUT) -> dict[str, float | None]:
    """The nodes being drained: node id -> seconds left to its deadline (None: no deadline). Empty when Ray is not
    initialised or the GCS does not answer within ``timeout`` (a watcher asks again at its next poll)."""
    if not ray.is_initialized():
        return {}
    try:
        found = _gcs().get_draining_nodes(timeout=timeout)
    except Exception:  # the GCS is unreachable or slow: no news this time
        return {}
    now_ms = time.time() * 1000
    return {str(node): (None if not ms else max(0.0, (ms - now_ms) / 1000)) for node, ms in found.items()}


def engine_placement(engine_id: str) -> dict[str, Any]:
    """Actor options spreading engines over the worker nodes (engine i on node i mod n).

    Computed when the actor is (re)created, over the nodes alive and not draining *then*: a relaunch after a node
    loss, or a join into a slot beyond the initial fleet, lands on a surviving node; with none left, on the driver's
    node. No engine nodes at all (a plain local cluster): no constraint.
    """
    if not ray.is_initialized():
        return {}
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = _engine_nodes()
    if not nodes and _leaving_nodes():
        # every engine node is gone or going (``--ray-nodes 2`` lost its worker): the driver's node hosts it -- left
        # unconstrained, Ray may still pick the node it has not yet declared dead, and the actor dies with it
        return {
            "scheduling_strategy": NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
        }
    if not nodes:
        return {}

    index = int(engine_id.rsplit("-", 1)[-1]) if engine_id.rsplit("-", 1)[-1].isdigit() else 0
    node = nodes[index % len(nodes)]
    return {
        "resources": {ENGINE_RESOURCE: 1},
        "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node, soft=True),
    }


def driver_node_placement() -> dict[str, Any]:
    """On a multi-node cluster this process started: pin an actor to the driver's (head) node.

    Trainer workers ask for no CPUs, so Ray may put them on any node; a ``lose-node`` fault must
    take engines, not the trainer, with it.
    """
    if _cluster is None or not ray.is_initialized():
        return {}
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)}


def remove_node(node_id: str) -> None:
    """Remove a worker node of the local multi-node cluster: every actor on it dies (fault ``lose-node``)."""
    if _cluster is None:
        raise RuntimeError("lose-node needs a local multi-node cluster (lifecycle run --ray-nodes 3)")
    for node in _cluster.list_all_nodes():
        if node.node_id == node_id:
            if node is _cluster.head_node:
                raise RuntimeError(f"node {node_id} is the head node (the driver): not removed")
            _removed.add(node_id)
            _cluster.remove_node(node, allow_graceful=False)
            return
    raise RuntimeError(f"node {node_id} is not a node of this cluster")


@contextlib.contextmanager
def ray_head(temp_dir: str, *, num_cpus: int = 4, timeout: float = 120.0) -> Iterator[str]:
    """A Ray head of its own on this machine (what ``ray start --head`` gives a real cluster: it outlives every
    driver), yielding its ``HOST:PORT``. Stopped by its own process group -- never ``ray stop``, which stops every
    Ray instance on the machine (a test session's own included). Engines it still hosts die with it; a kept
    engine's server outside it (its own session) runs out its lease."""
    import socket
    import subprocess
    import sys
    from pathlib import Path

    ray_cli = Path(sys.executable).parent / "ray"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    # no drain at SIGTERM: Ray's default (up to 30 s) waits for the raylet this process-group kill has already
    # stopped, so the head never exited within the 10 s below and every stop ended in the SIGKILL after them
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] = "0"
    env.pop("RAY_ADDRESS", None)
    cmd = [str(ray_cli), "start", "--head", "--block", f"--port={port}", f"--num-cpus={num_cpus}"]
    cmd += ["--include-dashboard=false", f"--temp-dir={temp_dir}"]
    head = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + timeout
        while True:  # up once the GCS port answers
            if head.poll() is not None:
                err = head.stderr.read().decode(errors="replace")[-2000:] if head.stderr else ""
                raise EngineStartError("ray-head", f"ray start --head exited with {head.returncode}: {err}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1.0):
                break
            if time.monotonic() > deadline:
                raise EngineStartError("ray-head", f"ray start --head did not listen on {port} in {timeout:g}s")
            time.sleep(0.5)
        yield f"127.0.0.1:{port}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGTERM)  # --block: the head stops the processes it started
        try:
            head.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(head.pid, signal.SIGKILL)
            head.wait(10)
