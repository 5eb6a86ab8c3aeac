"""LR and split-NN prediction tasks with known ground truth, for tests, benchmarks and demos.

:func:`lr_task`: features from a Gaussian copula: z ~ N(0, (1 − ρ) I + ρ 11ᵀ), x = Φ(z), so every feature is
Uniform[0, 1] (already "min-max scaled") and pairs are positively dependent with strength ρ; the model's
weights are random. On such data Half is the best blind guess by construction (every marginal is uniform),
so it is no test of whether a learned attack finds structure — :func:`trained_lr_task` is: a logistic
regression trained on real data, attacked on held-out rows. :func:`trained_splitnn_task` does the same for a
two-branch split neural network in either topology, :func:`trained_tree_task` for a DT or RF.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from scipy.special import ndtr, softmax
from torch import nn

from vflsec.services.models.lr import softmax_layout

from .base import Observations
from .gradient import torch_threads
from .released import ReleasedTree, from_sklearn
from .trees import vote_fractions

SKLEARN_TASKS = ("breast_cancer", "wine", "digits")


@dataclass(frozen=True)
class SyntheticTask:
    obs: Observations  # what the adversary sees
    x_passive: np.ndarray  # ground truth, only for scoring reconstructions
    weights: np.ndarray  # full model (K_logits, d_a + d_p)
    bias: np.ndarray
    train_x_passive: np.ndarray | None = None  # the training rows' passive features (moments, e.g. K_0)


def correlated_uniform_features(n: int, d: int, rho: float, rng: np.random.Generator) -> np.ndarray:
    """n rows of d Uniform[0, 1] features with equicorrelated Gaussian-copula dependence ρ ∈ [0, 1)."""
    if not 0.0 <= rho < 1.0:
        raise ValueError(f"rho must lie in [0, 1), got {rho}")
    shared = rng.standard_normal((n, 1))
    own = rng.standard_normal((n, d))
    return ndtr(np.sqrt(rho) * shared + np.sqrt(1.0 - rho) * own)


def model_scores(x: np.ndarray, weights: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """LR's released scores of ``x`` (:func:`~vflsec.services.models.lr.softmax_layout`)."""
    return softmax((x @ weights.T + bias) @ softmax_layout(len(weights)), axis=1)


def lr_task(
    n: int,
    d_active: int,
    d_passive: int,
    n_classes: int = 2,
    *,
    sigmoid: bool | None = None,
    rho: float = 0.5,
    weight_scale: float = 2.0,
    n_train: int = 0,
    seed: int = 0,
) -> SyntheticTask:
    """A random LR model over correlated features; ``n_train`` labelled active rows for agnostic attacks.

    ``sigmoid`` defaults to True for two classes (one logit) and must be False for more.
    """
    sigmoid = n_classes == 2 if sigmoid is None else sigmoid
    if sigmoid and n_classes != 2:
        raise ValueError("a sigmoid model has two classes")
    rng = np.random.default_rng(seed)
    k_logits = 1 if sigmoid else n_classes
    weights = rng.normal(scale=weight_scale, size=(k_logits, d_active + d_passive))
    bias = rng.normal(size=k_logits)
    x = correlated_uniform_features(n + n_train, d_active + d_passive, rho, rng)
    scores = model_scores(x, weights, bias)
    train_x = train_y = None
    if n_train:
        cumulative = np.cumsum(scores[n:], axis=1)
        train_y = (rng.uniform(size=(n_train, 1)) > cumulative).sum(axis=1).clip(max=n_classes - 1)
        train_x = x[n:, :d_active]
    obs = Observations(
        x_active=x[:n, :d_active],
        scores=scores[:n],
        n_classes=n_classes,
        d_passive=d_passive,
        w_active=weights[:, :d_active],
        bias=bias,
        w_passive=weights[:, d_active:],
        train_x_active=train_x,
        train_y=train_y,
    )
    return SyntheticTask(obs=obs, x_passive=x[:n, d_active:], weights=weights, bias=bias)


