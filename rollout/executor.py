"""RolloutExecutor (the data half of the rollout manager) and the RolloutManager facade.

The executor owns the data source and the rollout function, behind the **construction gate**:
the rollout function is built only when the ``init`` move's effects include
``construct_rollout_fn`` -- replay never builds it (and so never reads ``rollout_num_gpus``),
plain train-only does. ``generate(rollout_id)`` either reads the saved rollout (Replay) or runs
the rollout function between the controller's generate boundaries, and saves the samples when
the ``generate_done`` move says ``save_rollout_data``.

``eval(rollout_id)`` runs the eval function (built only on ``construct_eval_fn``) between the
rollout machine's ``eval``/``eval_done`` moves: on the dedicated eval fleet when one exists (pinned
to the controller's committed weights; a pin that fails is a typed skip, never an eval on mixed
weights), otherwise on the rollout engines, as miles does without ``--eval-num-gpus``.

A user can plug in their own rollout function by import path (``module:attr``): a callable
``factory(task) -> rollout_fn`` where ``rollout_fn(rollout_id, controller) -> list[sample]`` is async.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from engines.engine import Timeouts
from engines.launcher import LauncherFactory
from engines.ledger import EngineLedger
from engines.models.family import load_tokenizer
from engines.models.protocol import Tokenizer
from lifecycle.decide.config import LifecycleConfig
from lifecycle.decide.core import EVAL, Command
from lifecycle.decide.events import ROLLOUT_SOURCE, EventLog
from lifecycle.decide.ledger import EffectLedger
from lifecycle.decide.names import RolloutStateName
from lifecycle.decide.runner import Runner
from rollout.controller import ControllerError, InferenceController
from rollout.eval_fleet import pin_fleet
from rollout.policy_source import PolicyRolloutFn
from rollout.replay import load_samples, save_rollout
from rollout.routing import GenRequest, OnUnhealthy, Routing
from rollout.sample import Sample, checked_samples, sample
from rollout.stream import Stream
from rollout.task import DataSource, SourcedTask, Task, checked_reward, checked_task

RolloutFn = Callable[[int, InferenceController], Awaitable[list[Sample]]]
# Held-out eval prompts: training uses rollout ids >= 0, so negative ids never overlap, and every eval
# sees the same set (eval rewards of different steps compare).
EVAL_PROMPT_IDS = (-1, -2)


@dataclass(frozen=True)
class EvalResult:
    """One eval: the mean greedy reward, or why it was skipped (``unhealthy``, ``pin_violation``, ...)."""

    rollout_id: int
    reward: float | None
    weight_version: str | None = None
    on: str = ""  # "eval_fleet" or "rollout" (the engines it ran on)
    skipped: str | None = None
    detail: str = ""
    samples: int = 0
    seconds: float = 0.0


class EvalFailed(ControllerError):
    """Eval requests failed on every engine."""


class PromptTokens:
    """Prompt token ids from the served checkpoint's own tokenizer (``engines.models.load_tokenizer``): the engines are
    sent text, as a real SGLang server is, and the trainer needs the ids the engine tokenized it to."""

    def __init__(self) -> None:
        self._dir: str | None = None
        self._tokenizer: Tokenizer | None = None

    def encode(self, checkpoint: str | None, text: str) -> list[int]:
        if checkpoint is None:
            raise ControllerError("no committed checkpoint: the prompts cannot be tokenized (init first)")
        if self._tokenizer is None or checkpoint != self._dir:
            self._tokenizer, self._dir = load_tokenizer(checkpoint), checkpoint
        return self._tokenizer.encode(text)


async def generate_samples(
    prompts: Sequence[tuple[int, int, str, dict[str, Any]]],
    routing: Routing,
    on_unhealthy: OnUnhealthy,
    task: Task,
    tokens: Callable[[str], list[int]],
    *,
    logprobs: bool,
    max_tries: int = 3,
) -> dict[int, Sample]:
    """Send the prompts (index, group, text, sampling params) as text through the group's routing; the
    answers become samples (prompt ids from the checkpoint's tokenizer, checked against the engine's count)."""
    requests = [GenRequest(index, text, params) for index, _, text, params in prompts]
    answers = await routing.generate(requests, on_unhealthy, logprobs=logprobs, max_tries=max_tries)
    done: dict[int, Sample] = {}
    ids_of: dict[str, list[int]] = {}
    for index, group, text, _ in prompts:
        got = answers.get(index)
        if got is None:
            continue
        answer = got.response
        ids = ids_of.setdefault(text, tokens(text))
        if answer.meta_info.prompt_tokens not in (None, len(ids)):
            raise ControllerError(
                f"{got.engine} tokenized {text!r} to {answer.meta_info.prompt_tokens} tokens, the checkpoint's "
                f"tokenizer to {len(ids)}: the engine serves another tokenizer than the checkpoint directory's"
            )
        done[index] = sample(
            index=index,
            group=group,
            prompt=text,
            prompt_ids=ids,
            output_ids=answer.output_ids or [],
            response=answer.text,
            reward=checked_reward(task, text, answer.text),
            logprobs=[float(x[0]) for x in (answer.meta_info.output_token_logprobs or [])],
            weight_version=answer.meta_info.weight_version,
            engine=got.engine,
        )
    return done


class EngineEvalFn:
    """The default eval function: greedy answers to the held-out prompts, scored by the task's reward."""

    def __init__(self, task: Task, *, max_tries: int = 3) -> None:
        self.task = task
        self.tokens = PromptTokens()
        self.max_tries = max_tries

    def prompts(self) -> list[str]:
        return [p for rid in EVAL_PROMPT_IDS for p in self.task.prompts(rid)]

    async def __call__(
        self, rollout_id: int, routing: Routing, on_unhealthy: OnUnhealthy, checkpoint: str | None
    ) -> list[Sample]:
        params = self.task.eval_params()
        prompts = [(i, i, p, params) for i, p in enumerate(self.prompts())]
        done = await generate_samples(
            prompts,
            routing,
            on_unhealthy,
            self.task,
            lambda text: self.tokens.encode(checkpoint, text),
            logprobs=False,
            max_tries=self.max_tries,
        )
        if len(done) < len(prompts):
            missing = len(prompts) - len(done)
            raise EvalFailed(f"eval {rollout_id}: {missing} of {len(prompts)} prompts failed on every engine")
        return [done[i] for i in sorted(done)]


