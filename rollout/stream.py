"""The rollout stream (``--fully-async``): generation never stops; the trainer takes batches as they complete.

A :class:`Stream` keeps one batch of groups in flight on the routable engines and puts every completed group
into a bounded queue (``--async-data-buffer-max-batches`` batches; a full queue stops dispatch, it never evicts:
staleness is judged when the trainer takes, prime-rl #3313). The lifecycle core decides everything else: the
``stream`` / ``stream_stop`` operations start and stop it, the weight update pauses engines with their requests
kept (``hold_routing``, ``pause_generation``) and resumes them, and the trainer's ``take`` drops every group more
than ``--max-weight-staleness`` versions behind -- one ``requeue_prompts`` command per group, the stalest first --
and trains on the rest.

**Versions.** The stream stamps each sample itself from the committed version (:class:`Versions`), never from the
engine: vLLM reports none per request and SGLang 0.5.23 one scalar stamped at the end. ``first_version`` is the
version committed when the request was sent (a Serving engine holds exactly it, and only engines holding it are
routed), ``versions`` every version committed while it was in flight. A token can be no older than
``first_version``, so staleness is never under-counted; it is over-counted by one for a request that waited through
a whole update before its first token (telling those apart needs per-token spans from the server).

**Handing the batch to the core.** Completed groups wait in the stream's queue; :meth:`Stream.offer` reports one
batch of them to the core as news ``group_done`` (each with its oldest version) just before the trainer's
``take``, so the core's buffer is exactly the batch the trainer is offered and its staleness is computed against
the version committed then.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lifecycle.decide.core import Command, Outcome
from lifecycle.decide.events import GROUP_BUFFERED, GROUP_DROPPED, GROUP_TAKEN
from lifecycle.decide.runner import Runner
from rollout.controller import ControllerError, InferenceController
from rollout.routing import GenRequest
from rollout.sample import Sample, sample, sample_problem
from rollout.task import Task, checked_reward


class StreamError(ControllerError):
    """The stream cannot go on: no engine answered a group within its bound, or it was used out of order."""


@dataclass(frozen=True)
class Prompt:
    """One prompt of the stream: ``rollout_id``/``index`` say where the task's prompts put it (and so its
    sampling parameters); ``tries`` counts how often it was dropped as too stale and sent again."""

    rollout_id: int
    index: int
    text: str
    tries: int = 0

    @property
    def key(self) -> str:
        return f"{self.rollout_id}/{self.index}"


@dataclass
class Group:
    """A completed group: its prompt, its samples, the oldest version any of its tokens may come from."""

    prompt: Prompt
    samples: list[Sample]
    oldest: int
    versions: tuple[int, ...]
    engines: tuple[str, ...]

    def record(self) -> dict[str, Any]:
        """As a job checkpoint holds it (JSON)."""
        return {
            "rollout_id": self.prompt.rollout_id,
            "index": self.prompt.index,
            "text": self.prompt.text,
            "tries": self.prompt.tries,
            "samples": self.samples,
            "oldest": self.oldest,
            "versions": list(self.versions),
            "engines": list(self.engines),
        }

    @staticmethod
    def of(record: dict[str, Any]) -> Group:
        prompt = Prompt(int(record["rollout_id"]), int(record["index"]), str(record["text"]), int(record["tries"]))
        return Group(
            prompt,
            list(record["samples"]),
            int(record["oldest"]),
            tuple(int(v) for v in record["versions"]),
            tuple(str(e) for e in record["engines"]),
        )


class Versions:
    """The committed weight version as an integer (the stream's versions are the job's consecutive versions)."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner

    def now(self) -> int:
        committed = self.runner.committed
        if committed is None:
            raise StreamError("the stream has no committed weights to stamp its samples with (init first)")
        try:
            return int(committed[1])
        except ValueError:
            raise StreamError(
                f"the committed weight version {committed[1]!r} is not an integer: a stream counts staleness in "
                "versions (push integer versions: update_weights(step + 1))"
            ) from None


@dataclass
class StreamState:
    """What a job checkpoint records of the stream: the prompt cursor, the prompts not yet completed (in flight
    or queued: their partial tokens are not kept) and the completed groups with their versions."""

    cursor: int = 0
    prompts: list[Prompt] = field(default_factory=list)
    groups: list[Group] = field(default_factory=list)

    def record(self) -> dict[str, Any]:
        return {
            "cursor": self.cursor,
            "prompts": [[p.rollout_id, p.index, p.text, p.tries] for p in self.prompts],
            "groups": [g.record() for g in self.groups],
        }

    @staticmethod
    def of(record: dict[str, Any]) -> StreamState:
        prompts = [Prompt(int(r), int(i), str(t), int(n)) for r, i, t, n in record.get("prompts", [])]
        groups = [Group.of(g) for g in record.get("groups", [])]
        return StreamState(int(record.get("cursor", 0)), prompts, groups)


