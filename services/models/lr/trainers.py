"""The LR family's trainers: what each party computes in a training or inference step (services/models/family.py).

One step, as docs/protocol.md describes it: every passive party sends its share z_p + r_p of the logits straight to
the key holder (r_p a zero-sum mask in Z_2^64 under its own key, services/crypto/ring_mask.py); the active party sends
its own X_a W_aᵀ + b − Σ_p r_p and gets [[p]] = [[link(z)]] back, the key holder having added the shares (nothing is
decrypted for the forward); it forms [[δ]] = [[p]] − targets and sends it to every passive party; each party (the
active one included) gets its gradient δᵀX_q through one masked round trip (:func:`masked_gradient`) and applies it
only once the whole step is through. The family's own steps (:data:`STEPS`) carry the shares.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from vflsec.services import common, kinds
from vflsec.services.common import ACTIVE, COORDINATOR, PASSIVE
from vflsec.services.crypto import entropy, he, masking, ring_mask
from vflsec.services.errors import FailedPrecondition, InvalidArgument, PeerFailed
from vflsec.services.models.family import (
    ActiveContext,
    FamilyStep,
    KeyHolderContext,
    PassiveContext,
    Received,
    Release,
    ReleaseCall,
    ReleasedModel,
    State,
    register,
    share_words,
)

from .maths import BlockOptimizer, OptimizerConfig, confidence_scores, default_batch_size, link, min_batch_size
from .maths import n_logits as _n_logits
from .maths import targets as _targets

NAME = "lr"


class KeyHolderLink(Protocol):
    """LR's messages to the key holder (services/transport/links.py CoordinatorClient)."""

    def training_scores(
        self,
        backend: he.Backend,
        session_id: str,
        step: int,
        share: np.ndarray,
        replicas: int,
        sample_index: np.ndarray,
        widths: Mapping[str, int],
    ) -> Received: ...

    def submit_training_share(
        self, session_id: str, step: int, sample_index: np.ndarray, share: np.ndarray
    ) -> None: ...

    def block_sums(
        self, session_id: str, step: int, ciphertexts: list[bytes], width: int, mask_tag: bytes
    ) -> np.ndarray: ...


class PassiveLink(Protocol):
    """LR's messages to a passive party (services/transport/links.py PassiveClient)."""

    def share_training_logits(self, session_id: str, step: int, sample_index: np.ndarray) -> None: ...

    def backward(self, session_id: str, step: int, sample_index: np.ndarray, delta: he.WireMatrix) -> None: ...


def gradient_replicas(backend: he.Backend, n: int, k: int, widest: int) -> int:
    """One replication factor R for every party's gradient products of a step, sized for the widest block, each
    product adding up to masking.GRADIENT_MAX_FOLD chunks of δ before its mask, chosen by LR's measured costs (at
    batch 1,024 and widths up to 14: R = 7 over two chunks, one product a party, rather than R = 4 over one chunk
    and two products a party)."""
    return he.choose_replicas(
        n,
        k,
        widest,
        backend.slots,
        fold=masking.GRADIENT_MAX_FOLD,
        parts=masking.product_parts(backend),
        costs=(he.LR_ENCRYPT_COST, he.LR_OPEN_COST),
    )


def gradient_products(backend: he.Backend, width: int, layout: he.MatrixLayout) -> int:
    """The masked products a party of ``width`` columns makes against a δ of ``layout`` (masked_gradient)."""
    fold = masking.gradient_fold(layout)
    return masking.product_count(width, layout, fold=fold, parts=masking.product_parts(backend))


