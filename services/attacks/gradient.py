"""Gradient-based attacks through a frozen differentiable model: GIA and GRN (with luo's ablations).

One implementation for every model family: both fit a :class:`Target`, a frozen map from candidate passive
features to something the active party observed, chosen by :func:`fit_target` from what was released:

* LR: the model is rebuilt from the disclosed (w_active, bias, w_passive); the active party's contribution
  x_act W_actᵀ + b is a constant per sample, so only the passive block is differentiated;
* split NN, coordinator-top (or active-top with a released passive bottom): the released ``score_model``
  (luo §V-A: GRN needs only a differentiable released model, "this attack works for both LR and NN");
* active-top with the passive bottom released: the recorded embeddings z_B themselves, through the bottom —
  the scores are a function of z_B and x_act, so z_B carries everything they carry and more.

Active-top without the passive bottom gives no such map: z_B = W_B x_B + b fixes x_B only up to the unknown
W_B, so GIA and GRN are not applicable there. Nor in coordinator-top when the passive bottoms are withheld
(``withhold``; an empty parameter chain releases them): the scores fix h_p = f_p(x_p), not x_p. A
surrogate f̂_p trained jointly with the generator would fit the scores with any x̂ (only the composition
f̂_p ∘ G is constrained), so nothing ties x̂ to x_p: the attacks say NotApplicable rather than guess.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, get_args

import numpy as np
import torch
from torch import nn

from vflsec.services.models.lr import softmax_layout

from .base import Attack, NotApplicable, Observations, Reconstruction, register

Divergence = Literal["kl", "mse", "sse", "log_mse"]
Reduction = Literal["mean", "sum"]
# What GIA/GRN fit: "auto" takes the recorded embeddings when the passive bottom that made them was released.
TargetKind = Literal["auto", "scores", "embeddings"]
# A rounded-down score of 0 only says "below 10^-b"; flooring both sides at 1e-6 keeps such entries from
# dominating a log-space loss (float32 would otherwise give ln 1e-38 ≈ −87).
LOG_FLOOR = 1e-6


@contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run with ``n`` intra-op threads, then restore. These models are tiny: with 2 cores shared by other
    work, thread synchronisation costs more than the parallel matmuls gain (measured ~3× slower)."""
    previous = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


class LinearScoreModel(nn.Module):
    """The frozen LR model's scores for given passive features; ``[1 − p, p]`` for one sigmoid logit."""

    def __init__(self, obs: Observations) -> None:
        super().__init__()
        assert obs.w_active is not None and obs.w_passive is not None and obs.bias is not None
        # In the released layout (softmax logits): z L = (z_a + x_p W_pᵀ) L = z_a L + x_p (Lᵀ W_p)ᵀ
        layout = softmax_layout(obs.k_logits)
        z_active = (np.asarray(obs.x_active, float) @ np.asarray(obs.w_active, float).T + obs.bias) @ layout
        self.register_buffer("w_passive", _float_tensor(layout.T @ np.asarray(obs.w_passive, float)))
        self.register_buffer("z_active", _float_tensor(z_active))

    def forward(self, x_passive: torch.Tensor, rows: torch.Tensor | slice = slice(None)) -> torch.Tensor:
        return torch.softmax(self.z_active[rows] + x_passive @ self.w_passive.T, dim=1)


class ReleasedSplitNN(nn.Module):
    """A released split NN (every bottom and the top, rebuilt with the family's own modules: :func:`released_splitnn`)
    as a ``score_model``: scores of (x_active, x_passive), the passive columns in party order."""

    def __init__(self, network: nn.Module) -> None:
        super().__init__()
        self.network = network

    def forward(self, x_active: torch.Tensor, x_passive: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.network(torch.cat([x_active, x_passive], dim=1)), dim=1)


class PassiveBottoms(nn.Module):
    """The released passive bottoms of a split NN as one ``passive_bottom``: x_passive -> [z_1, ..., z_P]."""

    def __init__(self, network: nn.Module) -> None:
        super().__init__()
        self.network = network

    def forward(self, x_passive: torch.Tensor) -> torch.Tensor:
        blocks = torch.split(x_passive, list(self.network.config.features[1:]), dim=1)
        return torch.cat([bottom(x) for bottom, x in zip(self.network.bottoms[1:], blocks, strict=True)], dim=1)


