"""Label inference by a curious passive party beyond norm and direction scoring (labels.py), in every family.

- ``completion``: Fu et al.'s passive model completion ("Label Inference Attacks Against Vertical Federated
  Learning", USENIX Security 2022, §4.1): the party holds its trained bottom model and k labelled rows, fits an
  inference head on the bottom's outputs and labels every other row. Here the bottom is frozen and the head is a
  logistic regression (Fu et al. fine-tune bottom and head with MixMatch on the unlabelled rows too). The bottom's
  output: LR's z_p = X_p W_pᵀ, split-NN's h_p; for trees (no bottom) the rows' co-membership in the nodes the party
  saw (one indicator per node). Beside it the same head on the party's raw features (``own_features``): what the k
  labels give without anything the federation sent, so the gap is the federation's contribution.
- ``direct``: Fu et al.'s direct label inference (§4.3): where the party receives ∂L/∂logits per row, p − e_y, the
  one negative entry is the label. It applies only to gradients of that form (K columns, rows summing to 0, one
  negative entry): in vflsec's split-NN a top model stands between h and the logits, so it reports why not.
- ``clustering``: Liu & Lyu's gradient clustering ("Clustering Label Inference Attack against Practical Split
  Learning", 2022): k-means of the per-row gradients into C clusters. Each row's gradients scaled to unit length and
  laid side by side, one block per epoch (rows of one epoch meet nearly the same top model); named without labels
  for two classes by Li et al.'s norm heuristic (the cluster whose gradients are the larger within their steps is the
  rarer class), with k labelled rows (``k``) by their majority.
- ``id2graph``: Takahashi et al.'s ID2Graph ("Eliminating Label Leakage in Tree-Based Vertical Federated Learning",
  2023): the passive party's instance-space graph (rows joined when they share a node) clustered into C communities.
  We cluster a spectral embedding of the graph (k-means) where they run Louvain, use every node the party saw (not
  only leaves: in a CART tree it does not see the last level unless it split it) and name the clusters as
  ``clustering`` does: without labels, the smaller cluster is the rarer class.
- ``residuals``: LR: a passive party's own gradient of a step is g = δᵀX_B / b, d_p linear functionals of the batch's
  residuals δ = p − y. The least-squares δ̂ = b X_B (X_BᵀX_B)⁺ gᵀ (the part of δ its own columns span) averaged over
  the steps a row was in; y = 1 makes δ negative, so −δ̂ scores class 1 with no label and no orientation guess.
- ``own_logit``: LR's z_p = X_p W_pᵀ itself, with no label: the trained block raises the logit of the true class.
"""

from __future__ import annotations

import numpy as np
from scipy import sparse
from sklearn.cluster import KMeans
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_limits

from .base import Attack, NotApplicable, Observations, Reconstruction, register
from .labels import per_row

__all__ = [
    "DEFAULT_COMPLETION_K",
    "AwarePartitionGraph",
    "DirectLabel",
    "GradientClustering",
    "ModelCompletion",
    "OwnLogit",
    "PartitionGraph",
    "Residuals",
    "fit_head",
    "membership",
]

DEFAULT_COMPLETION_K = 50  # labelled rows of model completion when k is not given (at most half the rows)


class _LabelAttack(Attack):
    metric = "auc"
    target = "labels"


def _k_rows(k: int, n_samples: int) -> int:
    """An explicit number of labelled rows, if it leaves a row to score."""
    if k >= n_samples:
        raise NotApplicable(f"k={k} labelled rows leave none of the {n_samples} rows to score")
    return k


def _labelled(obs: Observations, name: str) -> tuple[np.ndarray, np.ndarray]:
    if obs.labelled_rows is None or obs.labelled_labels is None:
        raise NotApplicable(f"{name} needs labelled rows (auxiliary labels): --attack-option {name}.k=N")
    return np.asarray(obs.labelled_rows), np.asarray(obs.labelled_labels, dtype=np.int64)


def _result(probabilities: np.ndarray, meta: dict | None = None) -> Reconstruction:
    """Class probabilities (n, C) as the contract's outputs: class 1's score (two classes) and the argmax."""
    scores = probabilities[:, 1] if probabilities.shape[1] == 2 else None
    return Reconstruction(None, meta or {}, label_scores=scores, label_predictions=np.argmax(probabilities, axis=1))


