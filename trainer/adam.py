"""Adam (Kingma & Ba) for the project's trainer, without ``torch.optim``.

Any use of ``torch.optim`` imports ``torch._dynamo`` (its ``Optimizer`` routes ``add_param_group``, ``zero_grad``,
``step`` and the state dicts through torch.compile's guards), sympy with it: 1.5 s of CPU in every trainer worker that
starts -- a run's, a healed one's, each test's. This class takes the same update, op for op, as torch's single-tensor
Adam (what ``torch.optim.Adam`` runs on CPU), so the weights it produces are bit-identical
(``tests/trainer/test_adam.py`` compares them step by step).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch


class Adam:
    """Adam over a fixed list of parameters (no weight decay, no AMSGrad): what :class:`trainer.grpo.GRPOBackend`
    uses. A parameter without a gradient is skipped, its step count unchanged, as torch does."""

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        *,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        self.params = list(params)
        self.lr, self.betas, self.eps = lr, betas, eps
        self.state: dict[int, dict[str, Any]] = {}  # by the parameter's index: step, exp_avg, exp_avg_sq

    def zero_grad(self) -> None:
        for param in self.params:
            param.grad = None

    def step(self) -> None:
        with torch.no_grad():
            self._step()

    def _step(self) -> None:
        beta1, beta2 = self.betas
        for i, param in enumerate(self.params):
            grad = param.grad
            if grad is None:
                continue
            state = self.state.get(i)
            if state is None:
                state = self.state[i] = {
                    "step": 0,
                    "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
                    "exp_avg_sq": torch.zeros_like(param, memory_format=torch.preserve_format),
                }
            state["step"] += 1
            exp_avg, exp_avg_sq, step = state["exp_avg"], state["exp_avg_sq"], float(state["step"])
            exp_avg.lerp_(grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            step_size = self.lr / (1 - beta1**step)
            denom = (exp_avg_sq.sqrt() / (1 - beta2**step) ** 0.5).add_(self.eps)
            param.addcdiv_(exp_avg, denom, value=-step_size)

    def state_dict(self) -> dict[str, Any]:
        """The moments by parameter index (the tensors themselves, as torch's ``state_dict`` gives them)."""
        return {"state": {i: dict(s) for i, s in self.state.items()}, "lr": self.lr, "betas": self.betas}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """What :meth:`state_dict` returned for the same parameters, or what ``torch.optim.Adam``'s did (a job
        checkpoint written before this class: its hyperparameters in ``param_groups``, each step a tensor). The
        moments are copied: a state handed to two optimizers must not be stepped twice."""
        group = state_dict["param_groups"][0] if "param_groups" in state_dict else state_dict
        self.lr, self.betas = float(group["lr"]), (float(group["betas"][0]), float(group["betas"][1]))
        self.state = {
            int(i): {"step": int(float(s["step"])), **{k: s[k].clone() for k in ("exp_avg", "exp_avg_sq")}}
            for i, s in state_dict["state"].items()
        }