def released_splitnn(
    tensors: dict[str, np.ndarray], settings: dict[str, Any], features: Sequence[int], n_classes: int
) -> nn.Module | None:
    """The whole split NN (the family's CentralModel) from a ReleasedModel's named tensors and the session's
    settings; None unless every bottom and the top were released (a withheld bottom, or a defended one)."""
    from vflsec.services.models.splitnn.modules import CentralModel
    from vflsec.services.models.splitnn.trainers import SplitNNSettings

    own = SplitNNSettings.from_dict(settings)
    network = CentralModel(own.network(tuple(features), n_classes), seed=0)  # every parameter is loaded below
    renamed = {}
    for name, value in tensors.items():  # the released names -> CentralModel's (bottoms.<p>.*, top.*)
        role, _, rest = name.partition("/")
        if role == "bottom":
            party, _, rest = rest.partition("/")
            renamed[f"bottoms.{party}.{rest}"] = value
        elif role == "top":
            renamed[f"top.{rest}"] = value
        elif role == "head":  # active-top: the active party's own bottom and top
            renamed[rest.replace("bottom.", "bottoms.0.", 1) if rest.startswith("bottom.") else rest] = value
    try:
        network.load_state_dict({k: torch.tensor(np.asarray(v)) for k, v in renamed.items()}, strict=True)
    except RuntimeError:
        return None
    return network.float().eval()


class ReleasedScoreModel(nn.Module):
    """A released ``score_model(x_active, x_passive)`` bound to the queried rows' own active features."""

    def __init__(self, model: nn.Module, x_active: np.ndarray) -> None:
        super().__init__()
        self.model = _frozen(model)
        self.register_buffer("x_active", _float_tensor(x_active))

    def forward(self, x_passive: torch.Tensor, rows: torch.Tensor | slice = slice(None)) -> torch.Tensor:
        return self.model(self.x_active[rows], x_passive)


class EmbeddingModel(nn.Module):
    """The released passive bottom: candidate passive features to the embeddings z_B the active party recorded."""

    def __init__(self, bottom: nn.Module) -> None:
        super().__init__()
        self.bottom = _frozen(bottom)

    def forward(self, x_passive: torch.Tensor, rows: torch.Tensor | slice = slice(None)) -> torch.Tensor:
        return self.bottom(x_passive)


def _frozen(model: nn.Module) -> nn.Module:
    # A copy in eval mode (no dropout) without parameter gradients: the attack leaves the caller's module as it was.
    return copy.deepcopy(model).eval().requires_grad_(False)


@dataclass(frozen=True)
class Target:
    """A frozen model ``(x_passive, rows) -> prediction`` of the ``observed`` rows, and how to compare them."""

    model: nn.Module
    observed: torch.Tensor  # (n, k) released scores or recorded embeddings
    kind: Literal["scores", "embeddings"]

    def mismatch(self, x_passive: torch.Tensor, rows: torch.Tensor | slice, loss: Divergence) -> torch.Tensor:
        """Per-sample mismatch: the chosen divergence for scores, the mean square error for embeddings."""
        predicted = self.model(x_passive, rows)
        if self.kind == "embeddings":
            return ((predicted - self.observed[rows]) ** 2).mean(dim=1)
        return divergence(predicted, self.observed[rows], loss)


LR_BLOCKS = ("w_active", "bias", "w_passive")


def fit_target(obs: Observations, name: str, kind: TargetKind = "auto") -> Target:
    """What ``name`` can fit with these observations (module docstring); NotApplicable says why nothing."""
    if kind not in get_args(TargetKind):
        raise ValueError(f"target must be one of {get_args(TargetKind)}, got {kind!r}")
    released_bottom = obs.embeddings is not None and obs.passive_bottom is not None
    if kind == "embeddings" or (kind == "auto" and released_bottom):
        if obs.embeddings is None:
            raise NotApplicable(f"{name}: no passive embeddings were recorded (only active-top split learning has z_B)")
        if obs.passive_bottom is None:
            raise NotApplicable(
                f"{name}: the passive bottom model was not released; z_B = W_B x_B + b fixes x_B only up to the "
                "unknown W_B"
            )
        return Target(EmbeddingModel(obs.passive_bottom), _float_tensor(obs.embeddings), "embeddings")
    if obs.scores is None:
        raise NotApplicable(f"{name} needs scores, which the active party did not receive")
    scores = _float_tensor(obs.scores)
    if obs.score_model is not None:
        return Target(ReleasedScoreModel(obs.score_model, obs.x_active), scores, "scores")
    missing = [block for block in LR_BLOCKS if getattr(obs, block) is None]
    if len(missing) < len(LR_BLOCKS):
        if missing:
            raise NotApplicable(f"{name} needs {', '.join(missing)}, which the active party did not receive")
        return Target(LinearScoreModel(obs), scores, "scores")
    if obs.embeddings is not None:
        raise NotApplicable(
            f"{name}: active-top without the passive bottom model — the active party's own model maps z_B, not "
            "x_B, to its scores, and z_B = W_B x_B + b fixes x_B only up to the unknown W_B"
        )
    raise NotApplicable(
        f"{name} needs a released model: score_model (split NN with every bottom) or w_active, bias, w_passive "
        "(LR); split-NN coordinator-top under withhold releases only the top and the active party's own bottom, "
        "and the scores depend on x_p only through h_p = f_p(x_p) with the passive bottom f_p unknown"
    )