class EngineRolloutFn:
    """The default rollout function: group sampling through the routing of the Serving engines, rewarded by the task."""

    def __init__(self, task: Task, *, max_tries: int = 3) -> None:
        self.task = task
        self.tokens = PromptTokens()
        self.max_tries = max_tries

    async def __call__(self, rollout_id: int, controller: InferenceController) -> list[Sample]:
        task = self.task
        prompts = []
        for g, prompt in enumerate(task.prompts(rollout_id)):
            for k in range(task.group_size):
                index = g * task.group_size + k
                prompts.append((index, g, prompt, task.sampling_params(rollout_id, index)))
        routing = controller.routing()
        if not controller.routable():
            raise ControllerError(f"rollout {rollout_id}: no routable engine ({controller.states()})")
        checkpoint = controller.committed[0] if controller.committed else None
        done = await generate_samples(
            prompts,
            routing,
            controller.engine_unhealthy,
            task,
            lambda text: self.tokens.encode(checkpoint, text),
            logprobs=True,
            max_tries=self.max_tries,
        )
        if len(done) < len(prompts):
            raise ControllerError(f"rollout {rollout_id}: {len(prompts) - len(done)} samples failed on every engine")
        return [done[i] for i in sorted(done)]


def _factory(path: str, what: str) -> Any:
    """``module:attr`` -> the named attribute (the CLI has already checked that it imports)."""
    module, _, attr = path.partition(":")
    if not module or not attr:
        raise ValueError(f"{what} path {path!r}: use module:attr")
    return getattr(importlib.import_module(module), attr)


