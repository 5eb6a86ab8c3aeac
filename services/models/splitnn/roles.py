"""The split-NN family's roles (each party's trainer; the family, trainers.py, builds them): both topologies
through the services.

One step (docs/protocol.md, "Split neural networks"): every passive party sends the coordinator h_p + r_p, its
bottom model's embedding under its own zero-sum mask (services/crypto/ring_mask.py); the active party sends
h_a − Σ_p r_p with the batch's labels; the key holder adds the shares in Z_2^64, where the masks cancel, steps the
top model on h and returns ∂L/∂h; every party back-propagates that one gradient through its bottom (h = Σ h_p, so
∂L/∂h_p = ∂L/∂h). Nothing is encrypted or decrypted in training: a sum needs no HE. Inference is the engines'
family-agnostic path: each party's share is its h_p, the key holder turns their masked sum into softmax(top(h)),
and the score-release chain runs on that.

A role builds only the modules it holds, from the settings every party received at session creation and its own
width: the other parties' widths never enter its modules (:meth:`SplitNNSettings.view`).

active-top (ye's setting, classic split learning): each passive party sends z_B = W_B x_B (+ b) to the active party
in the clear (``PlainForward``, on a plain session only: there is nothing the coordinator could protect), the active
party runs its own bottom and the top on [h_a, z_1, ..., z_P] and returns ∂L/∂z_p to each; it scores its own
predictions (no release point in this topology).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np
from torch import nn

from vflsec.services import kinds
from vflsec.services.crypto import ring_mask
from vflsec.services.errors import FailedPrecondition, InvalidArgument
from vflsec.services.models.family import (
    ActiveContext,
    DictForm,
    PassiveContext,
    Release,
    ReleaseCall,
    ReleasedModel,
    State,
)

from . import modules
from .config import TOPOLOGIES, SplitNNConfig
from .optim import OptimizerConfig
from .steps import Bottom, Head, open_masked

NAME = "splitnn"


@dataclass(frozen=True)
class SplitNNSettings(DictForm):
    """What the active party chooses at session creation: the architecture (a :class:`.config.SplitNNConfig`
    without the parties' widths) and the optimiser. ``party`` is the receiving party's position (0: the active
    party; 1..P the passive parties, in the session's order). ``seed`` is the session's (batch order, data splits):
    no module is initialised from it; each party draws its modules' weights from its own OS entropy
    (:func:`.modules.own_seed`)."""

    topology: str = "coordinator-top"
    embedding: int = 16
    passive_width: int | None = None  # active-top: width of z_B (None: max(d_B, 8))
    passive_bias: bool = False  # active-top: z_B = W_B x_B + b
    # active-top, the active party's copy only: each passive party's z_p width as it announced it at JoinSession
    # (a party's embedding defense may widen the default); empty: passive_width or max(d_p, 8) each.
    passive_widths: tuple[int, ...] = ()
    bottom_hidden: tuple[int, ...] = ()
    top_hidden: tuple[int, ...] = (32,)
    activation: str = "relu"
    dropout: float = 0.0
    bottom_bias: bool = True
    top_bias: bool = True
    optimizer: dict[str, Any] = field(default_factory=dict)  # .optim.OptimizerConfig fields
    seed: int = 0
    party: int = 0
    # coordinator-top: the active party's gradient defense specs (services/defenses/gradients.py), in order
    gradient_defense: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "gradient_defense", tuple(self.gradient_defense))
        if self.gradient_defense and self.topology != "coordinator-top":  # the specs are parsed by the active engine
            raise ValueError("gradient_defense applies to the coordinator-top topology only (active-top: not yet)")
        object.__setattr__(self, "bottom_hidden", tuple(self.bottom_hidden))
        object.__setattr__(self, "top_hidden", tuple(self.top_hidden))
        object.__setattr__(self, "passive_widths", tuple(self.passive_widths))
        if self.topology not in TOPOLOGIES:
            raise ValueError(f"topology must be one of {', '.join(TOPOLOGIES)}, got {self.topology!r}")
        if not isinstance(self.party, int) or self.party < 0:
            raise ValueError(f"party must be a position >= 0, got {self.party!r}")
        OptimizerConfig(**self.optimizer)  # validates the optimiser and its schedule
        self.view(1, 2)  # validates the architecture
        if self.passive_widths:  # their own checks (the bounds against each d_p run where the widths are known)
            self.network((1, *self.passive_widths), 2)

    @property
    def optim(self) -> OptimizerConfig:
        return OptimizerConfig(**self.optimizer)

    def view(self, width: int, n_classes: int) -> SplitNNConfig:
        """The network as this party builds it: its own bottom (``width`` features at position ``party``) and, in
        coordinator-top, the top, whose input is the E-wide sum h whatever the parties' widths are. Other positions
        get width 1: they are never read by a module this party builds."""
        features = tuple(width if p == self.party else 1 for p in range(max(self.party + 1, 2)))
        return self.network(features, n_classes, passive_widths=())

    def network(
        self, features: tuple[int, ...], n_classes: int, passive_widths: tuple[int, ...] | None = None
    ) -> SplitNNConfig:
        """The whole network for these party widths (active first); ``passive_widths`` None: the announced ones."""
        active_top = self.topology == "active-top"
        return SplitNNConfig(
            topology=self.topology,  # type: ignore[arg-type]
            features=features,
            n_classes=n_classes,
            embedding=self.embedding,
            # active-top: passive bottoms are one linear layer (ye's setting); only the active party's has hidden layers
            bottom_hidden=(self.bottom_hidden, *(() if active_top else self.bottom_hidden for _ in features[1:])),
            top_hidden=self.top_hidden,
            activation=self.activation,  # type: ignore[arg-type]
            dropout=self.dropout,
            bottom_bias=self.bottom_bias,
            top_bias=self.top_bias,
            passive_width=self.passive_width if active_top else None,
            passive_bias=self.passive_bias,
            passive_widths=self.passive_widths if passive_widths is None else passive_widths,
        )

    def bottom(self, width: int, n_classes: int) -> Bottom:
        """This party's bottom, initialised from its own OS entropy (a restore overwrites every parameter)."""
        return Bottom.create(self.view(width, n_classes), self.party, self.optim, modules.own_seed())

    def head(self, n_classes: int) -> Head:
        """The coordinator's top model, initialised from its own OS entropy."""
        return Head.create(self.view(1, n_classes), self.optim, modules.own_seed())

    def with_party(self, party: int) -> SplitNNSettings:
        return SplitNNSettings.from_dict({**self.to_dict(), "party": party})


class EmbeddingDefense(Protocol):
    """A passive party's module in place of its plain bottom (d_in -> width), its initial weights from the party's own
    OS entropy: never the session seed, which the active party chose."""

    def __call__(self, plain: nn.Module, d_in: int, width: int, *, bias: bool) -> nn.Module: ...


def _link(link: Any) -> Any:
    return link.splitnn  # the family's link beside the engine's (services/transport/splitnn_links.py)


class KeyHolderLink(Protocol):
    """split-NN's message to the key holder (services/transport/splitnn_links.py)."""

    def top_step(
        self,
        session_id: str,
        step: int,
        sample_index: np.ndarray,
        share: np.ndarray,
        labels: np.ndarray,
        widths: Mapping[str, int],
        epoch: int,
    ) -> tuple[np.ndarray, float]: ...


class PassiveLink(Protocol):
    """split-NN's messages to a passive party (services/transport/splitnn_links.py)."""

    def backward_gradient(self, session_id: str, step: int, sample_index: np.ndarray, gradient: np.ndarray) -> None: ...

    def send_embedding(self, session_id: str, step: int, sample_index: np.ndarray, epoch: int) -> bytes: ...

    def plain_forward(
        self, session_id: str, step: int, sample_index: np.ndarray, cols: int, epoch: int
    ) -> np.ndarray: ...


def _module_tensors(prefix: str, role: Bottom | Head) -> dict[str, np.ndarray]:
    return {f"{prefix}/{name}": t.detach().numpy().copy() for name, t in role.module.state_dict().items()}


def _role_state(role: Bottom | Head, settings: SplitNNSettings, **meta: Any) -> State:
    blob = np.frombuffer(role.to_state(), dtype=np.uint8).copy()
    return {"splitnn": blob}, {"splitnn": settings.to_dict(), **meta}


@dataclass
class SplitNNActive:
    """coordinator-top: the active party's bottom (position 0) and its step of the protocol."""

    scores_locally = False

    settings: SplitNNSettings
    n_classes: int
    bottom: Bottom

    @property
    def share_width(self) -> int:
        return self.settings.embedding

    def train_step(self, ctx: ActiveContext, index: np.ndarray) -> None:
        key_holder: KeyHolderLink = _link(ctx.key_holder)
        keys = ctx.passive_mask_keys()
        # Each passive party sends its masked h_p straight to the key holder; only its mask's nonce comes back here.
        nonces = ctx.each_passive(
            lambda party, link: _link(link).send_embedding(ctx.session_id, ctx.step, index, ctx.epoch)
        )
        self.bottom.at_epoch(ctx.epoch)
        own = self.bottom.forward(ctx.features(index), train=True)
        masks = [
            ring_mask.embedding_mask(key, ctx.session_id, ctx.step, nonce, index, own.shape[1])
            for key, nonce in zip(keys, nonces, strict=True)
        ]
        share = ring_mask.owner_share(own, masks)  # h_a − Σ_p r_p
        labels, defense = ctx.labels(index), ctx.gradient_defense
        if defense:  # label_dp: the key holder trains on the randomised labels
            labels = defense.train_labels(labels, index, ctx.n_classes)
        gradient, loss = key_holder.top_step(ctx.session_id, ctx.step, index, share, labels, ctx.widths, ctx.epoch)
        if gradient.shape != own.shape:
            raise FailedPrecondition(f"the key holder returned ∂L/∂h of shape {gradient.shape}, expected {own.shape}")
        ctx.emit(kinds.GRADIENT, "coordinator", arrays={"gradient": gradient}, meta={"step": ctx.step, "loss": loss})
        # What leaves for the passive parties is the defended gradient; our own bottom steps on the one received.
        sent = defense.defend(gradient, labels) if defense else gradient
        ctx.each_passive(lambda party, link: _link(link).backward_gradient(ctx.session_id, ctx.step, index, sent))
        # Applied once every passive party applied the step, as LR's update is.
        self.bottom.backward(gradient)

    def inference_share(self, x: np.ndarray) -> np.ndarray:
        return self.bottom.forward(x, train=False)

    def released(self, release: Release) -> ReleasedModel:
        """Its own bottom and what the key holder released: the top model, and the passive bottoms unless withheld."""
        return ReleasedModel(NAME, {**_module_tensors("bottom/0", self.bottom), **release.tensors})

    def to_state(self) -> State:
        return _role_state(self.bottom, self.settings, n_classes=self.n_classes, width=self.bottom.in_width)


@dataclass
class ActiveTopActive:
    """active-top: the active party's own bottom and the top model on [h_a, z_1, ..., z_P] (ye's setting)."""

    settings: SplitNNSettings
    n_classes: int
    features: tuple[int, ...]  # every party's width, active first
    head: Head
    scores_locally = True

    @property
    def share_width(self) -> int:
        return 0  # nothing is summed at the key holder in this topology

    def output_widths(self) -> list[int]:
        """Width of each passive party's z_p, in party order."""
        config = self.settings.network(self.features, self.n_classes)
        return [config.output_width(p) for p in range(1, len(self.features))]

    def _outputs(self, ctx: ActiveContext, index: np.ndarray) -> list[np.ndarray]:
        """Every passive party's z_p for rows ``index`` at step ``ctx.step`` (0: inference), in the clear, recorded."""
        widths = dict(zip(ctx.passives, self.output_widths(), strict=True))
        z = ctx.each_passive(
            lambda party, link: _link(link).plain_forward(ctx.session_id, ctx.step, index, widths[party], ctx.epoch)
        )
        ids = ctx.sample_ids(index)
        for party, z_p in zip(ctx.passives, z, strict=True):
            ctx.emit(kinds.EMBEDDINGS, party, sample_ids=tuple(ids), arrays={"z": z_p}, meta={"step": ctx.step})
        return z

    def train_step(self, ctx: ActiveContext, index: np.ndarray) -> None:
        z = self._outputs(ctx, index)
        self.head.at_epoch(ctx.epoch)
        step = self.head.train_step(z, ctx.labels(index), local=ctx.features(index))
        grads = dict(zip(ctx.passives, step.grads, strict=True))
        ctx.each_passive(
            lambda party, link: _link(link).backward_gradient(ctx.session_id, ctx.step, index, grads[party])
        )

    def local_scores(self, ctx: ActiveContext, index: np.ndarray) -> np.ndarray:
        """Its own scores of rows ``index`` (the engine's inference when ``scores_locally``; ctx.step is 0)."""
        return self.scores(ctx.features(index), self._outputs(ctx, index))

    def scores(self, x: np.ndarray, received: Sequence[np.ndarray]) -> np.ndarray:
        """This party's own confidence scores softmax(top([h_a, z_1, ..., z_P])) (no release chain here)."""
        return self.head.scores(received, local=x)

    def inference_share(self, x: np.ndarray) -> np.ndarray:
        raise FailedPrecondition("active-top scores at the active party: there is no share to sum")

    def released(self, release: Release) -> ReleasedModel:
        """The top model with the active party's bottom it trained, and the passive bottoms the coordinator
        released (none when withheld)."""
        tensors = {f"head/{name}": t.detach().numpy().copy() for name, t in self.head.module.state_dict().items()}
        return ReleasedModel(NAME, {**tensors, **release.tensors})

    def to_state(self) -> State:
        return _role_state(self.head, self.settings, n_classes=self.n_classes, features=list(self.features))


@dataclass
class SplitNNPassive:
    """A passive party's bottom: its embedding leaves under its zero-sum mask (coordinator-top, training and inference)
    or in the clear (active-top); its gradient arrives in the clear."""

    settings: SplitNNSettings
    n_classes: int
    bottom: Bottom
    can_replay: bool = False  # dropout and the pending graph are not replayable: an interrupted step is redone anew
    # False under an embedding defense: the released layers would undo it (masquerade's P shows its fabricated bits)
    releases_bottom: bool = True

    @property
    def share_width(self) -> int:
        return self.bottom.out_width

    @property
    def output_in_the_clear(self) -> bool:
        return self.settings.topology == "active-top"

    @property
    def sends_embedding(self) -> bool:
        """coordinator-top: its training embedding goes to the key holder under its own zero-sum mask."""
        return self.settings.topology == "coordinator-top"

    def forward(self, x: np.ndarray, *, replay: bool, epoch: int = 0) -> np.ndarray:
        self.bottom.at_epoch(epoch)  # the rate of this step's backward
        return self.bottom.forward(x, train=True)

    def backward(self, ctx: PassiveContext, x: np.ndarray, feedback: object, digest: bytes) -> None:
        if not isinstance(feedback, np.ndarray):
            raise InvalidArgument("a split-NN step's feedback is ∂L/∂h in the clear (BackwardRequest.gradient)")
        if feedback.shape != (len(x), self.bottom.out_width):
            raise InvalidArgument(f"gradient has shape {feedback.shape}, expected {(len(x), self.bottom.out_width)}")
        try:
            self.bottom.backward(feedback)
        except ValueError as exc:  # e.g. no forward awaits it (this party restarted in between)
            raise FailedPrecondition(f"split-NN backward: {exc}") from exc
        if ctx.index is not None:  # to this party's plugins: ∂L/∂h row by row, under its own IDs (label attacks)
            ids = tuple(ctx.sample_ids(ctx.index))
            ctx.emit(kinds.GRADIENT, ctx.owner, sample_ids=ids, arrays={"gradient": feedback}, meta={"step": ctx.step})

    def inference_share(self, x: np.ndarray) -> np.ndarray:
        return self.bottom.forward(x, train=False)

    def defended(self, defense: EmbeddingDefense, min_width: int | None = None) -> SplitNNPassive:
        """This party with its own embedding defense (services/defenses/embeddings.py) in place of the plain
        bottom: ``defense(plain, d_in, width, bias=)`` returns the module that replaces or wraps it.

        ``min_width``: the narrowest z_B that carries the defense. When the session left passive_width to the
        parties, this party widens its layer to it (and announces the width at JoinSession); a width the session
        fixed stays, and a defense it cannot carry fails naming the bound.
        """
        settings, plain = self.settings, self.bottom
        if min_width is not None and settings.passive_width is None and min_width > plain.out_width:
            settings = replace(settings, passive_width=min_width)
            plain = settings.bottom(plain.in_width, self.n_classes)
        module = defense(plain.module, plain.in_width, plain.out_width, bias=settings.passive_bias)
        bottom = Bottom(module, settings.optim, plain.in_width, plain.out_width)
        return SplitNNPassive(settings, self.n_classes, bottom, releases_bottom=False)

    def releasable(self) -> dict[str, np.ndarray]:
        # As LR's W_p: the coordinator pulls the bottom and releases it unless its parameter chain withholds it.
        return _module_tensors(f"bottom/{self.settings.party}", self.bottom) if self.releases_bottom else {}

    def to_state(self) -> State:
        return _role_state(self.bottom, self.settings, n_classes=self.n_classes, width=self.bottom.in_width)


@dataclass
class SplitNNKeyHolder:
    """The coordinator's top model: it sees the sum h of every party's embedding for training rows, never one h_p."""

    settings: SplitNNSettings
    n_classes: int
    head: Head | None  # None in active-top, where the top model is the active party's
    passives: int = 1  # passive parties in the session
    # Per passive position, its masked share of a training step: (step, rows, words); in memory only (a step whose
    # shares a restart lost is sent again: the passive parties' step has not completed)
    pending: dict[int, tuple[int, np.ndarray, np.ndarray]] = field(default_factory=dict)

    @property
    def share_width(self) -> int:
        return self.settings.embedding if self.head is not None else 0

    def accept_share(self, position: int, step: int, rows: np.ndarray, share: np.ndarray) -> None:
        """Passive party ``position``'s share of step ``step`` (one per party: a later one replaces it)."""
        if self.head is None:
            raise FailedPrecondition("an active-top session sends no embedding to the coordinator")
        if share.shape != (len(rows), self.settings.embedding):
            raise InvalidArgument(f"share has shape {share.shape}, expected {(len(rows), self.settings.embedding)}")
        self.pending[position] = (step, np.array(rows), share)

    def top_step(
        self, step: int, rows: np.ndarray, share: np.ndarray, labels: np.ndarray, epoch: int = 0
    ) -> tuple[np.ndarray, float]:
        """One step of the top model on h from the owner's share and every passive share of step ``step`` for these
        rows (:func:`.steps.open_masked`); ∂L/∂h and the loss."""
        if self.head is None:
            raise FailedPrecondition("an active-top session has no top model at the coordinator")
        if share.shape != (len(rows), self.settings.embedding):
            raise InvalidArgument(f"share has shape {share.shape}, expected {(len(rows), self.settings.embedding)}")
        shares = [share]
        for position in range(1, self.passives + 1):
            held = self.pending.get(position)
            if held is None or held[0] != step or not np.array_equal(held[1], rows):
                raise FailedPrecondition(
                    f"passive party {position} sent no embedding for these rows of step {step} (SendEmbedding first)"
                )
            shares.append(held[2])
        h = open_masked(shares)
        self.head.at_epoch(epoch)
        try:
            result = self.head.train_step([h], labels)
        except ValueError as exc:
            raise InvalidArgument(f"top step: {exc}") from exc
        for position in range(1, self.passives + 1):
            del self.pending[position]
        return result.grads[0], result.loss

    def scores(self, aggregate: np.ndarray) -> np.ndarray:
        if self.head is None:
            raise FailedPrecondition("an active-top session releases no scores at the coordinator")
        return self.head.scores([aggregate])

    def released(self, call: ReleaseCall | None = None) -> dict[str, np.ndarray]:
        return {} if self.head is None else _module_tensors("top", self.head)

    def to_state(self) -> State:
        if self.head is None:
            return {}, {"splitnn": self.settings.to_dict(), "n_classes": self.n_classes}
        return _role_state(self.head, self.settings, n_classes=self.n_classes, passives=self.passives)