def masked_gradient(
    backend: he.Backend,
    delta: he.EncryptedMatrix,
    x: np.ndarray,
    mask_key: bytes,
    session_id: str,
    step: int,
    delta_digest: bytes,
    block_sums: Callable[[list[bytes], int, bytes], np.ndarray],
) -> np.ndarray:
    """δᵀx / n through the key holder, which sees only masked block sums: the round trip of every party.

    ``backend`` must hold the public key δ is encrypted under, the key of the step's epoch, not the session's
    (epoch 0): an all-zero feature block's product is a fresh encryption of zero under it (he.CkksBackend), and
    under another epoch's key that decrypts to noise the key holder refuses.

    The masks are keyed by step and δ's fingerprint: a replayed step (the key holder repeats [[p]], hence δ)
    rebuilds products of the same masks, which the key holder answers from its cache; the tag (an HMAC of the
    same context, under a key derived from the mask key for the purpose) tells it so, and a repeat under other
    masks is refused, not answered with sums these masks do not unmask (review 21, F9). Each product carries
    masking.product_parts(backend) feature groups (two under CKKS), as the key holder expects.
    """
    masks = entropy.keyed_stream(mask_key, session_id, step, delta_digest)
    tag = entropy.tag(entropy.derive_key(mask_key, "block-sums mask tag"), session_id, step, delta_digest)
    parts, fold = masking.product_parts(backend), masking.gradient_fold(delta.layout)
    blobs, mask_sums = masking.masked_feature_products(
        backend, delta, x, masks, fold=fold, widening=fold, parts=parts, serialized=True
    )
    width = x.shape[1]
    sums = block_sums(blobs, width, tag)
    if sums.shape != (width, mask_sums.shape[1]):
        raise FailedPrecondition(
            f"coordinator returned block sums of shape {sums.shape}, expected {(width, mask_sums.shape[1])}"
        )
    return masking.gradient_from_block_sums(sums, mask_sums[:width], width) / len(x)


def _optimizers(config: OptimizerConfig, k: int, d: int) -> tuple[BlockOptimizer, BlockOptimizer]:
    return BlockOptimizer(config, (k, d)), BlockOptimizer(config, (k,), penalised=False)