def load_data_source(path: str, task: Task) -> DataSource:
    """The user's data source factory, called with the task (miles' --data-source-path)."""
    source: DataSource = _factory(path, "data source")(task)
    if not callable(getattr(source, "prompts", None)):
        raise ValueError(f"data source {path!r}: the factory's result has no prompts(rollout_id) method")
    return source


def load_rollout_fn(path: str, task: Task) -> RolloutFn:
    """The user's rollout function factory, called with the task (miles' --rollout-function-path)."""
    fn: RolloutFn = _factory(path, "rollout function")(task)
    return fn


class RolloutExecutor:
    """generate/eval and the data format; the rollout function exists only behind the construction gate."""

    def __init__(
        self,
        runner: Runner,
        controller: InferenceController,
        task: Task,
        *,
        rollout_fn_path: str | None = None,
        data_source_path: str | None = None,
    ) -> None:
        self.runner = runner
        self.config = runner.config
        self.controller = controller
        self.task = task
        self.rollout_fn_path = rollout_fn_path
        self.data_source_path = data_source_path
        self.data_source: DataSource | None = None
        self.rollout_fn: RolloutFn | None = None
        self.eval_fn: EngineEvalFn | None = None
        self.constructed: list[str] = []
        self._rollout_id = 0
        self._samples: list[Sample] = []
        runner.provide(
            {
                "rollout.construct_rollout_fn": self._construct_rollout_fn,
                "rollout.construct_eval_fn": self._construct_eval_fn,
                "rollout.load_replay_data": self._load_replay_data,
                "rollout.save_rollout_data": self._save_rollout_data,
            }
        )

    # -- the handlers of the construction gate and the data effects ---------------------------------------
    async def _construct_rollout_fn(self, cmd: Command) -> None:
        if self.data_source_path:  # the data source feeds the rollout fn: built behind the same gate
            self.data_source = load_data_source(self.data_source_path, self.task)
            self.task = SourcedTask(self.task, self.data_source)
            self.constructed.append("data_source")
        if self.rollout_fn_path:
            self.rollout_fn = load_rollout_fn(self.rollout_fn_path, self.task)
        elif not self.runner.core.engines:
            # plain train-only: the rollout fn is the data source and there is no engine to call
            self.rollout_fn = PolicyRolloutFn(self.task)
        else:
            self.rollout_fn = EngineRolloutFn(self.task)
        self.constructed.append("rollout_fn")

    async def _construct_eval_fn(self, cmd: Command) -> None:
        self.eval_fn = EngineEvalFn(self.task)
        self.constructed.append("eval_fn")

    async def _load_replay_data(self, cmd: Command) -> None:
        path = self.config.load_debug_rollout_data
        assert path is not None  # the spec's replay guard put the machine here
        self._samples = load_samples(path, self._rollout_id)

    async def _save_rollout_data(self, cmd: Command) -> None:
        template = self.config.save_debug_rollout_data
        assert template is not None  # the effect is gated on saves_rollout_data
        save_rollout(template, self._rollout_id, self._samples, task=self.task.name)

    # -- the loop's calls -------------------------------------------------------------------------------
    async def generate(self, rollout_id: int) -> list[Sample]:
        """The ``generate`` operation (recover, catch up, route), the rollout function, ``generate_done``.

        External engines are read before and after (``check_external``): one replaced behind its address is
        caught up before it is routed; a rollout during which one was replaced may hold answers of its new
        process's base weights, so it is generated again (once), never trained on."""
        for _ in range(1 + REGENERATE):
            tainted = await self._generate(rollout_id)
            if not tainted:
                return self._samples
        raise ControllerError(
            f"rollout {rollout_id}: the server of {', '.join(tainted)} was replaced behind its address during the "
            f"rollout {1 + REGENERATE} times in a row: its answers may come from weights this job did not load, and "
            "are not trained on. Fix: keep the external engines' servers running during the run "
            "(--rollout-external-engine-addrs), or let the job start its own engines"
        )

    async def _generate(self, rollout_id: int) -> list[str]:
        """One try; the external engines replaced while it ran (its samples then are dropped, never saved)."""
        self._rollout_id = rollout_id
        self._samples = []
        await self.controller.check_external()
        await self.runner.operate("generate")
        self.controller.check()
        if self.state == "Replay":
            self._source("replay")
            return []
        self._source("rollout_fn")
        if self.rollout_fn is None:
            raise ControllerError("generate: no rollout function was constructed")
        seen = dict(self.controller.replacements)
        tainted: list[str] = []
        try:
            got = await self.rollout_fn(rollout_id, self.controller)
            await self.controller.check_external()
            tainted = self.controller.replaced_since(seen)
            if not tainted:
                self._samples = checked_samples(got, rollout_id, self.plugin)  # before generate_done saves them
        finally:
            await self.runner.operate("generate_done", allow=_NOT_NOW)
        self.controller.check()
        return tainted

    def _source(self, source: str) -> None:
        if self.runner.log.enabled:
            self.runner.log.emit(ROLLOUT_SOURCE, rollout_id=self._rollout_id, source=source)

    @property
    def plugin(self) -> str:
        """How errors name the rollout function: the user's import path and its flag, or the built-in one."""
        if self.rollout_fn_path:
            return f"rollout function {self.rollout_fn_path!r} (--rollout-function-path)"
        return f"rollout function {type(self.rollout_fn).__name__} (task {self.task.name!r})"

    async def eval(self, rollout_id: int) -> EvalResult:
        """The ``eval``/``eval_done`` operations around one eval: on the pinned eval fleet, else the rollout engines."""
        t0 = time.monotonic()
        controller = self.controller
        if self.eval_fn is None:  # replay: the construction gate built no eval function
            return EvalResult(rollout_id, None, skipped="no_eval_fn", detail=f"rollout manager in {self.state}")
        fleet = self.runner.core.evals > 0  # the config has an eval fleet (--eval-num-gpus)
        if not fleet and not self.runner.core.engines:  # plain train-only: no server to evaluate on
            return EvalResult(rollout_id, None, skipped="no_engines", detail="no rollout server and no eval fleet")
        await self.runner.operate("eval")
        weights = controller.committed[0] if controller.committed else None
        try:
            controller.check()
            if not fleet:
                samples = await self.eval_fn(rollout_id, controller.routing(), controller.engine_unhealthy, weights)
                return _eval_result(rollout_id, samples, "rollout", t0)
            pin = await pin_fleet(self.runner, controller)
            try:
                if not pin.ok:
                    return EvalResult(
                        rollout_id, None, pin.weight_version, "eval_fleet", pin.reason, pin.detail, 0, _since(t0)
                    )
                try:
                    samples = await self.eval_fn(
                        rollout_id, controller.routing(EVAL), controller.engine_unhealthy, weights
                    )
                except EvalFailed as exc:
                    return EvalResult(rollout_id, None, pin.weight_version, "eval_fleet", "unhealthy", str(exc))
                return _eval_result(rollout_id, samples, "eval_fleet", t0)
            finally:
                await self.runner.operate("release", allow=_NOT_NOW)
        finally:
            await self.runner.operate("eval_done", allow=_NOT_NOW)

    @property
    def state(self) -> RolloutStateName:
        return self.runner.state.rollout