def fit_head(
    features: np.ndarray | sparse.spmatrix, rows: np.ndarray, labels: np.ndarray, n_classes: int
) -> np.ndarray:
    """A logistic-regression head fitted on ``features[rows]`` → ``labels``, applied to every row: (n, C) class
    probabilities (a class absent from the labelled rows gets 0). Dense features are standardised on the labelled
    rows; indicator (sparse) ones are used as they are."""
    present = np.unique(labels)
    out = np.zeros((features.shape[0], n_classes))
    if len(present) == 1:  # one class among the labelled rows: all the head can say
        out[:, present[0]] = 1.0
        return out
    if not sparse.issparse(features):
        features = StandardScaler().fit(features[rows]).transform(features)
    with threadpool_limits(1):
        head = LogisticRegression(C=1.0, max_iter=2000).fit(features[rows], labels)
        out[:, head.classes_] = head.predict_proba(features)
    return out


def membership(partitions: tuple[np.ndarray, ...], n: int) -> sparse.csr_matrix:
    """The rows' indicator matrix (n, nodes): row i, column j is 1 when row i is in node j."""
    cols = np.concatenate([np.full(len(p), j) for j, p in enumerate(partitions)]) if partitions else np.zeros(0, int)
    rows = np.concatenate(partitions) if partitions else np.zeros(0, int)
    return sparse.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(n, len(partitions)))


@register("completion")
class ModelCompletion(_LabelAttack):
    """Fu et al.'s passive model completion: a logistic head on the party's trained bottom's outputs (LR z_p, split-NN
    h_p; trees: node co-membership), fitted on ``k`` labelled rows (default DEFAULT_COMPLETION_K, at most half the
    rows); ``meta["own_features"]``: the same head on the party's raw features (the labels without the federation)."""

    families = frozenset({"lr", "splitnn", "tree", "forest"})
    needs = frozenset({"x_own"})

    def __init__(self, k: int | None = None) -> None:
        if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 2):
            raise ValueError(f"k must be an integer >= 2 (labelled rows), got {k!r}")
        self.k = k

    def auxiliary_rows(self, n_samples: int) -> int:
        return min(DEFAULT_COMPLETION_K, n_samples // 2) if self.k is None else _k_rows(self.k, n_samples)

    def reconstruct(self, obs: Observations) -> Reconstruction:
        rows, labels = _labelled(obs, self.name)
        if obs.partitions:  # trees: every node seen (its own model's output is only its own splits' bits)
            features: np.ndarray | sparse.spmatrix = membership(obs.partitions, obs.n_samples)
            source = "partitions"
        elif obs.own_outputs is not None:
            features, source = np.asarray(obs.own_outputs, dtype=np.float64), "own_outputs"
        else:
            raise NotApplicable(f"{self.name} needs the party's trained model (its outputs) or the tree partitions")
        x_own = np.asarray(obs.x_own, dtype=np.float64)
        own = fit_head(x_own, rows, labels, obs.n_classes)
        completed = fit_head(features, rows, labels, obs.n_classes)
        meta = {"features": source, "labelled_rows": len(rows), "own_features": _result(own)}
        return _result(completed, meta)


@register("direct")
class DirectLabel(_LabelAttack):
    """Fu et al.'s direct label inference: the negative entry of ∂L/∂logits, p − e_y, is the label; a row's votes over
    the steps it was seen in. Not applicable unless the gradients have that form."""

    families = frozenset({"splitnn"})
    needs = frozenset({"gradients", "gradient_rows", "gradient_steps"})

    def reconstruct(self, obs: Observations) -> Reconstruction:
        g = np.asarray(obs.gradients, dtype=np.float64)
        if g.shape[1] != obs.n_classes:
            raise NotApplicable(
                f"the party receives the gradient of its output (width {g.shape[1]}) below the top model, not "
                f"∂L/∂logits of width {obs.n_classes} (Fu et al.'s setting without a top model)"
            )
        negative = (g < 0).sum(axis=1)
        scale = np.abs(g).sum(axis=1) + 1e-12
        if not (np.all(negative <= 1) and np.all(np.abs(g.sum(axis=1)) <= 1e-6 * scale)):
            raise NotApplicable("the gradients are not of the form p − e_y (rows summing to 0, one negative entry)")
        rows = np.asarray(obs.gradient_rows)
        votes = np.zeros((obs.n_samples, obs.n_classes))
        np.add.at(votes, (rows, np.argmin(g, axis=1)), 1.0)
        seen = votes.sum(axis=1, keepdims=True)
        probabilities = np.divide(votes, seen, out=np.full_like(votes, 1.0 / obs.n_classes), where=seen > 0)
        return _result(probabilities)


class _ClusterAttack(_LabelAttack):
    """Clusters named by ``k`` labelled rows or, without (two classes), the cluster taken for the rarer class is
    ``positive`` (Li et al.'s convention, labels.py: 1 by default; 0 where the attacker believes class 0 the rarer).
    ``seed``: k-means' own."""

    def __init__(self, k: int = 0, positive: int = 1, seed: int | None = 0) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"k must be an integer >= 0 (labelled rows to name the clusters), got {k!r}")
        if positive not in (0, 1):
            raise ValueError(f"positive must be the class taken for the rarer one, 0 or 1, got {positive}")
        self.k, self.positive, self.seed = k, positive, seed

    def auxiliary_rows(self, n_samples: int) -> int:
        return _k_rows(self.k, n_samples)