@dataclass
class LrActive:
    """The active party's block W_a (K_logits × d_a) and the bias, with their optimisers."""

    scores_locally = False

    n_classes: int
    config: OptimizerConfig
    weights: np.ndarray
    bias: np.ndarray
    optimizer_w: BlockOptimizer
    optimizer_b: BlockOptimizer

    @classmethod
    def create(cls, n_classes: int, n_features: int, config: OptimizerConfig) -> LrActive:
        k = _n_logits(n_classes)
        return cls(n_classes, config, np.zeros((k, n_features)), np.zeros(k), *_optimizers(config, k, n_features))

    @property
    def k(self) -> int:
        return self.weights.shape[0]

    @property
    def share_width(self) -> int:
        return self.k

    def inference_share(self, x: np.ndarray) -> np.ndarray:
        return x @ self.weights.T + self.bias

    def train_step(self, ctx: ActiveContext, index: np.ndarray) -> None:
        key_holder: KeyHolderLink = ctx.key_holder
        keys = ctx.passive_mask_keys()
        x = ctx.features(index)
        masks = [ring_mask.logit_mask(key, ctx.session_id, ctx.step, index, self.k) for key in keys]
        share = ring_mask.owner_share(self.inference_share(x), masks)  # z_a − Σ_p r_p
        replicas = gradient_replicas(ctx.backend, len(index), self.k, max(ctx.widths.values()))

        def forward() -> Received:
            # Each passive party sends z_p + r_p straight to the key holder: nothing of it comes here.
            ctx.each_passive(lambda party, link: link.share_training_logits(ctx.session_id, ctx.step, index))
            return key_holder.training_scores(ctx.backend, ctx.session_id, ctx.step, share, replicas, index, ctx.widths)

        try:
            scores = forward()
        except PeerFailed as exc:
            if exc.code != "FAILED_PRECONDITION":
                raise
            # The key holder keeps the passive shares in memory only: restarted between them and our call it holds
            # none, so they are sent once more (the same bytes: the same block, the same pad); a refusal for any
            # other reason repeats and is raised.
            scores = forward()
        ctx.emit(kinds.ENCRYPTED_SCORES, "coordinator", blobs={"ciphertexts": scores.blobs}, meta={"step": ctx.step})
        try:  # [[p]]'s form before anything is made of it: a faulty coordinator is named here, not by a passive
            # party's refusal of δ (review 24, F5); the refusal depends on the coordinator's bytes alone
            ctx.training_keys().check_form(scores.matrix.ciphertexts, product=False, form=he.LOWERED)
        except ValueError as exc:
            raise FailedPrecondition(f"the coordinator's training scores of step {ctx.step}: {exc}") from None
        delta = he.add_plain_matrix(ctx.backend, scores.matrix, -_targets(ctx.labels(index), self.n_classes))
        delta_wire = he.matrix_to_wire(ctx.backend, delta)  # serialised once, sent to every passive party
        # δ goes out before this party's own products start: made in another thread first, they held the GIL
        # while the Backward request waited for it (the passive party's products are a step's longer branch).
        sent = [ctx.spawn(link.backward, ctx.session_id, ctx.step, index, delta_wire) for link in ctx.passives.values()]
        try:
            grad = self._own_gradient(ctx, delta, x, scores.digest)
        except BaseException:
            futures.wait(sent)  # no call to a passive party is left in flight when the step's failure is reported
            raise
        # While the passive parties' products are opened: the next step's re-randomising zeros (made at the forward
        # they took a core the key holder's [[p]] needed; here one core is the key holder's, the other free).
        def ahead() -> None:
            keys = ctx.training_keys()
            keys.make_ahead(he.LOWERED, gradient_products(keys, x.shape[1] + 1, delta.layout), product=True)

        common.run_ahead(ahead)
        for backward in sent:
            backward.result()
        # Applied only once every party has applied the step: a failed step is redone whole, never twice here.
        self.weights = self.optimizer_w.step(self.weights, grad[:, :-1])
        self.bias = self.optimizer_b.step(self.bias, grad[:, -1])

    def _own_gradient(self, ctx: ActiveContext, delta: he.EncryptedMatrix, x: np.ndarray, digest: bytes) -> np.ndarray:
        x1 = np.hstack([x, np.ones((len(x), 1))])  # the ones column yields the bias gradient
        grad = masked_gradient(
            ctx.training_keys(),
            delta,
            x1,
            ctx.mask_key,
            ctx.session_id,
            ctx.step,
            digest,
            lambda cts, width, tag: ctx.key_holder.block_sums(ctx.session_id, ctx.step, cts, width, tag),
        )
        arrays = {"weights": grad[:, :-1], "bias": grad[:, -1]}
        ctx.emit(kinds.GRADIENT, "coordinator", arrays=arrays, meta={"step": ctx.step})
        return grad

    def released(self, release: Release) -> ReleasedModel:
        """The model as the active party holds it after release: its own block, the released bias (its own plus
        the parameter chain's offset, e.g. PPS-A's flip) and every disclosed passive block (``w_passive/<party>``)."""
        offset = release.bias_offset
        if offset is not None and offset.shape != (self.k,):
            raise InvalidArgument(f"bias offset: expected shape [{self.k}], got {list(offset.shape)}")
        bias = self.bias.copy() if offset is None else self.bias + offset
        disclosed = {f"w_passive/{party}": w for party, w in release.passive.items() if w is not None}
        return ReleasedModel(
            NAME, {"w_active": self.weights.copy(), "bias": bias, "trained_bias": self.bias.copy(), **disclosed}
        )

    def to_state(self) -> State:
        (w_opt, w_t), (b_opt, b_t) = self.optimizer_w.state(), self.optimizer_b.state()
        arrays = {
            "weights": self.weights,
            "bias": self.bias,
            "opt_w_m": w_opt["m"],
            "opt_w_v": w_opt["v"],
            "opt_b_m": b_opt["m"],
            "opt_b_v": b_opt["v"],
        }
        c = self.config
        return arrays, {"n_classes": self.n_classes, "optimizer": [c.name, c.learning_rate, c.l2], "opt_t": [w_t, b_t]}

    @classmethod
    def from_state(cls, state: State) -> LrActive:
        arrays, meta = state
        # A checkpoint written before the family layer kept the optimiser in the engine's "training" list.
        config = OptimizerConfig(*(meta.get("optimizer") or meta["training"][:3]))
        s = cls.create(meta["n_classes"], arrays["weights"].shape[1], config)
        s.weights, s.bias = np.array(arrays["weights"]), np.array(arrays["bias"])
        s.optimizer_w.load_state({"m": arrays["opt_w_m"], "v": arrays["opt_w_v"]}, meta["opt_t"][0])
        s.optimizer_b.load_state({"m": arrays["opt_b_m"], "v": arrays["opt_b_v"]}, meta["opt_t"][1])
        return s


