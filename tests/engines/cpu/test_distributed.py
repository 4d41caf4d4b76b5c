"""The CPU engine's weight-update group (SGLang's distributed update), real processes over gloo.

The test process is rank 0 (the trainer's side, :class:`engines.models.weight_group.WeightGroup`); two CPU engine
processes join through ``/init_weights_update_group`` and receive through ``/update_weights_from_distributed``
while rank 0 broadcasts. After a broadcast every tensor an engine holds (``/get_weights_by_name``) equals
rank 0's; an engine SIGKILLed mid-broadcast makes rank 0 and the survivor fail (bounded), and the survivor
says its weights are torn.
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import pytest
import torch

from engines.client import EngineClient
from engines.errors import EngineHTTPError
from engines.models import TinyCausalLM
from engines.models.weight_group import TensorMeta, WeightGroup, WeightGroupError, buckets, metas_of
from engines.process import ServerProcess
from tests.helpers import free_port

pytestmark = pytest.mark.weight_update
BOUND = 120.0  # a hang would fail here; the collectives' own deadline is 20 s (conftest: weight_group_timeout_s)


def clients(engines: list[ServerProcess]) -> list[EngineClient]:
    return [EngineClient(e.url, engine_id=f"r-{k}", timeout=60.0) for k, e in enumerate(engines)]


async def join(cs: list[EngineClient]) -> WeightGroup:
    port = free_port()
    world = 1 + len(cs)
    sender = asyncio.to_thread(WeightGroup, "127.0.0.1", port, 0, world, timeout=20.0, name="weight_update_group")
    joined = [c.init_weights_update_group("127.0.0.1", port, 1 + k, world) for k, c in enumerate(cs)]
    group, *_ = await asyncio.gather(sender, *joined)
    return group


async def send(group: WeightGroup, cs: list[EngineClient], bucket: list[TensorMeta], state: dict[str, Any], **kw: Any):
    """One bucket: rank 0 broadcasts while every engine receives (what trainer.app.broadcast does)."""
    names, dtypes, shapes = [m.name for m in bucket], [m.dtype for m in bucket], [list(m.shape) for m in bucket]
    recv = [c.update_weights_from_distributed(names, dtypes, shapes, **kw) for c in cs]
    return await asyncio.gather(
        asyncio.to_thread(group.broadcast, [state[n] for n in names]), *recv, return_exceptions=True
    )


def test_a_broadcast_leaves_every_engine_holding_rank_0s_tensors_tensor_for_tensor(receivers):
    source = TinyCausalLM("tiny", seed=99)  # other weights than either engine's seed
    state = {n: p.detach().contiguous() for n, p in source.named_parameters()}
    plan = buckets(metas_of(state), max_bytes=64 * 1024)
    assert len(plan) >= 2  # the test covers several buckets, and a version only with the last

    async def main() -> tuple[list[dict[str, Any]], list[dict[str, list[Any]]], list[Any]]:
        cs = clients(receivers)
        group = await join(cs)
        for k, bucket in enumerate(plan):
            version = "v1" if k == len(plan) - 1 else None
            results = await send(group, cs, bucket, state, weight_version=version)
            assert not any(isinstance(r, BaseException) for r in results), results
        held = [{n: await c.get_weights_by_name(n, truncate_size=1 << 20) for n in state} for c in cs]
        infos = [(await c.server_info()).internal_states[0] for c in cs]
        versions = [(await c.model_info()).weight_version for c in cs]
        for c in cs:
            await c.destroy_weights_update_group()
            await c.close()
        group.close()
        return infos, held, versions

    infos, held, versions = asyncio.run(asyncio.wait_for(main(), BOUND))
    assert versions == ["v1", "v1"]
    for tensors in held:
        for name, values in tensors.items():
            assert torch.equal(torch.tensor(values, dtype=state[name].dtype), state[name]), name
    assert [i["weights_torn"] for i in infos] == [False, False]
    assert all(i["weight_groups"] == ["weight_update_group"] for i in infos)


def test_a_destroyed_group_is_gone_from_the_engine_and_the_next_update_forms_it_again(receivers):
    """The engine's side of the teardown: after ``/destroy_weights_update_group`` it holds no group, so the next
    update's ``/init_weights_update_group`` is accepted (a kept group would be refused: "destroy it first")."""

    async def main() -> list[list[str]]:
        cs = clients(receivers)
        held = []
        for _ in range(2):
            group = await join(cs)
            for c in cs:
                await c.destroy_weights_update_group()
            group.close()
            held += [(await c.server_info()).internal_states[0]["weight_groups"] for c in cs]
        for c in cs:
            await c.close()
        return held

    assert asyncio.run(asyncio.wait_for(main(), BOUND)) == [[]] * 4


def test_an_engine_killed_mid_broadcast_fails_rank_0_and_the_survivor_within_the_bound(receivers):
    source = TinyCausalLM("tiny", seed=98)
    state = {n: p.detach().contiguous() for n, p in source.named_parameters()}
    plan = buckets(metas_of(state), max_bytes=64 * 1024)
    victim = receivers[1]

    async def main() -> tuple[list[Any], dict[str, Any], str]:
        cs = clients(receivers)
        group = await join(cs)
        first = await send(group, cs, plan[0], state)  # bucket 1 arrives everywhere
        assert not any(isinstance(r, BaseException) for r in first), first
        os.kill(victim.pid, signal.SIGKILL)  # the engine dies between two buckets
        second = await send(group, cs, plan[1], state, weight_version="v2")
        group.close()
        info = (await cs[0].server_info()).internal_states[0]
        version = (await cs[0].model_info()).weight_version
        await cs[0].destroy_weights_update_group()
        for c in cs:
            await c.close()
        return second, info, version

    second, info, version = asyncio.run(asyncio.wait_for(main(), BOUND))
    sender, to_survivor, to_victim = second
    assert isinstance(sender, WeightGroupError), sender  # rank 0 fails, it does not hang
    assert isinstance(to_survivor, EngineHTTPError) and '"success":false' in to_survivor.body.replace(" ", "")
    assert isinstance(to_victim, Exception)  # the dead engine's request failed too
    assert info["weights_torn"] is True  # bucket 1 is in, bucket 2 is not: a mix of two versions
    assert version != "v2"