def _name_clusters(
    assign: np.ndarray, distances: np.ndarray, obs: Observations, rare_cluster: int | None, attack: _ClusterAttack
) -> Reconstruction:
    """Clusters (``assign``; ``distances`` (n, C) to each centroid) named as classes: by the majority of the labelled
    rows in each cluster when the attacker has some, else (two classes) ``rare_cluster`` is the class the attacker
    takes for the rarer one (``positive``). Scores are soft: each class's share of exp(−distance) to the centroids."""
    name = attack.name
    c = obs.n_classes
    if obs.labelled_rows is not None and obs.labelled_labels is not None:
        rows, labels = _labelled(obs, name)
        counts = np.zeros((c, c))
        np.add.at(counts, (assign[rows], labels), 1.0)
        names = np.argmax(counts + 1e-9 * np.arange(c)[::-1], axis=1)  # an unlabelled cluster: class 0
    elif c == 2 and rare_cluster is not None:
        names = np.array([attack.positive, 1 - attack.positive])[[0, 1] if rare_cluster == 0 else [1, 0]]
    else:
        raise NotApplicable(f"naming {c} clusters as classes needs labelled rows: --attack-option {name}.k=N")
    probabilities = np.zeros((len(assign), c))
    for cluster in range(c):
        probabilities[:, names[cluster]] += np.exp(-(distances[:, cluster] - distances.min(axis=1)))
    probabilities /= probabilities.sum(axis=1, keepdims=True)
    meta = {"cluster_classes": names.tolist(), "cluster_sizes": np.bincount(assign, minlength=c).tolist()}
    return _result(probabilities, meta)


def _kmeans(points: np.ndarray, c: int, seed: int | None) -> tuple[np.ndarray, np.ndarray]:
    with threadpool_limits(1):
        km = KMeans(n_clusters=c, n_init=10, random_state=seed).fit(points)
    return km.labels_, km.transform(points)


def _occurrences(unit: np.ndarray, rows: np.ndarray, steps: np.ndarray, n: int) -> np.ndarray:
    """Each row's gradients side by side in the order it received them, (n, epochs × E): its t-th gradient (its t-th
    epoch) in block t, zeros where a row was seen fewer times. Rows of one epoch are compared under nearly the same
    top model; a single epoch's directions are noisy where the top model's Jacobian varies from row to row."""
    order = np.lexsort((np.arange(len(rows)), steps))
    occurrence = np.zeros(len(rows), dtype=np.int64)
    count = np.zeros(n, dtype=np.int64)
    for i in order:
        occurrence[i] = count[rows[i]]
        count[rows[i]] += 1
    if np.any(count == 0):
        raise NotApplicable("some rows received no gradient")
    width = unit.shape[1]
    features = np.zeros((n, int(count.max()) * width))
    for i in range(len(rows)):
        features[rows[i], occurrence[i] * width : (occurrence[i] + 1) * width] = unit[i]
    return features