@dataclass
class LrPassive:
    """A passive party's block W_p (K_logits × d_p), the true block: it never leaves but to the coordinator."""

    output_in_the_clear = False

    n_classes: int
    config: OptimizerConfig
    weights: np.ndarray
    optimizer: BlockOptimizer
    previous_weights: np.ndarray | None = None  # the block before the last applied step, to replay its forward
    products: int = 1  # masked products of the last step, as many re-randomising zeros are made ahead of the next

    @classmethod
    def create(cls, n_classes: int, n_features: int, config: OptimizerConfig) -> LrPassive:
        k = _n_logits(n_classes)
        return cls(n_classes, config, np.zeros((k, n_features)), BlockOptimizer(config, (k, n_features)))

    @property
    def share_width(self) -> int:
        return self.weights.shape[0]

    @property
    def can_replay(self) -> bool:
        return self.previous_weights is not None

    def forward(self, x: np.ndarray, *, replay: bool, epoch: int = 0) -> np.ndarray:
        """z_p = X_p W_pᵀ; a replay of the last applied step uses the block as it was before that step (LR's rate
        is constant: ``epoch`` is not used)."""
        weights = self.previous_weights if replay else self.weights
        assert weights is not None  # the engine asks for a replay only if can_replay
        return x @ weights.T

    def inference_share(self, x: np.ndarray) -> np.ndarray:
        return x @ self.weights.T

    def backward(self, ctx: PassiveContext, x: np.ndarray, delta: he.EncryptedMatrix, delta_digest: bytes) -> None:
        """Apply the step's gradient δᵀX_p / n (through one masked round trip with the key holder)."""
        if delta.shape != (len(x), self.weights.shape[0]):
            raise InvalidArgument(f"delta has shape {delta.shape}, expected {(len(x), self.weights.shape[0])}")
        keys = ctx.training_keys()
        try:  # δ's form before any product: a refusal on the active party's bytes alone, never on X_p (rule 4)
            keys.check_form(delta.ciphertexts, product=False, form=he.LOWERED)
        except ValueError as exc:
            raise InvalidArgument(f"delta: {exc}") from None
        self.products = gradient_products(keys, x.shape[1], delta.layout)
        grad = masked_gradient(
            keys,
            delta,
            x,
            ctx.mask_key,
            ctx.session_id,
            ctx.step,
            delta_digest,
            lambda cts, width, tag: ctx.key_holder.block_sums(ctx.session_id, ctx.step, cts, width, tag),
        )
        self.previous_weights = self.weights
        self.weights = self.optimizer.step(self.weights, grad)
        if ctx.index is not None:  # to this party's plugins: its own gradient of the step and the step's rows
            ids = tuple(ctx.sample_ids(ctx.index))
            step = {"step": ctx.step}
            ctx.emit(kinds.BLOCK_GRADIENT, "coordinator", sample_ids=ids, arrays={"gradient": grad}, meta=step)

    def releasable(self) -> dict[str, np.ndarray]:
        return {"weights": self.weights.copy()}

    def to_state(self) -> State:
        opt, t = self.optimizer.state()
        arrays = {"weights": self.weights, "opt_m": opt["m"], "opt_v": opt["v"]}
        if self.previous_weights is not None:
            arrays["previous_weights"] = self.previous_weights
        c = self.config
        return arrays, {"n_classes": self.n_classes, "optimizer": [c.name, c.learning_rate, c.l2], "opt_t": t}

    @classmethod
    def from_state(cls, state: State) -> LrPassive:
        arrays, meta = state
        s = cls.create(meta["n_classes"], arrays["weights"].shape[1], OptimizerConfig(*meta["optimizer"]))
        s.weights = np.array(arrays["weights"])
        s.optimizer.load_state({"m": arrays["opt_m"], "v": arrays["opt_v"]}, meta["opt_t"])
        if "previous_weights" in arrays:
            s.previous_weights = np.array(arrays["previous_weights"])
        return s


