"""Optimiser and learning-rate schedule of a split-NN, the same for every party and the central reference.

Every optimiser here is element-wise in the parameters (SGD with momentum, Adam, L2 weight decay
added to the gradient), so one optimiser per party over its own parameters takes exactly the steps one optimiser over
the whole network would: the federated run and the central reference stay comparable step for step.
The schedule is stepped once per epoch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, get_args

import torch

from .config import DictForm, positive_int

OptimizerName = Literal["sgd", "adam"]
Schedule = Literal["constant", "step", "cosine"]


@dataclass(frozen=True)
class OptimizerConfig(DictForm):
    """``step`` multiplies the rate by ``gamma`` every ``step_epochs`` epochs; ``cosine`` anneals it from
    ``learning_rate`` towards 0 over ``epochs`` epochs (it needs them)."""

    name: OptimizerName = "adam"
    learning_rate: float = 0.01
    momentum: float = 0.9  # sgd only
    weight_decay: float = 0.0
    schedule: Schedule = "constant"
    step_epochs: int = 10
    gamma: float = 0.5
    epochs: int | None = None

    def __post_init__(self) -> None:
        problems = [
            (self.name not in get_args(OptimizerName), f"name must be one of {get_args(OptimizerName)}"),
            (not _finite(self.learning_rate) or self.learning_rate <= 0, "learning_rate must be positive"),
            (not _finite(self.momentum) or not 0 <= self.momentum < 1, "momentum must lie in [0, 1)"),
            (not _finite(self.weight_decay) or self.weight_decay < 0, "weight_decay must be >= 0"),
            (self.schedule not in get_args(Schedule), f"schedule must be one of {get_args(Schedule)}"),
            (not positive_int(self.step_epochs), "step_epochs must be a positive integer"),
            (not _finite(self.gamma) or not 0 < self.gamma <= 1, "gamma must lie in (0, 1]"),
            (self.epochs is not None and not positive_int(self.epochs), "epochs must be a positive integer"),
            (self.schedule == "cosine" and self.epochs is None, "the cosine schedule needs epochs (its horizon)"),
        ]
        for failed, message in problems:
            if failed:
                raise ValueError(f"split-NN optimizer: {message}; got {self}")

    def rate_factor(self, epoch: int) -> float:
        """The learning rate of ``epoch`` (0-based) relative to ``learning_rate``."""
        if self.schedule == "step":
            return self.gamma ** (epoch // self.step_epochs)
        if self.schedule == "cosine":
            assert self.epochs is not None  # checked in __post_init__
            return 0.5 * (1.0 + math.cos(math.pi * min(epoch, self.epochs) / self.epochs))
        return 1.0


def build_optimizer(
    params: Iterable[torch.nn.Parameter], config: OptimizerConfig
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """The optimiser over ``params`` and its per-epoch scheduler."""
    params = list(params)
    if config.name == "sgd":
        opt: torch.optim.Optimizer = torch.optim.SGD(
            params, lr=config.learning_rate, momentum=config.momentum, weight_decay=config.weight_decay
        )
    else:
        opt = torch.optim.Adam(params, lr=config.learning_rate, weight_decay=config.weight_decay)
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, config.rate_factor)


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