@dataclass
class Taken:
    """What one take gave the trainer: the samples it trained on (their groups) and the groups dropped as too
    stale, the committed version they were judged against, and the optimisation step's stats."""

    samples: list[Sample]
    groups: list[Group]
    dropped: list[Group]
    version: int
    stats: dict[str, float] = field(default_factory=dict)

    @property
    def staleness(self) -> list[int]:
        """Per group trained on: how many versions its oldest token is behind the version it was judged against."""
        return [self.version - g.oldest for g in self.groups]


class Stream:
    """The producer (one batch in flight), the queue of completed groups, and the trainer's batches."""

    def __init__(
        self,
        runner: Runner,
        controller: InferenceController,
        task: Callable[[], Task],
        tokens: Callable[[str], list[int]],
        *,
        max_batches: int,
        group_timeout: float,
        max_tries: int = 3,
    ) -> None:
        self.runner = runner
        self.controller = controller
        self._task = task  # the rollout's task, a data source's prompts in it once the rollout function is built
        self.tokens = tokens
        self._batch: int | None = None
        self.max_batches = max_batches
        self.group_timeout = group_timeout
        self.kept = controller.timeouts.kept()  # a request an in-flight update holds paused waits this long at most
        self.max_tries = max_tries
        self.versions = Versions(runner)
        self.cursor = 0  # the next rollout id whose prompts join the queue
        self.queue: deque[Prompt] = deque()
        self.done: deque[Group] = deque()
        self.inflight: dict[str, asyncio.Task[None]] = {}
        self.sending: dict[str, Prompt] = {}  # the prompts of the groups in flight
        self.offered: list[Group] = []  # the batch of the take in progress, stalest first
        self.dropped: list[Group] = []
        self.failure: BaseException | None = None
        self._wake = asyncio.Event()  # a group completed, a prompt came back, or the trainer took
        self._producer: asyncio.Task[None] | None = None
        self._running = False
        self.started = False  # ever: a job checkpoint records the stream only then
        self.dispatched = 0
        runner.provide({"rollout.requeue_prompts": self._requeue})

    # -- the loop's calls --------------------------------------------------------------------------------
    def restore(self, state: StreamState) -> None:
        """A resumed stream: the checkpoint's queue first, its groups judged by their recorded versions (logged
        again, ``restored``, so the monitor holds them to the versions they were first buffered with)."""
        self.cursor = state.cursor
        self.queue.extend(state.prompts)
        self.done.extend(state.groups)
        for group in state.groups:
            self._emit(GROUP_BUFFERED, group, restored=True)

    def snapshot(self) -> StreamState:
        """The stream as a checkpoint records it: groups still in flight count as prompts to send again."""
        pending = [*self._inflight_prompts(), *self.queue]
        return StreamState(self.cursor, sorted(pending, key=_order), list(self.done))

    @property
    def task(self) -> Task:
        return self._task()

    @property
    def batch(self) -> int:
        """Groups per batch: one rollout's prompts (read when first asked: a data source is built at init)."""
        if self._batch is None:
            self._batch = len(self.task.prompts(0))
        return self._batch

    @property
    def running(self) -> bool:
        return self._producer is not None

    async def start(self) -> None:
        """The ``stream`` operation (recover, catch up, resume the engines), then the producer."""
        if self._producer is not None:
            raise StreamError("the stream is running already")
        await self.runner.operate("stream")
        self.controller.check()
        self._running = self.started = True
        self._producer = asyncio.create_task(self._produce(), name="stream-producer")

    async def stop(self) -> None:
        """Stop dispatching; the groups in flight are cancelled, their prompts kept for a later start (or the
        checkpoint); then the ``stream_stop`` operation drains the engines."""
        self._running = False
        self._wake.set()
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.cancel()
            await asyncio.gather(producer, return_exceptions=True)
        prompts = self._inflight_prompts()
        tasks = list(self.inflight.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.inflight.clear()
        self.sending.clear()
        self.queue.extendleft(reversed(sorted(prompts, key=_order)))
        await self.runner.operate("stream_stop", allow=frozenset({"not_applicable", "blocked", "failed"}))

    async def next_batch(self, timeout: float) -> list[Group]:
        """Wait (bounded) until a batch of groups has completed; they leave the queue."""
        deadline = time.monotonic() + timeout
        while len(self.done) < self.batch:
            self._raise_failure()
            left = deadline - time.monotonic()
            if left <= 0:
                raise StreamError(
                    f"no batch of {self.batch} groups completed within {timeout:.0f}s ({len(self.done)} done, "
                    f"{len(self.inflight)} in flight, engines {self.controller.states()}); "
                    "raise --engine-request-timeout or check the engines"
                )
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=min(left, 1.0))
        batch = [self.done.popleft() for _ in range(self.batch)]
        self._wake.set()  # room in the queue: the producer may dispatch again
        return batch

    async def offer(self, batch: list[Group]) -> None:
        """The batch becomes the core's buffer: news ``group_done`` per group, with its oldest version."""
        self.offered = sorted(batch, key=lambda g: g.oldest)  # stalest first: the order requeue drops them
        self.dropped = []
        for g in self.offered:
            await self.runner.report(Outcome("group_done", version=g.oldest))

    def taken(self) -> Taken:
        """After the core's ``take``: what it kept (logged ``stream.group_taken``) and what it dropped."""
        version = self.versions.now()
        kept, self.offered = self.offered, []
        samples: list[Sample] = []
        for n, g in enumerate(kept):
            self._emit(GROUP_TAKEN, g, version=str(version))
            samples.extend({**s, "group": n} for s in g.samples)  # GRPO groups: one per prompt of the batch
        dropped, self.dropped = self.dropped, []
        return Taken(samples, kept, dropped, version)

    def samples(self) -> list[Sample]:
        """The batch as the trainer's ``train_step`` reads it (what the core kept so far)."""
        return [{**s, "group": n} for n, g in enumerate(self.offered) for s in g.samples]

    # -- the core's command --------------------------------------------------------------------------------
    async def _requeue(self, cmd: Command) -> Outcome:
        """``requeue_prompts``: the stalest group offered is dropped, its prompt sent again (logged with versions)."""
        if not self.offered:
            return Outcome("done", reason="no group offered to drop")
        group = self.offered.pop(0)
        self.dropped.append(group)
        self._emit(GROUP_DROPPED, group, version=str(self.versions.now()), prompts=1)
        p = group.prompt
        self.queue.appendleft(Prompt(p.rollout_id, p.index, p.text, p.tries + 1))
        self._wake.set()
        return Outcome("done")

    # -- the producer --------------------------------------------------------------------------------------
    async def _produce(self) -> None:
        try:
            while self._running:
                room = self.max_batches * self.batch - len(self.done) - len(self.inflight)
                while room > 0 and len(self.inflight) < self.batch:
                    prompt = self._next_prompt()
                    task = asyncio.create_task(self._group(prompt), name=f"stream-group-{prompt.key}")
                    self.inflight[prompt.key], self.sending[prompt.key] = task, prompt
                    task.add_done_callback(functools.partial(self._finished, prompt.key))
                    room -= 1
                self._wake.clear()
                await self._wake.wait()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # the loop's next take raises it
            self.failure = exc
            raise

    def _next_prompt(self) -> Prompt:
        if not self.queue:
            self.queue.extend(Prompt(self.cursor, g, text) for g, text in enumerate(self.task.prompts(self.cursor)))
            self.cursor += 1
        return self.queue.popleft()

    def _finished(self, key: str, task: asyncio.Task[None]) -> None:
        if self.inflight.get(key) is task:
            del self.inflight[key], self.sending[key]
        if not task.cancelled() and task.exception() is not None and self.failure is None:
            self.failure = task.exception()
        self._wake.set()

    async def _group(self, prompt: Prompt) -> None:
        """One prompt's group: every sample answered (re-sent when an engine hands it back), stamped, queued."""
        size = self.task.group_size
        base = prompt.index * size
        requests = [
            GenRequest(base + k, prompt.text, self.task.sampling_params(prompt.rollout_id, base + k))
            for k in range(size)
        ]
        answers: dict[int, tuple[Any, str, int, int]] = {}  # index -> (answer, engine, first, last version)
        deadline = time.monotonic() + self.group_timeout
        tries = 0
        while len(answers) < size:
            if time.monotonic() > deadline:
                raise StreamError(
                    f"group {prompt.key}: {size - len(answers)} of {size} samples unanswered after "
                    f"{self.group_timeout:.0f}s (engines {self.controller.states()})"
                )
            todo = [r for r in requests if r.index not in answers]
            if not self.controller.routable():  # every engine paused for an update, or recovering
                await asyncio.sleep(0.02)
                continue
            first = self.versions.now()
            got = await self.controller.routing().generate(
                todo, self.controller.engine_unhealthy, logprobs=True, max_tries=1, timeout=self.kept
            )
            last = self.versions.now()
            for r in todo:
                a = got.get(r.index)
                finish = None if a is None else a.response.meta_info.finish_reason
                if a is None or (finish is not None and finish.type == "abort"):
                    continue  # handed back (a failed update) or failed: sent again
                answers[r.index] = (a, a.engine, first, last)
            if len(answers) < size:
                tries += 1
                if tries >= 10 * self.max_tries:
                    raise StreamError(f"group {prompt.key}: still unanswered after {tries} tries")
                await asyncio.sleep(0.02)
        ids = self.tokens(prompt.text)
        samples = []
        oldest, newest = min(v[2] for v in answers.values()), max(v[3] for v in answers.values())
        for index in sorted(answers):
            a, engine, first, last = answers[index]
            answer = a.response
            s = sample(
                index=index,
                group=prompt.index,
                prompt=prompt.text,
                prompt_ids=ids,
                output_ids=answer.output_ids or [],
                response=answer.text,
                reward=checked_reward(self.task, prompt.text, answer.text),
                logprobs=[float(x[0]) for x in (answer.meta_info.output_token_logprobs or [])],
                weight_version=str(first),
                engine=engine,
            )
            s["first_version"] = first
            s["versions"] = list(range(first, last + 1))
            samples.append(s)
        group = Group(
            prompt, samples, oldest, tuple(range(oldest, newest + 1)), tuple(sorted({a[1] for a in answers.values()}))
        )
        self.done.append(group)
        self.dispatched += 1
        self._emit(GROUP_BUFFERED, group)

    def _inflight_prompts(self) -> list[Prompt]:
        return list(self.sending.values())

    def _raise_failure(self) -> None:
        if self.failure is not None:
            raise StreamError(f"the stream failed: {self.failure}") from self.failure

    def _emit(self, kind: str, group: Group, **fields: Any) -> None:
        log = self.runner.log
        if log.enabled:
            log.emit(
                kind,
                group=group.prompt.key,
                oldest=str(group.oldest),
                versions=[str(v) for v in group.versions],
                engines=list(group.engines),
                bound=self.runner.config.max_weight_staleness or 0,
                **fields,
            )