@dataclass
class LrKeyHolder:
    """The key holder's LR maths, and each passive party's training share waiting for its step (the engine keeps the
    step's [[p]] and answers)."""

    n_classes: int
    # Per passive position (1..P), its share of the logits of a step: (step, rows, words). One per party, so memory
    # holds at most the current step's; in memory only: after a restart the step is sent again (not yet completed)
    pending: dict[int, tuple[int, np.ndarray, np.ndarray]] = field(default_factory=dict)

    @property
    def share_width(self) -> int:
        return _n_logits(self.n_classes)

    def accept_share(self, position: int, step: int, rows: np.ndarray, share: np.ndarray) -> None:
        """Passive party ``position``'s share of step ``step`` (a later one replaces it)."""
        self.pending[position] = (step, np.array(rows), share)

    def training_scores(
        self, keys: he.Backend, step: int, rows: np.ndarray, own: np.ndarray, replicas: int, parties: Sequence[str]
    ) -> he.WireMatrix:
        """[[p]] = [[link(z)]], replicated for the parties' gradient products: z the owner's share ``own`` plus every
        passive party's (``parties``, positions 1..P) share of step ``step`` for exactly ``rows``, added in Z_2^64
        where the masks cancel and clipped to ±ring_mask.SCORE_BOUND (rule 4: a crafted share is clipped, never
        refused). Nothing is decrypted. A missing share is refused naming its parties (who shared, never a value)."""
        held = [self.pending.get(position) for position in range(1, len(parties) + 1)]
        missing = [
            party
            for party, h in zip(parties, held, strict=True)
            if h is None or h[0] != step or not np.array_equal(h[1], rows)
        ]
        if missing:
            raise FailedPrecondition(
                f"{', '.join(missing)} sent no training share for these sample_index rows of step {step} "
                "(ShareTrainingLogits first)"
            )
        z = ring_mask.open_sum([own, *(h[2] for h in held if h is not None)], ring_mask.SCORE_BOUND)
        self.pending.clear()
        scores = he.encrypt_to_wire(keys, link(z), replicas=replicas, form=he.LOWERED)
        # Idle until the step's block sums: the next step's encryptions of zero are made once [[p]] has gone.
        common.after_reply(lambda: keys.make_ahead(he.LOWERED, len(scores.ciphertexts), product=False))
        return scores

    @staticmethod
    def block_sums(keys: he.Backend, cts: Sequence[Any], layout: he.MatrixLayout, width: int) -> np.ndarray:
        """Masked block sums of a party's ``width`` columns, two feature groups a product under CKKS
        (masking.product_parts); a slot outside the masked range, in either part, is clipped to it, never refused: a
        product's slots are the owner's δ times the caller's features, so a refusal (which the owner sees as a failed
        Backward) told an owner sending a crafted δ whether a passive party's x was nonzero (rule 4; review 24, F3).
        With an odd number of groups the last product's imaginary part is an empty group: its sums are cut off with
        the padding. Only products of [[p]]'s form are decrypted (he.LOWERED, check_form; ValueError otherwise)."""
        keys.check_form(cts, product=True, form=he.LOWERED)
        fold = masking.gradient_fold(layout)  # and the masks as wide: a slot within fold x (B + 64)
        bound = fold * (keys.default_mask_bound + he.FEATURE_BOUND) + 1.0
        parts = masking.product_parts(keys)
        return masking.block_sums(keys, cts, layout, max_abs=bound, clip=True, fold=fold, parts=parts)[:width]

    def scores(self, aggregate: np.ndarray) -> np.ndarray:
        return confidence_scores(aggregate)

    def released(self, call: ReleaseCall | None = None) -> dict[str, np.ndarray]:
        return {}  # LR's passive blocks are released through the parameter chain, not by the key holder

    def to_state(self) -> State:
        return {}, {"n_classes": self.n_classes}


def _share_training_logits(
    trainer: LrPassive, ctx: PassiveContext, step: int, sample_index: np.ndarray, epoch: int = 0
) -> None:
    """ShareTrainingLogits at a passive party: z_p for training step ``step`` (in order; the last completed step again
    is a replay with the block before it, so the same z_p) plus r_p (ring_mask.logit_mask: bound to session, step and
    rows, so a replay sends the same bytes and other rows another pad), sent straight to the key holder once the
    session lock is released. Nothing here refuses on z_p's values (rule 4): encoding clips them."""
    if step < 1:
        raise InvalidArgument(f"ShareTrainingLogits is for training steps >= 1, got {step}")
    if not ctx.share_mask_key:
        raise FailedPrecondition("this session was joined without a share-mask key: open a new one")
    z = ctx.training_output(step, sample_index, epoch)
    index = np.array(sample_index)
    share = ring_mask.encode(z) + ring_mask.logit_mask(ctx.share_mask_key, ctx.session_id, step, index, z.shape[1])
    ctx.defer(lambda: ctx.key_holder.submit_training_share(ctx.session_id, step, index, share))
    if step == ctx.step + 1:  # not a replay: once the owner has its answer, this party is idle until the step's δ,
        # and its re-randomising zeros are made then (the step's keys looked up there too, off the forward's path)
        products = trainer.products
        common.after_reply(lambda: ctx.training_keys().make_ahead(he.LOWERED, products, product=True))