def _float_tensor(values: Any) -> torch.Tensor:
    # np.array copies: recorded observations may be read-only views, which torch refuses to wrap.
    return torch.from_numpy(np.array(values, dtype=np.float32))


def _check_divergence(kind: str) -> None:
    if kind not in get_args(Divergence):
        raise ValueError(f"loss must be one of {get_args(Divergence)}, got {kind!r}")


def divergence(predicted: torch.Tensor, released: torch.Tensor, kind: Divergence) -> torch.Tensor:
    """Per-sample mismatch; "kl" is KL(c ‖ ĉ) up to a constant (well defined for rounded scores c_k = 0)."""
    if kind == "kl":
        return -(released * torch.log(predicted.clamp_min(torch.finfo(predicted.dtype).tiny))).sum(dim=1)
    if kind == "mse":
        return ((predicted - released) ** 2).mean(dim=1)
    if kind == "sse":  # luo's code: squared probability errors summed over the classes
        return ((predicted - released) ** 2).sum(dim=1)
    if kind == "log_mse":  # varasteh's S(x, y) = Σ (ln x − ln y)², averaged over classes
        return ((torch.log(predicted.clamp_min(LOG_FLOOR)) - torch.log(released.clamp_min(LOG_FLOOR))) ** 2).mean(dim=1)
    raise ValueError(f"unknown divergence {kind!r}")


class Gia(Attack):
    """Gradient inversion (rassouli §V baseline): min_{x̂ ∈ [0,1]^d} D(ĉ(x̂) ‖ c), projected Adam from ½·1.

    Samples are independent, so the whole batch is one tensor and one optimiser (Adam is per coordinate).
    ``target`` picks what is fitted (:func:`fit_target`); on recorded embeddings D is their mean square error.
    """

    # One implementation for every differentiable family: fit_target picks what the release allows.
    families = frozenset({"lr", "splitnn"})

    def __init__(
        self,
        steps: int = 500,
        lr: float = 0.02,
        loss: Divergence = "kl",
        init: float = 0.5,
        target: TargetKind = "auto",
        threads: int | None = 1,
    ) -> None:
        _check_divergence(loss)
        self.steps = steps
        self.lr = lr
        self.loss = loss
        self.init = init
        self.target = target
        self.threads = threads

    def reconstruct(self, obs: Observations) -> Reconstruction:
        with torch_threads(self.threads):
            return self._run(obs)

    def _run(self, obs: Observations) -> Reconstruction:
        target = fit_target(obs, self.name or "gia", self.target)
        every = slice(None)
        x = torch.full((obs.n_samples, obs.d_passive), self.init, requires_grad=True)
        optimizer = torch.optim.Adam([x], lr=self.lr)
        for _ in range(self.steps):
            optimizer.zero_grad()
            target.mismatch(x, every, self.loss).sum().backward()
            optimizer.step()
            with torch.no_grad():
                x.clamp_(0.0, 1.0)
        with torch.no_grad():
            final = target.mismatch(x, every, self.loss)
        return Reconstruction(x.detach().double().numpy(), {"loss": final.double().numpy(), "target": target.kind})


def make_generator(n_inputs: int, n_outputs: int, hidden: Sequence[int]) -> nn.Sequential:
    """luo §VI-C: MLP with LayerNorm after each hidden layer; a sigmoid keeps x̂ in the known range [0, 1]."""
    layers: list[nn.Module] = []
    width = n_inputs
    for size in hidden:
        layers += [nn.Linear(width, size), nn.LayerNorm(size), nn.ReLU()]
        width = size
    layers += [nn.Linear(width, n_outputs), nn.Sigmoid()]
    return nn.Sequential(*layers)


