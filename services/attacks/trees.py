"""Attacks on released decision trees and random forests (luo §IV-B, §V-B) and their metric.

The attacks see a released tree through :class:`ReleasedTree` (released.py). A DT releases the class (one hot
scores), a forest the fraction of trees voting for each class (hard voting, luo §II).

* ``pra`` — path restriction (luo Algorithm 1): the leaves reachable from the adversary's own features whose
  class is the released one are the candidate paths; one is drawn uniformly, and each passive feature is
  estimated by the midpoint of the interval its branch constraints on that path leave (features the path
  does not test: the midpoint of the range, i.e. Half).
* ``grn_rf`` — GRN on a forest (luo §V-B): dummy samples drawn uniformly from the feature ranges, labelled
  with the forest's vote fractions, train an MLP surrogate; gradient.py's GRN then runs on the surrogate as
  a released ``score_model``.

Metric: :func:`correct_branching_rate` (CBR, luo §VI), the fraction of passive branchings on the estimate's
paths that the true features take the same way; :func:`random_path_cbr` is luo's random-path baseline.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from .base import Attack, NotApplicable, Observations, Reconstruction, register
from .gradient import Grn, torch_threads
from .released import ReleasedTree


def vote_fractions(
    trees: Sequence[ReleasedTree], x_active: np.ndarray, x_passive: np.ndarray, n_classes: int
) -> np.ndarray:
    """What a DT (one-hot class) or a forest (hard-voting fractions, luo §II) releases, shape (n, C)."""
    votes = np.zeros((len(x_active), n_classes))
    rows = np.arange(len(x_active))
    for tree in trees:
        leaf = tree.route(x_active, x_passive)
        votes[rows, [tree.leaf_class[int(i)] for i in leaf]] += 1
    return votes / len(trees)


def _path_agreement(tree: ReleasedTree, leaf: np.ndarray, x_true: np.ndarray) -> tuple[int, int]:
    """(branchings the true passive features take as the paths to ``leaf`` do, passive branchings on them)."""
    correct = total = 0
    for target in np.unique(leaf):
        rows = leaf == target
        for i, went_left in tree.paths[int(target)]:
            node = tree.nodes[i]
            if node.owner == "passive":
                assert node.threshold is not None, "CBR is scored by the harness, which holds the whole tree"
                correct += int(np.sum((x_true[rows, node.feature] <= node.threshold) == went_left))
                total += int(rows.sum())
    return correct, total


def _rate(counts: Sequence[tuple[int, int]]) -> float:
    correct, total = np.sum(counts, axis=0) if counts else (0, 0)
    return float(correct / total) if total else float("nan")


def correct_branching_rate(
    trees: Sequence[ReleasedTree], x_active: np.ndarray, x_true: np.ndarray, x_hat: np.ndarray
) -> float:
    """CBR (luo §VI): over every tree and row, the passive branchings on the path [x_active, x̂] takes, the
    fraction the true passive features take the same way (NaN if those paths test no passive feature)."""
    return _rate([_path_agreement(t, t.route(x_active, x_hat), x_true) for t in trees])


def random_path_cbr(tree: ReleasedTree, x_true: np.ndarray, rng: np.random.Generator) -> float:
    """luo's random-guess baseline for PRA: a path drawn uniformly from all of the tree's paths per row."""
    return _rate([_path_agreement(tree, rng.choice(tree.leaves, size=len(x_true)), x_true)])


def _released_trees(obs: Observations, name: str) -> tuple[ReleasedTree, ...]:
    trees = obs.released_trees
    if not trees:
        raise NotApplicable(f"{name} needs a released tree model")
    if any(t.withholds_passive for t in trees):
        raise NotApplicable(
            f"{name}: the passive parties' thresholds were withheld (a tree's default; luo's setting releases them "
            "with --param-release thresholds); without them no passive branching can be evaluated, so no path "
            "constrains a passive feature"
        )
    return trees


class PathRestriction(Attack):
    """luo Algorithm 1 on a released DT; ``bounds`` is the known range of every passive feature."""

    needs = frozenset({"scores", "released_trees"})
    families = frozenset({"tree", "forest"})
    metric = "cbr"

    def __init__(self, bounds: tuple[float, float] = (0.0, 1.0), seed: int | None = None) -> None:
        self.bounds = bounds
        self.seed = seed

    def reconstruct(self, obs: Observations) -> Reconstruction:
        trees = _released_trees(obs, self.name or "pra")
        if len(trees) != 1:
            raise NotApplicable(
                f"{self.name or 'pra'} restricts the paths of one tree; a forest of {len(trees)} has too many tree "
                "combinations per released vote (luo §V) — grn_rf attacks forests"
            )
        tree = trees[0]
        assert obs.scores is not None
        x_active = np.asarray(obs.x_active, float)
        n = len(x_active)
        # β of Algorithm 1 for every row at once: which nodes the adversary's own features leave reachable.
        reach = np.zeros((len(tree.nodes), n), dtype=bool)
        reach[0] = True
        for i, node in enumerate(tree.nodes):
            if node.owner == "active":
                assert node.threshold is not None
                left = x_active[:, node.feature] <= node.threshold
                reach[node.left] |= reach[i] & left
                reach[node.right] |= reach[i] & ~left
            elif node.owner == "passive":
                reach[node.left] |= reach[i]
                reach[node.right] |= reach[i]
        leaves = tree.leaves
        consistent = reach[leaves].T  # (n, leaves)
        released = obs.scores.argmax(axis=1)
        # α of Algorithm 1: leaves whose class is the released one. A defended release may leave no candidate;
        # such rows fall back on every path their own features allow.
        candidates = consistent & (np.array([tree.leaf_class[int(i)] for i in leaves])[None, :] == released[:, None])
        empty = ~candidates.any(axis=1)
        candidates[empty] = consistent[empty]
        rng = np.random.default_rng(self.seed)
        chosen = leaves[np.argmax(np.where(candidates, rng.random(candidates.shape), -1.0), axis=1)]
        low, high = self._intervals(tree, obs.d_passive)
        x_hat = (low[chosen] + high[chosen]) / 2
        meta = {"leaf": chosen, "n_candidates": candidates.sum(axis=1), "no_candidate": empty}
        return Reconstruction(x_hat, meta)

    def _intervals(self, tree: ReleasedTree, d_p: int) -> tuple[np.ndarray, np.ndarray]:
        """Per node, the box of passive values its path from the root allows (feature ranges elsewhere)."""
        low = np.full((len(tree.nodes), d_p), float(self.bounds[0]))
        high = np.full((len(tree.nodes), d_p), float(self.bounds[1]))
        for i, node in enumerate(tree.nodes):
            if node.owner is None:
                continue
            low[node.left], high[node.left] = low[i], high[i]
            low[node.right], high[node.right] = low[i], high[i]
            if node.owner == "passive":
                assert node.threshold is not None
                f, t = node.feature, min(max(node.threshold, self.bounds[0]), self.bounds[1])
                high[node.left, f] = min(high[i, f], t)
                low[node.right, f] = max(low[i, f], t)
        return low, high


class Surrogate(nn.Module):
    """A differentiable stand-in for the forest, released-model style: ``forward(x_active, x_passive)``."""

    def __init__(self, d_active: int, d_passive: int, n_classes: int, hidden: Sequence[int]) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = d_active + d_passive
        for size in hidden:
            layers += [nn.Linear(width, size), nn.ReLU()]
            width = size
        self.net = nn.Sequential(*layers, nn.Linear(width, n_classes))

    def logits(self, x_active: torch.Tensor, x_passive: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([x_active, x_passive], dim=1))

    def forward(self, x_active: torch.Tensor, x_passive: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.logits(x_active, x_passive), dim=1)


class ForestGrn(Attack):
    """luo §V-B: surrogate MLP fitted to the forest's votes on ``dummy`` uniform samples, then GRN on it.

    ``own_rows=True`` pairs the uniform passive part of each dummy sample with one of the adversary's own
    queried rows, so the surrogate learns the forest where the active features actually lie.

    ``grn`` holds gradient.py's GRN options; the scores are vote fractions with many exact zeros, so the
    default divergence is the KL (cross-entropy) rather than GRN's log-score MSE.
    """

    families = frozenset({"tree", "forest"})
    metric = "cbr"

    needs = frozenset({"scores", "released_trees"})

    def __init__(
        self,
        *,
        dummy: int = 20_000,
        own_rows: bool = False,
        hidden: Sequence[int] = (256, 128),
        epochs: int = 30,
        batch_size: int = 256,
        lr: float = 2e-3,
        bounds: tuple[float, float] = (0.0, 1.0),
        grn_epochs: int = 40,  # Grn's own default
        seed: int = 0,
        threads: int | None = 1,
    ) -> None:
        self.dummy = dummy
        self.own_rows = own_rows
        self.hidden = tuple(hidden)
        self.epochs = epochs
        self.batch_size = batch_size
        self.lr = lr
        self.bounds = bounds
        self.grn_epochs = grn_epochs
        self.seed = seed
        self.threads = threads

    def reconstruct(self, obs: Observations) -> Reconstruction:
        trees = _released_trees(obs, self.name or "grn_rf")
        with torch_threads(self.threads), torch.random.fork_rng():
            torch.manual_seed(self.seed)
            surrogate, fit = self.surrogate(trees, obs)
        grn = Grn(loss="kl", epochs=self.grn_epochs, seed=self.seed, threads=self.threads)
        result = grn.reconstruct(dataclasses.replace(obs, score_model=surrogate))
        result.meta["surrogate_agreement"] = fit
        return result

    def surrogate(self, trees: Sequence[ReleasedTree], obs: Observations) -> tuple[Surrogate, float]:
        """The trained surrogate and how often its argmax matches the forest's on fresh dummy samples."""
        d_a, d_p = np.shape(obs.x_active)[1], obs.d_passive
        rng = np.random.default_rng(self.seed)
        low, high = self.bounds

        def draw(n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            x = rng.uniform(low, high, size=(n, d_a + d_p))
            if self.own_rows:
                x[:, :d_a] = np.asarray(obs.x_active, float)[rng.integers(obs.n_samples, size=n)]
            votes = vote_fractions(trees, x[:, :d_a], x[:, d_a:], obs.n_classes)
            return tuple(torch.from_numpy(v).float() for v in (x[:, :d_a], x[:, d_a:], votes))  # type: ignore[return-value]

        xa, xp, votes = draw(self.dummy)
        model = Surrogate(d_a, d_p, obs.n_classes, self.hidden)
        optimizer = torch.optim.Adam(model.parameters(), lr=self.lr)
        for _ in range(self.epochs):
            for batch in torch.randperm(self.dummy).split(self.batch_size):
                log_p = torch.log_softmax(model.logits(xa[batch], xp[batch]), dim=1)
                loss = -(votes[batch] * log_p).sum(dim=1).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        model.eval().requires_grad_(False)
        xa, xp, votes = draw(2_000)
        agreement = float((model(xa, xp).argmax(dim=1) == votes.argmax(dim=1)).float().mean())
        return model, agreement


def _single_linear(module: nn.Module) -> nn.Linear | None:
    """The layer itself when ``module`` is one nn.Linear, possibly wrapped in Sequentials; else None."""
    while isinstance(module, nn.Sequential) and len(module) == 1:
        module = module[0]
    return module if isinstance(module, nn.Linear) else None


class EmbeddingLeastSquares(Attack):
    """Active-top split NN with a released linear passive bottom: x̂ = argmin ‖W_B x + b − z_B‖ per row.

    Exact (to float round-off) when W_B has full column rank d_B, which needs width ≥ d_B. Otherwise z_B fixes
    x_B only up to the null space of W_B; of the least-squares solutions the one nearest ``prior`` (Half) is
    returned, so unidentified directions fall back on the blind guess (digits' constant pixels end there).
    """

    families = frozenset({"splitnn"})

    needs = frozenset({"embeddings", "passive_bottom"})

    def __init__(self, prior: float = 0.5) -> None:
        self.prior = prior

    def reconstruct(self, obs: Observations) -> Reconstruction:
        layer = _single_linear(obs.passive_bottom)  # type: ignore[arg-type]
        if layer is None:
            raise NotApplicable(f"{self.name}: the released passive bottom is not a single linear layer")
        weight = layer.weight.detach().double().numpy()
        bias = np.zeros(len(weight)) if layer.bias is None else layer.bias.detach().double().numpy()
        z = np.asarray(obs.embeddings, float)
        if weight.shape != (z.shape[1], obs.d_passive):
            raise NotApplicable(
                f"{self.name}: the passive bottom maps {weight.shape[1]} features to {weight.shape[0]}, but the "
                f"schema has {obs.d_passive} passive features and the recorded embeddings width {z.shape[1]}"
            )
        prior = np.full(obs.d_passive, self.prior)
        # lstsq returns the minimum-norm solution, so solving for x − prior gives the one nearest the prior.
        delta, *_ = np.linalg.lstsq(weight, (z - bias - weight @ prior).T, rcond=None)
        x_hat = prior + delta.T
        rank = int(np.linalg.matrix_rank(weight))
        residual = np.linalg.norm(x_hat @ weight.T + bias - z, axis=1)
        return Reconstruction(x_hat, {"residual": residual, "rank": rank, "exact": rank == obs.d_passive})


register("pra", PathRestriction)
register("grn_rf", ForestGrn)
register("embedding_ls", EmbeddingLeastSquares)
register("grn_rf_own", ForestGrn, own_rows=True)