def _submit_training_share(
    trainer: LrKeyHolder, ctx: KeyHolderContext, step: int, sample_index: np.ndarray, share: bytes
) -> None:
    """SubmitTrainingShare at the key holder: a passive party's share of step ``step``, the session's next step or its
    last (a replay), kept for its position until the owner's ComputeTrainingScores; rows aligned and distinct. Every
    refusal is on the request's own fields and public state, never on a value."""
    if step < 1:
        raise InvalidArgument(f"step must be a training step >= 1, got {step}")
    if step not in (ctx.last_step, ctx.last_step + 1):
        raise FailedPrecondition(
            f"step {step} is neither the session's next training step {ctx.last_step + 1} nor its last {ctx.last_step}"
        )
    rows = ctx.share_rows(sample_index)
    trainer.accept_share(ctx.caller, step, rows, share_words(share, len(rows), trainer.share_width))


# LR's own steps, carried by vflsec.v1's generic services (Passive/ShareTrainingLogits, Coordinator/SubmitTrainingShare)
STEPS: Mapping[str, Mapping[str, FamilyStep]] = {
    COORDINATOR: {"submit_training_share": FamilyStep(_submit_training_share, frozenset({PASSIVE}), checkpoint=False)},
    PASSIVE: {"share_training_logits": FamilyStep(_share_training_logits, frozenset({ACTIVE}), checkpoint=False)},
}


class LrFamily:
    name = NAME
    releases_passive_blocks = True
    steps = STEPS  # beside vflsec.v1's LR messages (ComputeTrainingScores, Backward, DecryptBlockSums)

    @staticmethod
    def block_width(n_features: int, *, active: bool) -> int:
        """A party's gradient block: its feature columns, plus the bias column at the active party."""
        return n_features + (1 if active else 0)

    @staticmethod
    def min_batch_size(widths: Iterable[int]) -> int:
        return min_batch_size(widths)

    @staticmethod
    def default_batch_size(widths: Iterable[int]) -> int:
        return default_batch_size(widths)

    @staticmethod
    def answers_per_step(widths: Iterable[int], n_classes: int) -> int:
        """Each step answers party q w_q·k block sums."""
        return sum(widths) * _n_logits(n_classes)

    @staticmethod
    def settings(values: Mapping[str, Any]) -> OptimizerConfig:
        defaults = OptimizerConfig()
        return OptimizerConfig(
            values.get("optimizer") or defaults.name,
            values.get("learning_rate") or defaults.learning_rate,
            values.get("l2", defaults.l2),
        )

    @staticmethod
    def new_active(
        n_classes: int, n_features: int, settings: OptimizerConfig, passive_features: Sequence[int] = ()
    ) -> LrActive:
        return LrActive.create(n_classes, n_features, settings)

    @staticmethod
    def restore_active(state: State) -> LrActive:
        return LrActive.from_state(state)

    @staticmethod
    def new_passive(n_classes: int, n_features: int, settings: OptimizerConfig) -> LrPassive:
        return LrPassive.create(n_classes, n_features, settings)

    @staticmethod
    def restore_passive(state: State) -> LrPassive:
        return LrPassive.from_state(state)

    @staticmethod
    def new_key_holder(n_classes: int, passive_parties: Sequence[str], settings: OptimizerConfig) -> LrKeyHolder:
        return LrKeyHolder(n_classes)

    @staticmethod
    def restore_key_holder(state: State) -> LrKeyHolder:
        return LrKeyHolder(state[1]["n_classes"])


FAMILY = register(LrFamily())
