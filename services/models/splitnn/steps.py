"""The per-party protocol steps of both topologies: numpy (or ciphertexts) in, numpy (or ciphertexts) out.

Two role classes cover both topologies:

* :class:`Bottom` — a party whose model output leaves it and who gets ∂L/∂output back. In coordinator-top
  that is every party (the active one included); in active-top the passive parties (one linear layer).
* :class:`Head` — the party that holds the loss: the coordinator's top model on h = Σ h_p
  (coordinator-top), or the active party's own bottom + top on [h_a, z_1..z_P] (active-top).

coordinator-top sums the parties' outputs under zero-sum masks: passive party p sends h_p + r_p, the active party
h_a − Σ r_p, and the key holder adds the shares (:func:`open_masked`), where the masks cancel. Because h = Σ h_p,
∂L/∂h_p = ∂L/∂h for every p: the key holder returns one gradient to all parties.

State (``to_state``/``from_state``) is the module's parameters, the optimiser's moments and the schedule's
epoch, as bytes; a step in flight (a forward awaiting its gradient) is not part of it, so engines checkpoint
between steps.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from vflsec.services.crypto import ring_mask

from .config import SplitNNConfig
from .modules import DTYPE, ActiveTopHead, build_bottom, build_top
from .optim import OptimizerConfig, build_optimizer

# The range of h the key holder trains on: an honest sum of bottom outputs of scaled features lies far inside it.
EMBEDDING_BOUND = 2.0**12


class _Trainable:
    """A module with its optimiser and per-epoch schedule, checkpointable as bytes."""

    def __init__(self, module: nn.Module, optim: OptimizerConfig) -> None:
        self.module = module
        self.optimizer, self.scheduler = build_optimizer(module.parameters(), optim)

    def end_epoch(self) -> None:
        self.scheduler.step()

    def at_epoch(self, epoch: int) -> None:
        """Take the schedule's rate of ``epoch`` (from 0), as ``epoch`` calls of :meth:`end_epoch` would: the services
        name each step's epoch in its messages, so every party's rate follows the active party's epochs."""
        if epoch != self.scheduler.last_epoch:
            self.scheduler.last_epoch = epoch
            factor = self.scheduler.lr_lambdas[0](epoch)
            for group, base in zip(self.optimizer.param_groups, self.scheduler.base_lrs, strict=True):
                group["lr"] = base * factor

    def to_state(self) -> bytes:
        buffer = io.BytesIO()
        torch.save(
            {
                "module": self.module.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
            },
            buffer,
        )
        return buffer.getvalue()

    def load_state(self, data: bytes) -> None:
        """Restore from :meth:`to_state` bytes; ValueError if they do not fit this module."""
        try:
            # weights_only: a checkpoint is data (tensors, numbers), never code to unpickle.
            state: dict[str, Any] = torch.load(io.BytesIO(data), weights_only=True)
            self.module.load_state_dict(state["module"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.scheduler.load_state_dict(state["scheduler"])
        except (RuntimeError, KeyError, TypeError, ValueError, EOFError, pickle.UnpicklingError) as exc:
            raise ValueError(f"split-NN state does not fit this {type(self).__name__}: {exc}") from exc


class Bottom(_Trainable):
    """A bottom model whose output crosses a party boundary: ``forward`` it, later ``backward`` its gradient."""

    def __init__(self, module: nn.Module, optim: OptimizerConfig, in_width: int, out_width: int) -> None:
        super().__init__(module, optim)
        self.in_width, self.out_width = in_width, out_width
        self._pending: torch.Tensor | None = None  # the training forward awaiting its gradient

    @classmethod
    def create(cls, config: SplitNNConfig, party: int, optim: OptimizerConfig, seed: int) -> Bottom:
        return cls(build_bottom(config, party, seed), optim, config.features[party], config.output_width(party))

    @classmethod
    def from_state(cls, config: SplitNNConfig, party: int, optim: OptimizerConfig, data: bytes) -> Bottom:
        bottom = cls.create(config, party, optim, seed=0)  # every parameter is overwritten by the state
        bottom.load_state(data)
        return bottom

    def forward(self, x: np.ndarray, *, train: bool) -> np.ndarray:
        """The output (batch, out_width) for this party's rows ``x``; ``train`` keeps the graph for backward."""
        x_t = _tensor(x, "bottom input", self.in_width)
        self.module.train(train)
        if not train:
            with torch.no_grad():
                return self.module(x_t).numpy()
        self._pending = self.module(x_t)
        return self._pending.detach().numpy().copy()

    def backward(self, grad: np.ndarray) -> None:
        """Back-propagate ∂L/∂output of the pending training forward and take one optimiser step."""
        if self._pending is None:
            raise ValueError("no training forward awaits a gradient")
        grad_t = _tensor(grad, "gradient", self.out_width)
        if grad_t.shape != self._pending.shape:
            raise ValueError(f"gradient has shape {tuple(grad_t.shape)}, the output had {tuple(self._pending.shape)}")
        self.optimizer.zero_grad()
        self._pending.backward(grad_t)
        self.optimizer.step()
        self._pending = None


@dataclass(frozen=True)
class HeadStep:
    """What a head's training step gives back: ∂L/∂input for each received input, and the batch loss."""

    grads: list[np.ndarray]
    loss: float


class Head(_Trainable):
    """The loss holder. Its module takes (local input, if any, then) the received inputs and returns logits."""

    def __init__(
        self,
        module: nn.Module,
        optim: OptimizerConfig,
        n_classes: int,
        received_widths: Sequence[int],
        local_width: int | None = None,
    ) -> None:
        super().__init__(module, optim)
        self.n_classes = n_classes
        self.received_widths, self.local_width = tuple(received_widths), local_width

    @classmethod
    def create(cls, config: SplitNNConfig, optim: OptimizerConfig, seed: int) -> Head:
        if config.topology == "coordinator-top":
            return cls(build_top(config, seed), optim, config.n_classes, [config.embedding])
        passive = [config.output_width(p) for p in range(1, len(config.features))]
        return cls(ActiveTopHead(config, seed), optim, config.n_classes, passive, config.features[0])

    @classmethod
    def from_state(cls, config: SplitNNConfig, optim: OptimizerConfig, data: bytes) -> Head:
        head = cls.create(config, optim, seed=0)
        head.load_state(data)
        return head

    def _inputs(self, received: Sequence[np.ndarray]) -> list[torch.Tensor]:
        if len(received) != len(self.received_widths):
            raise ValueError(f"expected {len(self.received_widths)} received inputs, got {len(received)}")
        pairs = enumerate(zip(received, self.received_widths, strict=True))
        return [_tensor(r, f"received input {i}", w) for i, (r, w) in pairs]

    def _logits(self, received: Sequence[torch.Tensor], local: np.ndarray | None) -> torch.Tensor:
        if (local is None) != (self.local_width is None):
            raise ValueError("the active-top head needs its party's own rows; the coordinator-top head takes none")
        args = [] if local is None else [_tensor(local, "local input", self.local_width)]
        rows = {t.shape[0] for t in [*args, *received]}
        if len(rows) != 1:
            raise ValueError(f"inputs disagree on the batch size: {sorted(rows)}")
        return self.module(*args, *received)

    def train_step(self, received: Sequence[np.ndarray], y: np.ndarray, local: np.ndarray | None = None) -> HeadStep:
        """One step on mean cross-entropy: returns ∂L/∂(each received input) and steps the head's parameters."""
        inputs = [t.requires_grad_() for t in self._inputs(received)]
        labels = torch.as_tensor(np.asarray(y), dtype=torch.int64)
        if labels.ndim != 1 or not bool(((labels >= 0) & (labels < self.n_classes)).all()):
            raise ValueError(f"labels must be a 1-D vector of classes 0..{self.n_classes - 1}")
        self.module.train()
        logits = self._logits(inputs, local)
        if logits.shape[0] != labels.shape[0]:
            raise ValueError(f"{labels.shape[0]} labels for a batch of {logits.shape[0]}")
        loss = F.cross_entropy(logits, labels)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return HeadStep([t.grad.numpy().copy() for t in inputs], float(loss.item()))

    def scores(self, received: Sequence[np.ndarray], local: np.ndarray | None = None) -> np.ndarray:
        """Confidence scores softmax(logits), (batch, n_classes): what coordinator-top's release chain gets."""
        self.module.eval()
        with torch.no_grad():
            logits = self._logits(self._inputs(received), local)
            return torch.softmax(logits, dim=1).numpy()


# ------------------------------------------------------------------------------ coordinator-top masked sum


def open_masked(shares: Sequence[np.ndarray]) -> np.ndarray:
    """Key holder: h from every party's share of a step (:func:`ring_mask.open_sum`), clipped to ±EMBEDDING_BOUND."""
    return ring_mask.open_sum(shares, EMBEDDING_BOUND)


def _tensor(values: np.ndarray, what: str, width: int) -> torch.Tensor:
    arr = _finite(values, what)
    if arr.ndim != 2 or arr.shape[0] < 1 or arr.shape[1] != width:
        raise ValueError(f"{what} must have shape (batch >= 1, {width}), got {arr.shape}")
    return torch.tensor(arr, dtype=DTYPE)


def _finite(values: np.ndarray, what: str) -> np.ndarray:
    arr = np.asarray(values, dtype=np.float64)
    if not np.isfinite(arr).all():
        raise ValueError(f"{what} contains non-finite values")
    return arr