class Grn(Attack):
    """Generative regression network (luo Algorithm 2, Eq. 9), trained on accumulated predictions.

    f_G(x_adv ∪ r) → x̂, r ~ N(0, I_{d_p}) drawn afresh per batch; the loss is the score mismatch through the
    frozen model plus ``variance_weight`` · (per-feature batch variance of x̂), luo's Ω that stops the
    generator from producing meaningless spread. luo's Table III ablations are options:
    ``use_xadv=False`` (case 1, noise only), ``use_noise=False`` (case 2), ``variance_weight=0`` (case 3),
    ``direct=True`` (case 4: no generator, x̂ itself optimised — worse than random guessing in luo's table).
    The generator uses PyTorch's default initialisation, as luo's code does (Algorithm 2 writes N(0, 1)).
    ``target`` picks what is fitted (:func:`fit_target`): released scores, or recorded embeddings (active-top).

    **Held-out scoring** (``folds``, default 2): the queried rows are split into folds; the generator that
    reconstructs a fold was trained on the other folds' predictions only, so no row is scored by a model
    that fitted its released score. ``folds=1`` is luo's own setting (§V-A: "the samples to be attacked are
    exactly the samples for training the generator"). ``direct=True`` has no shared parameters — each x̂ is
    fitted to its own score, like GIA — so it ignores ``folds``.

    Defaults differ from luo's code (registered as ``grn_luo``: ``lr=1e-4``, ``batch_size=64``,
    ``epochs=60`` whatever the number of predictions, ``loss="sse"``, ``reduction="sum"``,
    ``variance_weight=0.25``, noise of width d_a + d_p when it is the only input, an unbounded x̂ for
    ``direct``): ℓ is the MSE of log-scores
    (varasteh's S) — confident LR scores saturate probability-space losses — with ``lr=1e-3``, a larger
    batch for speed, and at least ``min_steps`` Adam steps (a few hundred predictions are otherwise a few
    dozen steps). docs/attacks.md has the measured comparison.
    """

    # One implementation for every differentiable family: fit_target picks what the release allows.
    families = frozenset({"lr", "splitnn"})

    def __init__(
        self,
        *,
        use_xadv: bool = True,
        use_noise: bool = True,
        variance_weight: float = 1.0,
        direct: bool = False,
        hidden: Sequence[int] = (600, 200, 100),
        epochs: int = 40,
        min_steps: int = 200,
        batch_size: int = 256,
        lr: float = 1e-3,
        loss: Divergence = "log_mse",
        reduction: Reduction = "mean",
        full_noise: bool = False,
        bounded: bool = True,
        folds: int = 2,
        eval_draws: int = 1,
        target: TargetKind = "auto",
        seed: int = 0,
        threads: int | None = 1,
    ) -> None:
        if not direct and not (use_xadv or use_noise):
            raise ValueError("the generator needs x_adv, noise or both as input")
        _check_divergence(loss)
        if reduction not in get_args(Reduction):
            raise ValueError(f"reduction must be one of {get_args(Reduction)}, got {reduction!r}")
        if folds < 1:
            raise ValueError(f"folds must be >= 1, got {folds}")
        self.use_xadv = use_xadv
        self.use_noise = use_noise
        self.variance_weight = variance_weight
        self.direct = direct
        self.hidden = tuple(hidden)
        self.epochs = epochs
        self.min_steps = min_steps  # small prediction sets: more epochs, so the generator still converges
        self.batch_size = batch_size
        self.lr = lr
        self.loss = loss
        self.reduction = reduction
        self.full_noise = full_noise  # luo's code: noise-only input as wide as x_adv ∪ r (d_a + d_p)
        self.bounded = bounded  # direct only: x̂ = sigmoid(θ) (True) or θ itself, unbounded (luo's case 4)
        self.folds = folds
        self.eval_draws = eval_draws
        self.target = target
        self.seed = seed
        self.threads = threads

    def reconstruct(self, obs: Observations) -> Reconstruction:
        with torch_threads(self.threads), torch.random.fork_rng():
            torch.manual_seed(self.seed)
            return self._run(obs)

    def _run(self, obs: Observations) -> Reconstruction:
        target = fit_target(obs, self.name or "grn", self.target)
        x_adv = _float_tensor(obs.x_active)
        n = obs.n_samples
        folds = 1 if self.direct else self.folds
        if n < 2 * folds and folds > 1:
            raise NotApplicable(f"held-out GRN with {folds} folds needs at least {2 * folds} predictions, got {n}")
        fold_of = torch.randperm(n) % folds
        x_final = torch.empty(n, obs.d_passive)
        histories = []
        for fold in range(folds):
            scored = torch.nonzero(fold_of == fold).flatten()
            fitted = torch.nonzero(fold_of != fold).flatten() if folds > 1 else scored
            estimate, history = self._fit(target, x_adv, obs.d_passive, fitted)
            with torch.no_grad():
                draws = 1 if self.direct else self.eval_draws
                x_final[scored] = torch.stack([estimate(scored) for _ in range(draws)]).mean(dim=0)
            histories.append(history)
        meta = {"loss_history": np.mean(histories, axis=0), "folds": folds, "target": target.kind}
        return Reconstruction(x_final.double().numpy(), meta)

    def _fit(
        self, target: Target, x_adv: torch.Tensor, d_p: int, fitted: torch.Tensor
    ) -> tuple[Callable[[torch.Tensor], torch.Tensor], list[float]]:
        """Train on the predictions of rows ``fitted``; returns x̂ for given rows and the loss per epoch."""
        estimate, parameters = self._estimator(x_adv, d_p)
        optimizer = torch.optim.Adam(parameters, lr=self.lr)
        reduce = torch.sum if self.reduction == "sum" else torch.mean
        history: list[float] = []
        batches = -(-len(fitted) // self.batch_size)
        for _ in range(max(self.epochs, -(-self.min_steps // batches))):
            order = fitted[torch.randperm(len(fitted))]
            total = 0.0
            for start in range(0, len(order), self.batch_size):
                rows = order[start : start + self.batch_size]
                x_hat = estimate(rows)
                loss = reduce(target.mismatch(x_hat, rows, self.loss))
                if self.variance_weight and len(rows) > 1:
                    loss = loss + self.variance_weight * reduce(x_hat.var(dim=0))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                total += float(loss.detach()) * (1 if self.reduction == "sum" else len(rows))
            history.append(total / len(fitted))
        return estimate, history

    def _estimator(
        self, x_adv: torch.Tensor, d_p: int
    ) -> tuple[Callable[[torch.Tensor], torch.Tensor], list[torch.Tensor]]:
        """x̂ for given rows and the trainable parameters behind it."""
        if self.direct:
            raw = torch.randn(x_adv.shape[0], d_p).requires_grad_(True)
            if self.bounded:
                return (lambda rows: torch.sigmoid(raw[rows])), [raw]
            return (lambda rows: raw[rows]), [raw]
        d_a = x_adv.shape[1]
        noise_width = d_a + d_p if self.full_noise and not self.use_xadv else d_p
        n_in = (d_a if self.use_xadv else 0) + (noise_width if self.use_noise else 0)
        generator = make_generator(n_in, d_p, self.hidden)

        def generate(rows: torch.Tensor) -> torch.Tensor:
            parts = [x_adv[rows]] if self.use_xadv else []
            if self.use_noise:
                parts.append(torch.randn(len(rows), noise_width))
            return generator(torch.cat(parts, dim=1))

        return generate, list(generator.parameters())


register("gia", Gia)
register("grn", Grn)
register("grn_noise_only", Grn, use_xadv=False)
register("grn_xadv_only", Grn, use_noise=False)
register("grn_no_reg", Grn, variance_weight=0.0)
register("grn_direct", Grn, direct=True)

# luo's published code (xinjianluo/featureinference-vfl, GRNA): Adam 1e-4, batches of 64, 60 epochs, loss
# Σ_batch Σ_classes (ĉ − c)² + 0.25 · Σ_features Var_batch(x̂); luo's setting is transductive (§V-A: the rows
# attacked are the rows the generator trains on; it uses only released scores, so a legitimate attacker): folds=1.
LUO_GRN = {
    "folds": 1,
    "lr": 1e-4,
    "batch_size": 64,
    "epochs": 60,
    "min_steps": 0,
    "loss": "sse",
    "reduction": "sum",
    "variance_weight": 0.25,
    "full_noise": True,
    "bounded": False,
}
register("grn_luo", Grn, **LUO_GRN)
register("grn_luo_noise_only", Grn, **LUO_GRN, use_xadv=False)
register("grn_luo_xadv_only", Grn, **LUO_GRN, use_noise=False)
register("grn_luo_no_reg", Grn, **{**LUO_GRN, "variance_weight": 0.0})
register("grn_luo_direct", Grn, **LUO_GRN, direct=True)