@register("clustering")
class GradientClustering(_ClusterAttack):
    """Liu & Lyu's gradient clustering: k-means (C clusters) of each row's unit gradients, one block per epoch; named
    by the larger in-step norm (two classes, no label) or by ``k`` labelled rows."""

    families = frozenset({"splitnn"})
    needs = frozenset({"gradients", "gradient_rows", "gradient_steps"})

    def reconstruct(self, obs: Observations) -> Reconstruction:
        from scipy.stats import rankdata

        g = np.asarray(obs.gradients, dtype=np.float64)
        rows, steps = np.asarray(obs.gradient_rows), np.asarray(obs.gradient_steps)
        norms = np.linalg.norm(g, axis=1)
        rank = np.zeros(len(g))  # each gradient's norm as its rank within its step (late steps' are small)
        for step in np.unique(steps):
            at = steps == step
            rank[at] = rankdata(norms[at]) / at.sum()
        assign, distances = _kmeans(_occurrences(g / np.maximum(norms, 1e-300)[:, None], rows, steps, obs.n_samples),
                                    obs.n_classes, self.seed)  # fmt: skip
        rare = None
        if obs.n_classes == 2:
            mean_rank = per_row(rank, rows, obs.n_samples)
            rare = int(np.argmax([mean_rank[assign == c].mean() if np.any(assign == c) else -1 for c in (0, 1)]))
        return _name_clusters(assign, distances, obs, rare, self)


@register("id2graph")
class PartitionGraph(_ClusterAttack):
    """Takahashi et al.'s ID2Graph, spectral variant: the rows' co-membership graph over the nodes the party saw,
    embedded by its top eigenvectors (rows normalised) and clustered into C; named by size (two classes, no label: the
    smaller cluster is the rarer class) or by ``k`` labelled rows."""

    families = frozenset({"tree", "forest"})
    needs = frozenset({"partitions"})

    def _membership(self, obs: Observations) -> sparse.csr_matrix:
        return membership(obs.partitions or (), obs.n_samples)

    def reconstruct(self, obs: Observations) -> Reconstruction:
        from scipy.sparse.linalg import svds

        m = self._membership(obs)
        c = obs.n_classes
        if m.shape[1] < 2:
            raise NotApplicable(f"{self.name}: the party saw fewer than two nodes")
        degree = np.asarray(m @ (m.T @ np.ones(obs.n_samples))).reshape(-1)  # row degrees of A = M Mᵀ
        if np.any(degree == 0):
            degree = np.maximum(degree, 1.0)
        normalised = sparse.diags(1.0 / np.sqrt(degree)) @ m  # D^-1/2 M: its singular vectors are A's eigenvectors
        width = min(c + 1, min(normalised.shape) - 1)
        u, s, _ = svds(normalised.astype(np.float64), k=width, random_state=self.seed)
        u = u[:, np.argsort(-s)][:, 1:] if width > 1 else u  # the first is the trivial (degree) vector
        # each row's coordinates scaled to unit length (Ng, Jordan & Weiss): rows of small nodes, whose coordinates are
        # large, would otherwise take clusters of their own (wine, one tree: 0.52 accuracy with 30 labelled rows; 0.86)
        embedding = u / np.maximum(np.linalg.norm(u, axis=1, keepdims=True), 1e-12)
        assign, distances = _kmeans(embedding, c, self.seed)
        sizes = np.bincount(assign, minlength=c)
        return _name_clusters(assign, distances, obs, int(np.argmin(sizes)) if c == 2 else None, self)