_NOT_NOW = frozenset({"not_applicable", "blocked", "failed"})
REGENERATE = 1  # a rollout an external engine was replaced during is generated again this often, then refused


def _since(t0: float) -> float:
    return round(time.monotonic() - t0, 3)


def _eval_result(rollout_id: int, samples: list[Sample], on: str, t0: float) -> EvalResult:
    versions = sorted({str(s.get("weight_version")) for s in samples})
    reward = sum(float(s["reward"]) for s in samples) / len(samples)
    return EvalResult(rollout_id, reward, ",".join(versions), on, samples=len(samples), seconds=_since(t0))


class RolloutManager:
    """The facade miles calls the rollout manager: the controller and the executor over one job's runner.

    Every method is an operation of the lifecycle core (``lifecycle.decide.core.plan.OPERATIONS``); one the
    config does not allow (an offload without --offload-rollout) is a no-op, not an error.
    """

    def __init__(
        self,
        config: LifecycleConfig,
        task: Task,
        *,
        runner: Runner | None = None,
        launcher_factory: LauncherFactory | None = None,
        log: EventLog | None = None,
        ledger: EffectLedger | None = None,
        timeouts: Timeouts | None = None,
        seed: int = 0,
        rollout_fn_path: str | None = None,
        data_source_path: str | None = None,
        router: bool = False,
        log_dir: str | None = None,
        engine_ledger: EngineLedger | None = None,
    ) -> None:
        self.config = config
        task = checked_task(task, "RolloutManager(task=...)")
        self.runner = runner if runner is not None else Runner(config, log=log, ledger=ledger)
        self.controller = InferenceController(
            self.runner,
            launcher_factory=launcher_factory,
            timeouts=timeouts,
            seed=seed,
            router=router,
            log_dir=log_dir,
            engine_ledger=engine_ledger,
        )
        self.executor = RolloutExecutor(
            self.runner,
            self.controller,
            task,
            rollout_fn_path=rollout_fn_path,
            data_source_path=data_source_path,
        )
        tokens = PromptTokens()
        request = (timeouts or Timeouts()).request
        # --fully-async: the stream (started by the loop; a job that does not stream never starts it)
        self.stream = Stream(
            self.runner,
            self.controller,
            lambda: self.executor.task,
            lambda text: tokens.encode(self.controller.committed[0] if self.controller.committed else None, text),
            max_batches=config.async_data_buffer_max_batches or 2,
            group_timeout=(timeouts or Timeouts()).kept() + 2 * request,
        )

    @property
    def state(self) -> RolloutStateName:
        return self.runner.state.rollout

    async def init(self, weights: tuple[str, str]) -> None:
        """init (construction gate), then the servers with the initial weights -- unless replaying."""
        self.runner.committed = weights
        await self.runner.operate("init")
        self.controller.check()

    async def generate(self, rollout_id: int) -> list[Sample]:
        self.controller.check()
        return await self.executor.generate(rollout_id)

    async def eval(self, rollout_id: int) -> EvalResult:
        """miles' ``rollout_manager.eval``: restarted rollout engines catch up first, as for generate."""
        self.controller.check()
        return await self.executor.eval(rollout_id)

    async def catch_up(self) -> None:
        """Restarted engines load the committed weights (generate and eval do this first anyway)."""
        await self.runner.operate("catch_up", allow=_NOT_NOW)

    async def offload(self) -> None:
        await self.runner.operate("offload", allow=_NOT_NOW)
        self.controller.check()

    async def onload_weights(self) -> None:
        await self.runner.operate("onload_weights", allow=_NOT_NOW)
        self.controller.check()

    async def onload_kv(self) -> None:
        await self.runner.operate("onload_kv", allow=_NOT_NOW)
        self.controller.check()

    async def stop_engine(self, index: int) -> None:
        """An operator's stop: out of routing, killed, ``Stopped`` once its death is confirmed; never recovered."""
        await self.runner.operate("stop_engine", index)

    async def start_engine(self, index: int) -> None:
        """Start a stopped engine again; it waits in ``PendingWeights`` until a catch-up loads the weights."""
        await self.runner.operate("start_engine", index)

    async def dispose(self) -> None:
        try:
            await self.runner.operate("dispose", allow=_NOT_NOW)
        finally:
            await self.controller.close()
