"""Weight-transfer engines for vLLM's weight-update session on CPU (vLLM's ``vllm.general_plugins`` entry point).

vLLM drives an update as ``/start_weight_update``, one or more ``/update_weights {"update_info": ...}`` and
``/finish_weight_update {"weight_version": V}``; inside the worker each step goes to the engine that
``--weight-transfer-config '{"backend": NAME}'`` names. The built-in ones need GPUs, so we add:

- ``lifecycle_disk``: ``update_info = {"path": DIR}``, a Hugging Face checkpoint directory as our trainer writes
  it (:func:`engines.models.checkpoint.write_checkpoint`); ``init_info`` is ``{}`` (or not sent at all).
- ``lifecycle_gloo``: ``init_info = {"address", "port", "rank", "world_size", "timeout", "group_name"?}`` joins
  the trainer's :class:`~engines.models.weight_group.WeightGroup`; ``update_info = {"names", "dtype_names",
  "shapes", "group_name"?}`` (nccl's field names) receives one bucket of the trainer's broadcast; a bucket naming
  another group than the one joined (another generation) is refused.
- ``lifecycle``: both kinds of ``update_info`` (the backend is one name per server, fixed at its start).
- every backend: ``update_info = {"abort": true}`` fails on purpose, which ends the session with nothing applied
  (vLLM has no abort call; a caller that lost track of a session, or whose sibling engine failed, uses it).

Why updates are *staged* and applied at finish: vLLM's worker forgets a session whose ``update_weights`` raised
(it calls nothing on the engine), and layerwise reload leaves every not-yet-loaded layer on the meta device
between start and finish -- so loading chunk by chunk, as vLLM's nccl engine does, turns a failed chunk
(a bad path, a trainer that died mid-broadcast) into a server whose next forward pass crashes. Here each
``update_weights`` only checks its tensors against the served model's layout and keeps them; ``finish`` loads
all of them in one layerwise reload. A failed update therefore leaves the old weights (and the old version)
serving, and generation between start and finish still runs on the old weights. The cost: one extra copy of
the updated tensors in the worker's memory until finish.

Registering is idempotent: vLLM may load plugins more than once per process.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file
from vllm.distributed.weight_transfer.base import WeightTransferEngine
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

from engines.models.weight_group import WeightGroup, WeightGroupError, dtype_name, parse_dtype

log = logging.getLogger(__name__)

DISK, GLOO, EITHER = "lifecycle_disk", "lifecycle_gloo", "lifecycle"
ABORT = "abort"  # update_info {"abort": true}: end the session, nothing applied (vLLM has no abort call)
GROUP_NAME = "weight_update_group"  # the trainer's (trainer/app/broadcast.py), SGLang's default
Layout = dict[str, tuple[str, tuple[int, ...]]]  # tensor name -> (dtype name, shape), checkpoint naming


class WeightUpdateError(ValueError):
    """An update this engine refused or could not receive; the message says which and how to fix it.

    A ValueError so that a caller in the worker reads it as bad input, not as a crashed engine."""


@dataclass
class NoInitInfo:
    """``lifecycle_disk`` needs no connection: ``/init_weight_transfer_engine`` takes ``{}``."""


@dataclass
class GroupInitInfo:
    address: str
    port: int
    rank: int
    world_size: int
    timeout: float = 60.0
    group_name: str = GROUP_NAME


@dataclass
class DiskUpdateInfo:
    path: str


@dataclass
class BucketUpdateInfo:
    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    group_name: str | None = None  # the generation's group it belongs to (None: whichever was joined)

    def __post_init__(self) -> None:
        if not len(self.names) == len(self.dtype_names) == len(self.shapes):
            raise WeightUpdateError(
                f"a bucket needs as many dtype_names and shapes as names: got {len(self.names)} names, "
                f"{len(self.dtype_names)} dtype_names, {len(self.shapes)} shapes"
            )


UpdateInfo = DiskUpdateInfo | BucketUpdateInfo


def _files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.safetensors"))


def read_layout(files: Iterable[Path]) -> Layout:
    """Names, dtypes and shapes from the safetensors headers (no tensor data is read)."""
    layout: Layout = {}
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                piece = st.get_slice(name)
                layout[name] = (_st_dtype(piece.get_dtype()), tuple(piece.get_shape()))
    return layout


def _st_dtype(name: str) -> str:
    return {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64", "I64": "int64"}.get(name, name)


def layout_problems(layout: Layout, served: Layout, *, complete: bool) -> list[str]:
    """Why ``layout`` does not fit the served model: unknown names, other shapes, (if ``complete``) missing names.

    Dtypes may differ (vLLM's loaders cast into the served dtype)."""
    problems: list[str] = []
    unknown = sorted(set(layout) - set(served))
    if unknown:
        problems.append(f"{len(unknown)} tensor(s) the served model does not have, e.g. {', '.join(unknown[:3])}")
    shapes = [
        f"{n} {list(layout[n][1])} (served {list(served[n][1])})"
        for n in layout
        if n in served and layout[n][1] != served[n][1]
    ]
    if shapes:
        problems.append(f"{len(shapes)} tensor(s) of another shape, e.g. {'; '.join(shapes[:3])}")
    if complete:
        missing = sorted(set(served) - set(layout))
        if missing:
            problems.append(f"{len(missing)} tensor(s) missing, e.g. {', '.join(missing[:3])}")
    return problems


class LifecycleEngine(WeightTransferEngine):  # type: ignore[misc]  # vllm is untyped where mypy runs
    """``lifecycle``: a checkpoint directory or the trainer's broadcast, staged per update and applied at finish."""

    backend = EITHER
    kinds: tuple[type[Any], ...] = (DiskUpdateInfo, BucketUpdateInfo)
    init_info_cls: type[Any] = GroupInitInfo
    update_info_cls: type[Any] = DiskUpdateInfo  # unused: parse_update_info picks the kind
    supports_draft_weight_update = False

    def __init__(self, config: Any, vllm_config: Any, device: torch.device, model: torch.nn.Module) -> None:
        super().__init__(config, vllm_config, device, model)
        self.group: WeightGroup | None = None
        self.staged: dict[str, torch.Tensor] = {}
        self.served, self.served_architectures = self._served_layout()

    # -- what the served model looks like ------------------------------------------------------------------
    def _served_layout(self) -> tuple[Layout, list[str]]:
        """The served checkpoint's tensors (headers only) and architectures: every update is checked against
        them *before* anything is loaded, so a wrong checkpoint never touches the model."""
        architectures = list(getattr(self.model_config.hf_config, "architectures", None) or [])
        directory = Path(str(self.model_config.model))
        files = _files(directory) if directory.is_dir() else []
        if not files:
            log.warning("%s: %s is no local safetensors checkpoint: updates go unchecked", self.backend, directory)
            return {}, architectures
        return read_layout(files), architectures

    def _check(self, layout: Layout, *, complete: bool, what: str) -> None:
        if not self.served:
            return
        problems = layout_problems(layout, self.served, complete=complete)
        if problems:
            served = self.model_config.model
            raise WeightUpdateError(f"{what} does not fit the served model ({served}): " + "; ".join(problems))

    # -- the session ----------------------------------------------------------------------------------------
    def parse_init_info(self, init_dict: dict[str, Any]) -> Any:
        if not init_dict:  # every backend takes {}: nothing to connect (a group is joined with its fields)
            return NoInitInfo()
        try:
            return self.init_info_cls(**init_dict)
        except TypeError as exc:
            raise WeightUpdateError(f"backend {self.backend}: bad init_info {sorted(init_dict)}: {exc}") from None

    def parse_update_info(self, update_dict: dict[str, Any]) -> UpdateInfo:
        if ABORT in update_dict:
            raise WeightUpdateError(f"update aborted on request ({ABORT!r}): nothing of this session was applied")
        kind: type[Any] | None = (
            DiskUpdateInfo if "path" in update_dict else BucketUpdateInfo if "names" in update_dict else None
        )
        if kind is None or kind not in self.kinds:
            wanted = " or ".join(
                '{"path": DIR}' if k is DiskUpdateInfo else '{"names", "dtype_names", "shapes"}' for k in self.kinds
            )
            hint = f' (a server takes both with --weight-transfer-config \'{{"backend": "{EITHER}"}}\')'
            got = sorted(update_dict)
            raise WeightUpdateError(f"backend {self.backend} takes update_info {wanted}, not {got}{hint}")
        try:
            info: UpdateInfo = kind(**update_dict)
        except TypeError as exc:
            raise WeightUpdateError(f"backend {self.backend}: bad update_info {sorted(update_dict)}: {exc}") from None
        return info

    def init_transfer_engine(self, init_info: Any) -> None:
        if isinstance(init_info, NoInitInfo):
            return
        self._leave()
        try:
            self.group = WeightGroup(
                init_info.address,
                int(init_info.port),
                int(init_info.rank),
                int(init_info.world_size),
                timeout=float(init_info.timeout),
                name=init_info.group_name,
            )
        except WeightGroupError as exc:
            raise WeightUpdateError(str(exc)) from None

    def start_weight_update(self) -> None:
        self.staged = {}  # what an earlier, failed session left

    def update_weights(self, update_info: dict[str, Any]) -> None:
        """Stage one chunk. The base class would also call torch.accelerator.synchronize(), which vLLM's CPU
        worker replaces with a no-op; nothing here is asynchronous, so it is left out."""
        try:
            self.receive_weights(self.parse_update_info(update_info))
        except BaseException:
            self.staged = {}  # vLLM's worker ends the session: nothing of it may be applied later
            raise

    def receive_weights(self, update_info: UpdateInfo) -> None:
        if isinstance(update_info, DiskUpdateInfo):
            self.staged.update(self._read_checkpoint(update_info.path))
        else:
            self.staged.update(self._receive_bucket(update_info))

    def finish_weight_update(self) -> None:
        staged, self.staged = self.staged, {}
        if staged:
            self._apply(staged)

    def shutdown(self) -> None:
        self._leave()

    # -- disk -----------------------------------------------------------------------------------------------
    def _read_checkpoint(self, path: str) -> dict[str, torch.Tensor]:
        directory = Path(path)
        if not directory.is_dir():
            raise WeightUpdateError(f"checkpoint {path}: not a directory (want config.json + model.safetensors)")
        files = _files(directory)
        if not files:
            raise WeightUpdateError(f"checkpoint {path}: no *.safetensors file in it")
        config = directory / "config.json"
        if config.is_file() and self.served_architectures:
            try:
                architectures = list(json.loads(config.read_text()).get("architectures") or [])
            except (OSError, ValueError) as exc:
                raise WeightUpdateError(f"checkpoint {path}: config.json is unreadable: {exc}") from None
            if architectures and architectures != self.served_architectures:
                raise WeightUpdateError(
                    f"checkpoint {path}: architecture {architectures}, but the server runs {self.served_architectures}"
                )
        try:
            layout = read_layout(files)
        except Exception as exc:  # a truncated or foreign file
            raise WeightUpdateError(f"checkpoint {path}: unreadable safetensors: {exc}") from None
        self._check(layout, complete=True, what=f"checkpoint {path}")
        tensors: dict[str, torch.Tensor] = {}
        for f in files:
            tensors.update(load_file(str(f), device="cpu"))
        return tensors

    # -- broadcast ------------------------------------------------------------------------------------------
    def _receive_bucket(self, bucket: BucketUpdateInfo) -> dict[str, torch.Tensor]:
        """Receive one bucket from rank 0. Any failure leaves the group at once, so the trainer (blocked in the
        same collective) fails now rather than at its deadline; a new ``/init_weight_transfer_engine`` rejoins."""
        if self.group is None:
            raise WeightUpdateError(
                f"backend {self.backend}: no weight-update group; call /init_weight_transfer_engine first"
            )
        if bucket.group_name is not None and bucket.group_name != self.group.name:
            raise WeightUpdateError(
                f"bucket of weight-update group {bucket.group_name!r}, but this engine is in {self.group.name!r}: "
                "a bucket of another generation is refused (each membership forms a new group)"
            )
        try:
            dtypes = [parse_dtype(d) for d in bucket.dtype_names]
            layout = {
                n: (dtype_name(d), tuple(int(x) for x in s))
                for n, d, s in zip(bucket.names, dtypes, bucket.shapes, strict=True)
            }
            self._check(layout, complete=False, what="bucket")
            tensors = [torch.empty(tuple(s), dtype=d) for s, d in zip(bucket.shapes, dtypes, strict=True)]
            self.group.broadcast(tensors)
        except (WeightGroupError, WeightUpdateError) as exc:
            self._leave()
            raise WeightUpdateError(f"{exc} (this engine left the group; rejoin before the next update)") from None
        except BaseException:
            self._leave()
            raise
        return dict(zip(bucket.names, tensors, strict=True))

    def _leave(self) -> None:
        group, self.group = self.group, None
        if group is not None:
            group.close()

    # -- applying -------------------------------------------------------------------------------------------
    def _apply(self, staged: Mapping[str, torch.Tensor]) -> None:
        """One layerwise reload of every staged tensor (it processes each layer when its last tensor arrives)."""
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

        initialize_layerwise_reload(self.model)
        try:
            self.model.load_weights(iter(staged.items()))
        except BaseException:
            _drop_partial_layers(self.model)  # put their old tensors back instead of half-loaded ones
            finalize_layerwise_reload(self.model, self.model_config)
            raise
        finalize_layerwise_reload(self.model, self.model_config)


def _drop_partial_layers(model: torch.nn.Module) -> None:
    """Forget what a failed load buffered for layers it did not finish, so that finalizing puts their old
    tensors back (layers it finished already hold the new values)."""
    from vllm.model_executor.model_loader.reload import get_layerwise_info

    for layer in model.modules():
        info = get_layerwise_info(layer)
        if info.can_load() and info.load_numel > 0:
            info.load_numel = 0
            info.loaded_weights = []


class LifecycleDiskEngine(LifecycleEngine):
    """``lifecycle_disk``: checkpoint directories only; no connection to set up."""

    backend = DISK
    kinds = (DiskUpdateInfo,)
    init_info_cls = NoInitInfo


class LifecycleGlooEngine(LifecycleEngine):
    """``lifecycle_gloo``: the trainer's gloo broadcast only."""

    backend = GLOO
    kinds = (BucketUpdateInfo,)
    update_info_cls = BucketUpdateInfo


ENGINES: dict[str, type[LifecycleEngine]] = {
    DISK: LifecycleDiskEngine,
    GLOO: LifecycleGlooEngine,
    EITHER: LifecycleEngine,
}


def register() -> None:
    """The ``vllm.general_plugins`` entry point: add our backends to vLLM's registry (once per process)."""
    for name, engine in ENGINES.items():
        with contextlib.suppress(ValueError):  # registered already (a second load in this process)
            WeightTransferEngineFactory.register_engine(name, engine)