@register("id2graph_aware")
class AwarePartitionGraph(PartitionGraph):
    """ID2Graph by an attacker that knows the tree protocol and the session's partition defense (Kerckhoffs): a node
    it saw with one child among its nodes also gives the other child's rows (the parent's less the child's), and where
    the protocol would have shown it that other child — a CART tree (every node searches every party's features), a
    depth below max_depth that the defense shows — its absence says the child was not searched: a pure node or one
    too light to split, whose rows likely share a label; its column weighs ``leaf_weight``. Nodes the defense hides
    say nothing, and are not read as leaves."""

    needs = frozenset({"partitions", "partition_nodes", "tree_settings"})

    def __init__(self, k: int = 0, positive: int = 1, seed: int | None = 0, leaf_weight: float = 3.0) -> None:
        super().__init__(k, positive, seed)
        if not leaf_weight > 0:
            raise ValueError(f"leaf_weight must be > 0, got {leaf_weight}")
        self.leaf_weight = leaf_weight

    def _membership(self, obs: Observations) -> sparse.csr_matrix:
        from vflsec.services.models import family as families
        from vflsec.services.models.tree.steps import node_depth

        settings = dict(obs.tree_settings or {})
        kind = settings.pop("kind", "tree")
        config = families.get(kind).settings(settings).config  # the family's defaults for what the session left out
        rows: dict[tuple[int, int], np.ndarray] = {}
        for node, part in zip(obs.partition_nodes or (), obs.partitions or (), strict=True):
            rows[node] = np.union1d(rows.get(node, part), part)
        parts, weights = [*(obs.partitions or ())], [1.0] * len(obs.partitions or ())  # id2graph's own columns, and:
        for (tree, node), part in rows.items():
            children = [(tree, 2 * node + 1), (tree, 2 * node + 2)]
            seen = [child in rows for child in children]
            if sum(seen) != 1:
                continue
            missing = children[seen.index(False)]
            other = np.setdiff1d(part, rows[children[seen.index(True)]])
            if not other.size:
                continue
            depth = node_depth(missing[1])
            searched_if_open = kind == "tree" and depth < config.max_depth and config.shows_passive(tree, depth)
            parts.append(other)
            weights.append(self.leaf_weight if searched_if_open else 1.0)
        return membership(tuple(parts), obs.n_samples) @ sparse.diags(weights)


@register("residuals")
class Residuals(_LabelAttack):
    """LR: the least-squares residuals b X_B (X_BᵀX_B)⁺ gᵀ of each step's own gradient, averaged per row; −δ̂ scores
    class 1 (two classes), argmin over the K logits the class (more)."""

    families = frozenset({"lr"})
    needs = frozenset({"block_gradients", "block_rows", "x_own"})

    def reconstruct(self, obs: Observations) -> Reconstruction:
        x = np.asarray(obs.x_own, dtype=np.float64)
        k = np.shape(obs.block_gradients)[1]
        total, seen = np.zeros((obs.n_samples, k)), np.zeros(obs.n_samples)
        for gradient, batch in zip(np.asarray(obs.block_gradients), obs.block_rows or (), strict=True):
            xb = x[batch]
            delta = len(batch) * xb @ np.linalg.pinv(xb.T @ xb) @ gradient.T  # (b, K)
            np.add.at(total, batch, delta)
            np.add.at(seen, batch, 1.0)
        delta = total / np.maximum(seen, 1.0)[:, None]
        if k == 1:  # sigmoid: δ = p − y, y = 1 makes it negative
            return Reconstruction(None, {"steps": len(obs.block_rows or ())}, label_scores=-delta[:, 0],
                                  label_predictions=(delta[:, 0] < 0).astype(np.int64))  # fmt: skip
        return Reconstruction(None, {"steps": len(obs.block_rows or ())}, label_predictions=np.argmin(delta, axis=1))


@register("own_logit")
class OwnLogit(_LabelAttack):
    """LR: the party's own logit share z_p = X_p W_pᵀ of its trained block, read as a score (class 1 when one logit) or
    argmax (K logits); no label."""

    families = frozenset({"lr"})
    needs = frozenset({"own_outputs"})

    def reconstruct(self, obs: Observations) -> Reconstruction:
        z = np.asarray(obs.own_outputs, dtype=np.float64)
        if z.shape[1] == 1:
            return Reconstruction(None, {}, label_scores=z[:, 0])  # a share of the logit: a ranking, not a class
        return Reconstruction(None, {}, label_predictions=np.argmax(z, axis=1))