def stream_problem(record: object, version: str) -> str:
    """Why a checkpoint's stream record cannot be resumed ("" where it can): the shapes :meth:`StreamState.record`
    writes, and every group no newer than the checkpoint's version (a group newer than the version it was judged
    against is the symptom of a version that went backwards)."""
    if not isinstance(record, dict):
        return f"is {type(record).__name__}, not an object"
    try:
        top = int(version)
    except ValueError:
        return f"its weight version {version!r} is not an integer"
    cursor = record.get("cursor")
    if not isinstance(cursor, int) or isinstance(cursor, bool) or cursor < 0:
        return f"cursor {cursor!r} is not a count"
    for n, p in enumerate(record.get("prompts", [])):
        if not (
            isinstance(p, list) and len(p) == 4 and isinstance(p[2], str) and all(_count(x) for x in (p[0], p[1], p[3]))
        ):
            return f"prompt {n} is {str(p)[:60]!r}, not [rollout_id, index, text, tries]"
    for n, g in enumerate(record.get("groups", [])):
        if not isinstance(g, dict):
            return f"group {n} is not an object"
        oldest, versions = g.get("oldest"), g.get("versions")
        if not isinstance(oldest, int) or not _count(oldest) or not isinstance(versions, list):
            return f"group {n} has no integer versions"
        if not all(isinstance(v, int) and _count(v) for v in versions):
            return f"group {n} has no integer versions"
        if oldest > top or any(v > top for v in versions):
            return (
                f"group {n} was generated under version {max([oldest, *versions])}, newer than the checkpoint's {top}"
            )
        problem = sample_problem(g.get("samples"))
        if problem is not None:
            return f"group {n}: {problem}"
        if not all(isinstance(g.get(k), int) for k in ("rollout_id", "index", "tries")) or not isinstance(
            g.get("text"), str
        ):
            return f"group {n} has no prompt"
    return ""


def _count(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _order(p: Prompt) -> tuple[int, int]:
    return (p.rollout_id, p.index)