def _scaled_split(
    dataset: str, passive_fraction: float, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """scikit-learn's ``dataset`` min-max scaled to [0, 1]; a random half of the rows to train on, the rest
    queried; a random ``passive_fraction`` of the columns passive. Returns x, y, train, query, active, passive."""
    from sklearn import datasets as skd  # imported lazily: sklearn takes a while to import

    if dataset not in SKLEARN_TASKS:
        raise ValueError(f"dataset must be one of {SKLEARN_TASKS}, got {dataset!r}")
    x, y = getattr(skd, f"load_{dataset}")(return_X_y=True)
    low, span = x.min(axis=0), np.ptp(x, axis=0)
    x = (x - low) / np.where(span > 0, span, 1.0)
    rng = np.random.default_rng(seed)
    rows, columns = rng.permutation(len(y)), rng.permutation(x.shape[1])
    d_passive = round(passive_fraction * x.shape[1])
    train, query = rows[: len(y) // 2], rows[len(y) // 2 :]
    return x, y, train, query, np.sort(columns[d_passive:]), np.sort(columns[:d_passive])


def trained_lr_task(dataset: str, passive_fraction: float = 0.4, *, seed: int = 0) -> SyntheticTask:
    """scikit-learn's ``dataset`` min-max scaled to [0, 1], a random ``passive_fraction`` of the columns
    passive, an LR (sklearn, L2, C = 1) trained on a random half of the rows; the other half are the queried
    rows (``obs``) and the training half is the active party's labelled rows (``train_x_active``)."""
    return fitted_lr_task(*_scaled_split(dataset, passive_fraction, seed))


def fit_lr(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Logistic regression (sklearn, L2, C = 1): weights (K_logits, d) and bias (K_logits,)."""
    from sklearn.linear_model import LogisticRegression  # imported lazily: sklearn takes a while to import

    model = LogisticRegression(max_iter=5000).fit(x, y)
    return model.coef_, model.intercept_


def fitted_lr_task(
    x: np.ndarray,
    y: np.ndarray,
    train: np.ndarray,
    query: np.ndarray,
    active: np.ndarray,
    passive: np.ndarray,
    model: tuple[np.ndarray, np.ndarray] | None = None,
) -> SyntheticTask:
    """An LR (sklearn, L2, C = 1) fitted on the rows ``train`` of scaled features ``x``, queried on the rows
    ``query``; ``active`` / ``passive`` are the columns of each side (any dataset: the reproduction suite
    passes the UCI sets here). ``model`` (weights, bias) of such a fit, if given, is used instead of refitting:
    the LR is the same function whichever columns are passive."""
    weights, bias = model if model is not None else fit_lr(x[train], y[train])
    obs = Observations(
        x_active=x[query][:, active],
        scores=model_scores(x[query], weights, bias),
        n_classes=max(2, weights.shape[0]),
        d_passive=len(passive),
        w_active=weights[:, active],
        bias=bias,
        w_passive=weights[:, passive],
        train_x_active=x[train][:, active],
        train_y=y[train],
    )
    full = np.hstack([weights[:, active], weights[:, passive]])
    return SyntheticTask(
        obs=obs, x_passive=x[query][:, passive], weights=full, bias=bias, train_x_passive=x[train][:, passive]
    )


TOPOLOGIES = ("coordinator-top", "active-top")


class SplitScores(nn.Module):
    """A two-branch split network as released: ``forward(x_active, x_passive)`` → class probabilities.

    coordinator-top sums the bottoms' embeddings h = h_a + h_b (the key holder decrypts only the sum);
    active-top concatenates [h_a, z_B] with z_B = W_B x_B + b, one linear passive layer (ye's setting).
    """

    def __init__(self, bottom_active: nn.Module, bottom_passive: nn.Module, top: nn.Module, topology: str) -> None:
        super().__init__()
        if topology not in TOPOLOGIES:
            raise ValueError(f"topology must be one of {TOPOLOGIES}, got {topology!r}")
        self.bottom_active, self.bottom_passive, self.top = bottom_active, bottom_passive, top
        self.topology = topology

    def logits(self, x_active: torch.Tensor, x_passive: torch.Tensor) -> torch.Tensor:
        h_a, z_b = self.bottom_active(x_active), self.bottom_passive(x_passive)
        return self.top(h_a + z_b if self.topology == "coordinator-top" else torch.cat([h_a, z_b], dim=1))

    def forward(self, x_active: torch.Tensor, x_passive: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.logits(x_active, x_passive), dim=1)


@dataclass(frozen=True)
class SplitNNTask:
    model: SplitScores
    x_active: np.ndarray  # the queried (held-out) rows
    x_passive: np.ndarray  # ground truth, only for scoring reconstructions
    logits: np.ndarray  # the top model's logits for the queried rows (what a score step may read)
    n_classes: int
    accuracy: float  # argmax accuracy on the queried rows

    def observe(self, score_release: Sequence[str] = (), *, passive_bottom: bool = True) -> Observations:
        """What the active party has: scores through the chain (fresh OS entropy) and, per topology,

        * coordinator-top: the released model (bottoms + top) — luo's white box, as for the LR seeds;
        * active-top: its own scores and the recorded z_B; the passive bottom (hence a ``score_model`` over
          x_B) only with ``passive_bottom=True``, i.e. when the passive party's W_B was released.
        """
        from vflsec.services.defenses.release import ReleaseContext, ScoreReleaseChain

        chain = ScoreReleaseChain.from_specs(list(score_release))
        context = ReleaseContext(np.random.default_rng(), self.n_classes)
        scores = chain(softmax(self.logits, axis=1), self.logits, context)
        active_top = self.model.topology == "active-top"
        released = passive_bottom or not active_top
        with torch.no_grad():
            z_b = self.model.bottom_passive(torch.from_numpy(self.x_passive).float()).double().numpy()
        return Observations(
            x_active=self.x_active,
            scores=scores,
            n_classes=self.n_classes,
            d_passive=self.x_passive.shape[1],
            release=tuple(step.name for step in chain.steps),
            score_chain=tuple(chain.describe()),
            score_model=self.model if released else None,
            embeddings=z_b if active_top else None,
            passive_bottom=self.model.bottom_passive if active_top and released else None,
        )


def _mlp(sizes: Sequence[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (n_in, n_out) in enumerate(itertools.pairwise(sizes)):
        layers += [nn.Linear(n_in, n_out)] + ([nn.ReLU()] if i < len(sizes) - 2 else [])
    return nn.Sequential(*layers)


def trained_splitnn_task(
    dataset: str,
    topology: str = "coordinator-top",
    passive_fraction: float = 0.4,
    *,
    seed: int = 0,
    hidden: int = 32,
    width: int = 16,
    epochs: int = 60,
) -> SplitNNTask:
    """As :func:`trained_lr_task` (same rows and columns for a seed), a split NN trained centrally with Adam.

    Bottoms: d → ``hidden`` → ``width`` (ReLU between); the passive bottom in active-top is one linear layer of
    width max(d_B, 8) (the default of the split-NN family). Top: ReLU → ``hidden`` → C.
    """
    x, y, train, query, active, passive = _scaled_split(dataset, passive_fraction, seed)
    d_passive = len(passive)
    n_classes = int(y.max()) + 1
    with torch.random.fork_rng(), torch_threads(1):  # one thread: the same model on any machine
        torch.manual_seed(seed)
        bottom_active = _mlp([len(active), hidden, width])
        if topology == "active-top":
            bottom_passive: nn.Module = nn.Linear(d_passive, max(d_passive, 8))
            top_width = width + max(d_passive, 8)
        else:
            bottom_passive, top_width = _mlp([d_passive, hidden, width]), width
        top = nn.Sequential(nn.ReLU(), _mlp([top_width, hidden, n_classes]))
        model = SplitScores(bottom_active, bottom_passive, top, topology)
        xa, xp = (torch.from_numpy(x[:, cols]).float() for cols in (active, passive))
        labels = torch.from_numpy(y).long()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=1e-4)
        train_rows = torch.from_numpy(train)
        for _ in range(epochs):
            for batch in train_rows[torch.randperm(len(train_rows))].split(64):
                optimizer.zero_grad()
                nn.functional.cross_entropy(model.logits(xa[batch], xp[batch]), labels[batch]).backward()
                optimizer.step()
    model.zero_grad(set_to_none=True)
    model.eval().requires_grad_(False)
    logits = model.logits(xa[query], xp[query]).double().numpy()
    return SplitNNTask(
        model=model,
        x_active=x[query][:, active],
        x_passive=x[query][:, passive],
        logits=logits,
        n_classes=n_classes,
        accuracy=float(np.mean(logits.argmax(axis=1) == y[query])),
    )


TREE_MODELS = {"tree": {"max_depth": 5}, "forest": {"n_estimators": 100, "max_depth": 3}}


@dataclass(frozen=True)
class TreeTask:
    trees: tuple[ReleasedTree, ...]  # the whole model, as the harness holds it
    x_active: np.ndarray  # the queried (held-out) rows
    x_passive: np.ndarray  # ground truth, only for scoring reconstructions
    n_classes: int
    accuracy: float  # released-class accuracy on the queried rows

    @property
    def scores(self) -> np.ndarray:
        """The release: a DT's class one-hot, a forest's hard-voting fractions (luo §II)."""
        return vote_fractions(self.trees, self.x_active, self.x_passive, self.n_classes)

    def observe(self, *, withhold: bool = False) -> Observations:
        """What the active party has; ``withhold`` keeps the passive thresholds at their owner."""
        return Observations(
            x_active=self.x_active,
            scores=self.scores,
            n_classes=self.n_classes,
            d_passive=self.x_passive.shape[1],
            released_trees=tuple(t.withheld() for t in self.trees) if withhold else self.trees,
        )


def trained_tree_task(dataset: str, model: str = "tree", passive_fraction: float = 0.4, *, seed: int = 0) -> TreeTask:
    """As :func:`trained_lr_task` (same rows and columns for a seed): scikit-learn's DT (depth 5) or RF (100
    trees of depth 3, luo's and issue 13's settings) trained on the training half of [x_active, x_passive]."""
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.tree import DecisionTreeClassifier

    if model not in TREE_MODELS:
        raise ValueError(f"model must be one of {tuple(TREE_MODELS)}, got {model!r}")
    x, y, train, query, active, passive = _scaled_split(dataset, passive_fraction, seed)
    x = np.hstack([x[:, active], x[:, passive]])
    kind = RandomForestClassifier if model == "forest" else DecisionTreeClassifier
    fitted = kind(**TREE_MODELS[model], random_state=seed).fit(x[train], y[train])
    trees = from_sklearn(fitted, len(active))
    n_classes = int(y.max()) + 1
    x_active, x_passive = x[query][:, : len(active)], x[query][:, len(active) :]
    votes = vote_fractions(trees, x_active, x_passive, n_classes)
    return TreeTask(trees, x_active, x_passive, n_classes, float(np.mean(votes.argmax(axis=1) == y[query])))
