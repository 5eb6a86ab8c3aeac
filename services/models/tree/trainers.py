"""The tree family's trainers (services/models/family.py): decision trees and random forests through the services.

Growing (docs/trees.md; the roles of :mod:`.steps`, played as :mod:`.simulate` plays them in one process): the
active party (label holder) drives node by node over its family links (services/transport/tree_links.py).

1. Begin: every passive party fits its quantile bins on every row it holds (aligned or not; at least [policy]
   min_training_rows) and returns its bins per feature (public); the coordinator's :class:`.steps.Builder` starts
   from every party's sizes, each passive party's as that party reports them (TreePassive.Shard).
2. Per node: the coordinator names the node (rows, bootstrap weights, candidate features); the active party sends
   its class totals; if the node is searched it encrypts the rows' class indicators for the passive parties, each
   of which sends the coordinator its masked per-bin products ct×pt and their mask sums (one answer per
   (party, node): :class:`.steps.KeyHolder`); the active party's own per-bin counts go to the coordinator in the
   clear. The coordinator picks the Gini-best split and tells its owner, who keeps the threshold and returns the
   partition of the node's rows (the children's rows, which everyone learns).

Inference is the engines' path: a party's share has one column per possible split node (n_trees ×
(2^max_depth − 1)), 1 where a row goes left at a split it owns, 0 elsewhere; the coordinator receives each party's
share apart (nothing is decrypted at inference) and takes each node's bit from its owner's share alone
(``selects_share_columns``; no share masks, which would not cancel), routes each row (:func:`.steps.combine`) and
gives the class (DT) or the vote fractions (RF) to the score-release chain. The coordinator thus learns each
query's path (as it did from the sum), never a value, and no party's share can move or have refused another
party's answer.

Release: the coordinator's skeleton (owners, features, bins, per-node class counts); passive thresholds stay with
their owners unless the parameter-release chain names ``thresholds`` (luo's PRA / GRN-RF setting, one explicit
option away); the active party adds its own.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from vflsec.services import kinds
from vflsec.services.common import ACTIVE as ACTIVE_ROLE
from vflsec.services.common import COORDINATOR, PASSIVE, distinct_rows
from vflsec.services.crypto import he, product_pool
from vflsec.services.errors import FailedPrecondition, InvalidArgument
from vflsec.services.models.family import (
    ActiveContext,
    FamilyStep,
    KeyHolderContext,
    PassiveContext,
    Release,
    ReleaseCall,
    ReleasedModel,
    State,
    register,
)
from vflsec.services.registry import parse_spec

from .binning import QuantileBins
from .config import TreeConfig, TreeSettings
from .steps import (
    ACTIVE,
    Builder,
    FeatureOwner,
    GrowthMirror,
    Histograms,
    KeyHolder,
    KnownRows,
    LabelHolder,
    NodeKey,
    Split,
    Task,
    check_searchable,
    combine,
    encrypted_classes,
    indicator_layout,
    node_depth,
    parent_key,
    product_count,
    product_parts,
    products_over,
)
from .structure import Forest, copy_tree, from_tensors, to_tensors

MAX_PRODUCT_ATTEMPTS = 2  # products a passive party makes for one node: the first, and one retry
# The parameter-release step that discloses the passive thresholds (services/defenses/params.py): explicit only.
RELEASE_THRESHOLDS = "thresholds"
ONE_STEP = 2**31 - 1  # the default batch: trees grow in one pass over every training row (TrainingConfig int32)


def _shares(settings: TreeSettings, owner: FeatureOwner | None, x: np.ndarray) -> np.ndarray:
    """A party's inference share: 1 where a row goes left at a split this party owns."""
    share = np.zeros((x.shape[0], settings.split_columns))
    for key, left in ({} if owner is None else owner.directions(x)).items():
        share[:, settings.column(key)] = left
    return share


# --- family links (services/transport/tree_links.py): plain values in and out ---
class KeyHolderLink(Protocol):
    def begin(self, session_id: str, sample_index: np.ndarray, sizes: Sequence[Sequence[int]]) -> None: ...

    def next_node(self, session_id: str) -> dict[str, Any] | None:
        """The node to grow (:meth:`.steps.Task.to_json` form), None when every tree is grown."""
        ...

    def open_node(self, session_id: str, key: NodeKey, totals: np.ndarray) -> tuple[bool, int, list[int]]:
        """Whether the node's split is searched, and the key epoch its indicators are encrypted under."""
        ...

    def node_keys(self, session_id: str, key_epoch: int) -> bytes:
        """The public context of a key epoch the coordinator still holds."""
        ...

    def submit_counts(
        self,
        session_id: str,
        key: NodeKey,
        products: list[bytes],
        mask_sums: np.ndarray,
        bin_weights: np.ndarray,
        task_digest: bytes,
    ) -> None: ...

    def decide(self, session_id: str, key: NodeKey, counts: np.ndarray | None) -> tuple[bool, tuple[int, int] | None]:
        """Whether the node is split, and the active party's own split (feature, bin) if it won (None: a leaf, or a
        passive party's split)."""
        ...

    def partition(self, session_id: str, key: NodeKey, goes_left: np.ndarray) -> None: ...


class PassiveLink(Protocol):
    def begin(self, session_id: str, sample_index: np.ndarray) -> list[int]: ...

    def shard(self, session_id: str) -> tuple[list[int], int, int]:
        """The party's bins per feature, aligned rows and training rows, in its own word."""
        ...

    def node_counts(
        self, session_id: str, task: Mapping[str, Any], indicators: he.WireMatrix, key_epoch: int
    ) -> None: ...


def _tree_link(link: Any) -> Any:
    return link.tree  # the family's link beside the engine's (services/transport/links.py)


def _epoch_keys(
    cached: tuple[int, he.Backend] | None, backend: str, key_epoch: int, fetch: Callable[[int], bytes]
) -> tuple[int, he.Backend]:
    """The public keys of a node's key epoch: ``cached`` if it is that epoch's, else fetched from the coordinator
    (a party never encrypts under keys another party relays)."""
    if cached is not None and cached[0] == key_epoch:
        return cached
    try:
        return key_epoch, he.open_public(backend, fetch(key_epoch))
    except ValueError as exc:
        raise FailedPrecondition(f"the coordinator's keys of epoch {key_epoch}: {exc}") from exc


@dataclass
class TreeActive:
    """The label holder: drives growing node by node; answers its own splits at inference."""

    name: str
    settings: TreeSettings
    n_classes: int
    owner: FeatureOwner | None = None
    keys: tuple[int, he.Backend] | None = None  # the newest node key epoch's public keys (not state: fetched again)
    scores_locally = False

    @property
    def share_width(self) -> int:
        return self.settings.split_columns

    def train_step(self, ctx: ActiveContext, index: np.ndarray) -> None:
        if self.owner is not None:
            raise FailedPrecondition(
                f"a {self.name} is grown once, in one pass over its training rows: train with epochs=1 and the "
                "default batch (every row)"
            )
        # Rows in sample-ID order (common-index order without IDs): the forest's bootstrap draws, by position,
        # then follow the seed and the training rows alone, not PSI's random common order.
        index = np.sort(index)
        if ids := ctx.sample_ids(index):
            index = index[np.argsort(np.asarray(ids, dtype=str), kind="stable")]
        with product_pool.ProductPool() as pool:  # each node's [[Y]] encrypted over every core; gone with the growing
            self._grow(ctx, index, pool)

    def _grow(self, ctx: ActiveContext, index: np.ndarray, pool: product_pool.ProductPool) -> None:
        key_holder: KeyHolderLink = _tree_link(ctx.key_holder)
        passives: dict[str, PassiveLink] = {party: _tree_link(link) for party, link in ctx.passives.items()}
        position = {party: p for p, party in enumerate(passives, start=1)}
        owner = FeatureOwner.fit(ACTIVE, ctx.features(index), self.settings.config)
        labels = LabelHolder(ctx.labels(index), self.n_classes)
        sizes = [owner.bins.sizes, *ctx.each_passive(lambda party, link: link.tree.begin(ctx.session_id, index))]
        key_holder.begin(ctx.session_id, index, sizes)
        self.owner = owner
        config = self.settings.config
        growth = GrowthMirror(config, index.size)
        while (node := key_holder.next_node(ctx.session_id)) is not None:
            task = Task.from_json(node)
            # The label holder's own partition defense (services/models/tree/partitions.py): a node the session keeps
            # from the passive parties names no passive candidate, and every node holds its own rows (growth), so no
            # other node's rows go out under a shown node's key; both before anything of the node leaves.
            if not config.shows_passive(task.tree, node_depth(task.node_id)) and set(task.features) - {ACTIVE}:
                raise FailedPrecondition(
                    f"node {task.key}: the coordinator names passive candidate features at a node this session's "
                    f"partition defense {list(config.partition_defense)} keeps from the passive parties"
                )
            growth.check(task)
            totals = labels.totals(task)
            search, key_epoch, derived = key_holder.open_node(ctx.session_id, task.key, totals)
            if not search:
                growth.decided(task, False)
                continue
            growth.opened(task, totals, derived)  # the stopping rules and the derived parties, checked here
            indicators = labels.indicators(task)
            # A party whose counts the coordinator derives (its parent's minus its left sibling's) is not asked.
            searched = [p for p in passives if position[p] in task.features and position[p] not in derived]
            if searched:
                widest = max(sum(sizes[position[p]][f] for f in task.features[position[p]]) for p in searched)
                fetch = functools.partial(key_holder.node_keys, ctx.session_id)
                self.keys = _epoch_keys(self.keys, ctx.backend.name, key_epoch, fetch)
                keys = self.keys[1]
                over = growth.products_over(task, [position[p] for p in searched])  # the smaller child first
                sent = labels.encrypt(keys, over, widest, pool)
                futures = [ctx.spawn(passives[p].node_counts, ctx.session_id, node, sent, key_epoch) for p in searched]
                for future in futures:
                    future.result()
            for p in passives:  # a derived party is told the node is searched (no [[Y]]): its ApplySplit is due
                if position[p] in derived and position[p] in task.features:
                    passives[p].node_counts(ctx.session_id, node, he.WireMatrix((0, 0), 0, 0, []), key_epoch)
            own = owner.plain_counts(task, indicators) if ACTIVE in task.features else None
            split, mine = key_holder.decide(ctx.session_id, task.key, own)
            goes_left = None if mine is None else owner.apply_split(task, *mine, config.min_samples_leaf)
            growth.decided(task, split, goes_left)
            if goes_left is not None:
                key_holder.partition(ctx.session_id, task.key, goes_left)
        if not growth.done:
            raise FailedPrecondition("the coordinator ended growing before every node of this session was grown")

    def inference_share(self, x: np.ndarray) -> np.ndarray:
        return _shares(self.settings, self.owner, x)

    def released(self, release: Release) -> ReleasedModel:
        """The coordinator's release with this party's own thresholds filled in."""
        try:
            forest = from_tensors(release.tensors, self.settings.config.kind)
        except (KeyError, ValueError) as exc:
            raise FailedPrecondition(f"the coordinator released no readable {self.name}: {exc}") from exc
        own = {} if self.owner is None else self.owner.thresholds()
        for t, tree in enumerate(forest.trees):
            for node in tree.splits():
                if node.owner == ACTIVE:
                    node.threshold = own.get((t, node.node_id))
        return ReleasedModel(self.name, to_tensors(forest, self.settings.config.max_depth))

    def to_state(self) -> State:
        return {}, {"tree": _meta(self.settings, self.n_classes, self.owner)}


@dataclass
class TreePassive:
    """A passive party's bins and the thresholds of the splits it won (they stay here unless released)."""

    name: str
    settings: TreeSettings
    n_classes: int
    owner: FeatureOwner | None = None
    # The node this party last sent products for, with its rows: the coordinator's ApplySplit is answered once for
    # it and only for those rows, so that no one can have it compare other rows or features at will.
    searched: dict[NodeKey, list[int]] = field(default_factory=dict)
    attempts: int = 0  # products made for the node in ``searched``: one, and one retry (MAX_PRODUCT_ATTEMPTS)
    known: KnownRows = field(default_factory=KnownRows)  # rows of recent nodes (ApplySplit at a derived node)
    shard: tuple[int, int] = (0, 0)  # (aligned rows the bins are fitted on, training rows), for the coordinator
    keys: tuple[int, he.Backend] | None = None  # the newest node key epoch's public keys (not state: fetched again)
    pool: product_pool.ProductPool = field(default_factory=product_pool.ProductPool)  # not state; shut at close()
    output_in_the_clear = False

    @property
    def share_width(self) -> int:
        return self.settings.split_columns

    def begin(self, x_shard: np.ndarray, x_train: np.ndarray, aligned_rows: int) -> list[int]:
        """Fit the bins on every row of this party's shard, aligned or not (rows it holds, not rows another party
        names, directly at Begin or through the IDs it brings to PSI: a bin edge fitted on a few chosen rows
        interpolates their values) and keep the training rows' bins."""
        if self.owner is not None:
            raise FailedPrecondition(f"this party's bins are fitted already: a {self.name} is grown once")
        bins = QuantileBins.fit(x_shard, self.settings.config.n_bins)
        self.owner = FeatureOwner(self.settings.party, bins, x_train)
        self.shard = (aligned_rows, x_train.shape[0])
        return self.owner.bins.sizes

    def search(self, node: Mapping[str, Any], indicators: he.WireMatrix) -> tuple[Task, Task]:
        """The node this party is asked products for (it may then be asked to split it, ApplySplit), and the node as
        its products are made: over its own rows, or its smaller right sibling's (KnownRows.products_over)."""
        task = self._task(node)
        if self.settings.party not in task.features:
            raise InvalidArgument(f"node {task.key} has no candidate feature of party {self.settings.party}")
        over = self.known.products_over(task, self.settings.party, indicators.shape[0])
        if over is None or tuple(indicators.shape)[1:] != (encrypted_classes(self.n_classes),):
            rows = " or ".join(map(str, self.known.accepted_rows(task, self.settings.party)))
            raise InvalidArgument(
                f"indicators must be ({rows}, {encrypted_classes(self.n_classes)}): the node's rows, or its smaller "
                f"sibling's where both sides allow it, every class but the last; got {indicators.shape}"
            )
        # Nodes grow one at a time, in (tree, node) order (heap indices breadth first): an earlier node is closed once
        # this one is asked for, so only the latest is kept (a forest's checkpoint, written after every family
        # message, would otherwise hold every node's rows), and products are made only for node keys the session's
        # shape has, at most MAX_PRODUCT_ATTEMPTS times a node and never for an earlier one: whatever the active party
        # names, this party's work is bounded by the config (review 11 F5, review 12 R3; docs/protocol.md, Trees).
        check_searchable(self.settings.config, task)
        last = next(iter(self.searched), None)
        if last is not None and (task.key < last or (task.key == last and self.attempts >= MAX_PRODUCT_ATTEMPTS)):
            raise FailedPrecondition(
                f"node {task.key}: products were made for node {last} ({self.attempts} times); nodes grow in order "
                f"and each gets at most {MAX_PRODUCT_ATTEMPTS} attempts"
            )
        self.attempts = self.attempts + 1 if task.key == last else 1
        self.searched = {task.key: task.rows.tolist()}
        return task, over

    def accepted(self, task: Task) -> Task | None:
        """The coordinator took the node's products (SubmitCounts answered): only now is it recorded as a node this
        party made products for (review 16, F3c: not at :meth:`search`); the right sibling it implies, if any."""
        return self.known.searched(task, self.settings.party)

    def node_products(
        self, keys: he.Backend, task: Task, indicators: he.WireMatrix, session_id: str, key_epoch: int
    ) -> tuple[list[bytes], np.ndarray, np.ndarray, bytes]:
        """For the coordinator: masked [[indicators ⊙ bin indicators]] of the node's candidate features, their mask
        sums (made in this session's process pool), the node's weighted rows per bin and the node's digest."""
        owner = self._owner()
        products, mask_sums = owner.pooled_products(self.pool, keys, indicators, task)
        return products, mask_sums, owner.bin_weights(task), task.digest(session_id, key_epoch)

    def close(self) -> None:
        self.pool.close()  # the session is closed: its product workers go

    def apply_split(self, node: Mapping[str, Any], feature: int, bin_index: int) -> np.ndarray:
        """Keep the split of the coordinator's node; which of its rows go left (no side below min_samples_leaf)."""
        task, owner, party = self._task(node), self._owner(), self.settings.party
        if self.searched.get(task.key) != task.rows.tolist() and not self.known.derived(task, party):
            raise FailedPrecondition(
                f"node {task.key}: a known complement, not opened (no word from the active party)"
                if self.known.complement(task, party)
                else f"node {task.key}: no products of these rows were sent from here, nor of its parent and left "
                "sibling"
            )
        if owner.splits.get(task.key, (feature, bin_index)) != (feature, bin_index):
            raise FailedPrecondition(f"node {task.key} is split already, by another feature or bin")
        # a repeat of the same split: the same partition
        return owner.apply_split(task, feature, bin_index, self.settings.config.min_samples_leaf)

    def opened(self, node: Mapping[str, Any], indicators: he.WireMatrix) -> None:
        """The active party's word that a node whose counts the coordinator derives is searched: a NodeCounts whose
        indicators are absent (shape (0, 0), no ciphertexts), at a node the session's shape has, heavy enough."""
        if tuple(indicators.shape) != (0, 0) or indicators.replicas or indicators.rows_per_ct:
            raise InvalidArgument(
                f"indicators: {indicators.shape} without ciphertexts; the word that a node's counts are derived "
                "carries none (shape (0, 0))"
            )
        task = self._task(node)
        check_searchable(self.settings.config, task)
        self.known.opened(task, self.settings.party)

    def _task(self, node: Mapping[str, Any]) -> Task:
        """A node as a sender named it: distinct training rows, this party's features, sane weights."""
        task, owner = Task.from_json(dict(node)), self._owner()
        n_rows = owner.train_bins.shape[0]  # type: ignore[union-attr]
        rows, weights = task.rows, task.weights
        if rows.size == 0 or rows.min() < 0 or rows.max() >= n_rows or not distinct_rows(rows):
            raise InvalidArgument(f"node {task.key} must name distinct training rows in [0, {n_rows})")
        if weights.shape != rows.shape or not (np.isfinite(weights).all() and weights.min() > 0):
            raise InvalidArgument(f"node {task.key} needs a positive finite weight per row")
        own = task.features.get(self.settings.party, ())
        if any(not 0 <= f < owner.bins.n_features for f in own) or len(set(own)) != len(own):
            raise InvalidArgument(f"node {task.key} names features party {self.settings.party} does not have")
        return task

    def thresholds(self) -> dict[NodeKey, float]:
        return self._owner().thresholds()

    def _owner(self) -> FeatureOwner:
        if self.owner is None or self.owner.train_bins is None:
            raise FailedPrecondition("this party's bins are not fitted: the active party must Begin first")
        return self.owner

    def inference_share(self, x: np.ndarray) -> np.ndarray:
        return _shares(self.settings, self.owner, x)

    def releasable(self) -> dict[str, np.ndarray]:
        return {}  # thresholds are disclosed through DiscloseThresholds, under the parameter-release chain

    def to_state(self) -> State:
        searched = [[*key, rows] for key, rows in self.searched.items()]
        meta = {
            **_meta(self.settings, self.n_classes, self.owner),
            "searched": searched,
            "known": self.known.to_json(),
            "attempts": self.attempts,
            "shard": list(self.shard),
        }
        return {}, {"tree": meta}


@dataclass
class TreeKeyHolder:
    """The coordinator: the Builder (node queue, Gini split choice, skeleton) and the one-answer-per-node key use."""

    name: str
    settings: TreeSettings
    n_classes: int
    n_passive: int
    builder: Builder | None = None
    answered: set[tuple[int, int, int]] = field(default_factory=set)  # (party, tree, node): KeyHolder.answered
    counts: dict[int, np.ndarray] = field(default_factory=dict)  # the current node's opened per-bin counts
    weights: dict[int, np.ndarray] = field(default_factory=dict)  # ... and each passive party's bin weights
    pending: Split | None = None  # the current node's split, until its owner's partition arrives
    epoch: int = 0  # the key epoch the current node's products are decrypted under (its decision charged to it)
    # The current node's products sent in parts, per party: (parts received, products so far).
    arriving: dict[int, tuple[int, list[bytes]]] = field(default_factory=dict)
    histograms: Histograms = field(default_factory=Histograms)  # recent nodes' counts, for subtraction
    derived: tuple[int, ...] = ()  # the passive parties whose counts at the current node are derived, not opened
    smaller: bool = False  # the current node's products may be made over its right sibling (steps.products_over)
    node_digest: tuple[tuple[str, int, NodeKey, int], bytes] | None = None  # the current node's (not state: recomputed)

    @property
    def share_width(self) -> int:
        return self.settings.split_columns

    def begin(self, n_rows: int, sizes: Sequence[Sequence[int]], min_node_rows: int = 1) -> None:
        """Start growing on ``n_rows`` training rows with every party's bins per feature (each party's own word);
        a config whose leaves may hold fewer rows than ``[policy] min_node_rows`` is refused."""
        if self.builder is not None:
            raise FailedPrecondition(f"this session's {self.name} is grown already (once per session)")
        config = self.settings.config
        if config.min_samples_leaf < min_node_rows:
            raise FailedPrecondition(
                f"min_samples_leaf {config.min_samples_leaf} is below this coordinator's [policy] min_node_rows "
                f"{min_node_rows}: the smallest accepted value is {min_node_rows}"
            )
        if len(sizes) != 1 + self.n_passive or any(not s or not 1 <= min(s) <= max(s) <= config.n_bins for s in sizes):
            raise InvalidArgument(
                f"bins per feature must be given for all {1 + self.n_passive} parties, each in [1, n_bins = "
                f"{config.n_bins}]"
            )
        try:
            self.builder = Builder(config, self.n_classes, n_rows, sizes)
        except ValueError as exc:
            raise InvalidArgument(str(exc)) from exc

    def _builder(self) -> Builder:
        if self.builder is None:
            raise FailedPrecondition("growing has not begun (Begin)")
        return self.builder

    def next_node(self) -> dict[str, Any] | None:
        task = self._builder().next_task()
        return None if task is None else task.to_json()

    def current(self, key: NodeKey) -> dict[str, Any]:
        """The node being grown, as the coordinator holds it (what its split's owner partitions)."""
        return self._task(key).to_json()

    def _task(self, key: NodeKey) -> Task:
        task = self._builder().next_task()
        if task is None or task.key != tuple(key):
            raise FailedPrecondition(f"node {tuple(key)} is not the node being grown")
        return task

    def open_node(self, key: NodeKey, totals: np.ndarray) -> bool:
        task = self._task(key)
        if self._builder()._nodes.get(task.key) is not None:
            raise FailedPrecondition(f"node {task.key} is open already")
        self.counts, self.weights, self.pending, self.arriving, self.derived = {}, {}, None, {}, ()
        if not self._builder().open(task, totals):
            return False
        self.histograms.prune(task.key)
        passive = sorted(set(task.features) - {ACTIVE})
        for party in passive:
            if (derived := self.histograms.derive(party, task)) is not None:
                self.counts[party], self.weights[party] = derived
                self.histograms.keep(party, task, *derived)
                self.derived += (party,)
        held = [self.histograms.holds(p, parent_key(task.key), task.features[p]) for p in passive]
        self.smaller = bool(held) and all(held)  # every party's parent counts: either child is the other's less
        return True

    def _over(self, task: Task) -> Task:
        """The current node as the passive parties' products are made for it: its own rows, or its right sibling's
        (queued next) where they are fewer and the parent's counts are held (steps.products_over)."""
        queue = self._builder().queue
        sibling = queue[1] if self.smaller and len(queue) > 1 and queue[1].key[1] == task.node_id + 1 else None
        return products_over(task, sibling)

    def _searched(self, key: NodeKey) -> Task:
        task = self._task(key)
        if task.key not in self._builder()._nodes:
            raise FailedPrecondition(f"node {task.key} is not open (OpenNode first)")
        return task

    def due(self, party: int, key: NodeKey) -> Task:
        """The node ``key`` if a passive party's products are due for it: it is being grown, open and searched with
        a candidate feature of ``party``. Otherwise one refusal, whatever the reason (review 14, F2): which node is
        grown, or whether it is open, is the growth of nodes the session may hide from ``party``."""
        builder = self.builder
        task = None if builder is None else builder.next_task()
        if builder is None or task is None or task.key != tuple(key) or task.key not in builder._nodes:
            task = None
        if task is None or party not in task.features or party in self.derived:
            raise FailedPrecondition(f"party {party} has no products due at node {tuple(key)}")
        return task

    def receive_part(
        self,
        keys: he.Backend,
        party: int,
        key: NodeKey,
        products: list[bytes],
        part: int,
        parts: int,
        task_digest: bytes,
        session_id: str,
    ) -> list[bytes] | None:
        """Part ``part`` of ``parts`` (in order) of a party's products for the current node: every product once the
        last part is in, else None. Never more buffered than the node's own ciphertext count. A part that names the
        node it was made for (``task_digest``; older clients: the last part only) is refused unless it is this one."""
        task = self._over(self.due(party, key))
        if task_digest:
            self._same_node(task, task_digest, session_id)
        width, layout = self._block(keys, party, task)
        done, received = self.arriving.pop(party, (0, []))
        if part != done or parts <= part:
            raise InvalidArgument(f"part {part} of {parts} of node {task.key}'s products: part {done} is due")
        received = received + products
        if len(received) > product_count(task, width, layout, product_parts(keys)):
            raise InvalidArgument(f"more products than node {task.key}'s block of {width} columns has ciphertexts")
        if part + 1 < parts:
            self.arriving[party] = (part + 1, received)
            return None
        return received

    def _block(self, keys: he.Backend, party: int, task: Task) -> tuple[int, he.MatrixLayout]:
        """A party's block width at a node and the indicators' layout, as the coordinator derives them itself."""
        if party not in task.features:
            raise FailedPrecondition(f"party {party} has no candidate feature at node {task.key}")
        builder = self._builder()
        widest = max(builder.width(task, p) for p in task.features if p not in (ACTIVE, *self.derived))
        return builder.width(task, party), indicator_layout(
            task, self.n_classes, widest, keys.slots, product_parts(keys)
        )

    def _same_node(self, task: Task, task_digest: bytes, session_id: str) -> None:
        # Once a node (its every part and its opening compare against it): the JSON of a root's rows takes ~0.1 s.
        named = (session_id, self.epoch, task.key, task.rows.size)  # the rows: this node's own copy, or its sibling's
        if self.node_digest is None or self.node_digest[0] != named:
            self.node_digest = (named, task.digest(session_id, self.epoch))
        if task_digest != self.node_digest[1]:
            raise InvalidArgument(
                f"the products were made for another version of node {task.key}: its rows, multiplicities or "
                f"features differ from the coordinator's, or its session or key epoch ({self.epoch}) does"
            )

    def decision_bits(self, key: NodeKey) -> int:
        """Bits the open node's decision can say when products of a passive party are decrypted for it, else 0."""
        task = self._searched(key)
        return self._builder().decision_bits(task) if any(p != ACTIVE for p in task.features) else 0

    def submit_counts(
        self,
        keys: he.Backend,
        party: int,
        key: NodeKey,
        products: Sequence[bytes],
        mask_sums: np.ndarray,
        bin_weights: np.ndarray,
        task_digest: bytes,
        session_id: str,
    ) -> None:
        """Open a passive party's masked products for the current node: once per (party, node), at the width and
        indicator layout the coordinator derives itself; its bin weights (its own word, checked before anything
        is opened) give the last class's counts (the weights less the others'). Products made for another copy of
        the node (rows or multiplicities the active party changed: review 12, R2; another session) are refused."""
        task = self._searched(key)
        over = self._over(task)
        self._same_node(over, task_digest, session_id)
        width, layout = self._block(keys, party, over)
        opener = KeyHolder(keys)
        opener.answered = self.answered
        counts = opener.open_counts(party, over, width, layout, products, mask_sums, bin_weights)
        weights = np.asarray(bin_weights, dtype=np.float64)
        if over is not task:  # the sibling's counts: this node's are the parent's less those
            counts, weights = self.histograms.less(party, task, counts, weights)
        self.counts[party], self.weights[party] = counts, weights
        self.histograms.keep(party, task, counts, weights)

    def decide(self, key: NodeKey, own: np.ndarray | None) -> Split | None:
        """The node's decision, made once: a repeat (a retry after a failed ApplySplit, a restart) gets the recorded
        one, whatever counts it carries (review 11, F3)."""
        task = self._searched(key)
        if self.pending is not None:
            return self.pending
        missing = [p for p in task.features if p != ACTIVE and p not in self.counts]
        if missing:
            raise FailedPrecondition(f"node {task.key}: no per-bin counts from party {missing[0]} yet")
        counts = dict(self.counts)
        if ACTIVE in task.features:
            if own is None:
                raise InvalidArgument(f"node {task.key} has active candidate features: their counts are due")
            counts[ACTIVE] = own
        self.pending = self._builder().decide(task, counts, self.weights)
        return self.pending

    def apply(self, key: NodeKey, goes_left: np.ndarray, owner: int) -> None:
        task = self._searched(key)
        if self.pending is None or self.pending.owner != owner:
            raise FailedPrecondition(f"node {task.key} has no split of party {owner} to apply")
        self._builder().apply(task, self.pending, goes_left)
        self.counts, self.weights, self.pending = {}, {}, None

    def forest(self) -> Forest:
        return self._builder().forest()

    def column_owners(self) -> np.ndarray:
        """Per inference-share column, the position of the party whose split node it is (−1: no split there): the
        engine takes each column from that party's share alone (TreeFamily.selects_share_columns)."""
        owners = np.full(self.settings.split_columns, -1)
        for t, tree in enumerate(self.forest().trees):
            for node in tree.splits():
                owners[self.settings.column((t, node.node_id))] = node.owner
        return owners

    def scores(self, aggregate: np.ndarray) -> np.ndarray:
        """Route every row by the parties' direction bits, each split node's from its owner's share alone (the
        engine's selection): (n, K) class / vote fractions. A refusal here depends only on the owner's share."""
        bits = np.rint(aggregate)
        if not np.isin(bits, (0.0, 1.0)).all() or np.abs(aggregate - bits).max(initial=0) > 0.25:
            raise InvalidArgument("a party's inference share is not one direction bit per split node it owns")
        forest = self.forest()
        directions: dict[int, dict[NodeKey, np.ndarray]] = {}
        for t, tree in enumerate(forest.trees):
            for node in tree.splits():
                key = (t, node.node_id)
                directions.setdefault(node.owner, {})[key] = bits[:, self.settings.column(key)] == 1  # type: ignore[arg-type]
        return combine(forest, directions, bits.shape[0])

    def released(self, call: ReleaseCall | None = None) -> dict[str, np.ndarray]:
        """The skeleton (owners, features, bins, counts) with the thresholds each passive party discloses through
        ``call`` (it runs the parameter-release chain on its own thresholds); without a call, the skeleton alone."""
        if call is None:
            return self.released_with({})
        links = {p: _tree_link(call.peer(p)) for p in range(1, self.n_passive + 1)}
        return self.released_with({p: link.thresholds(call.session_id, call.specs) for p, link in links.items()})

    def released_with(self, thresholds: Mapping[int, Mapping[NodeKey, float] | None]) -> dict[str, np.ndarray]:
        """The skeleton with the passive thresholds their owners disclosed (None: withheld, and their bins too)."""
        skeleton = self.forest()
        forest = Forest([copy_tree(t) for t in skeleton.trees], skeleton.n_classes, skeleton.kind)
        for t, tree in enumerate(forest.trees):
            for node in tree.splits():
                if node.owner == ACTIVE:
                    continue
                disclosed = thresholds.get(node.owner)  # type: ignore[arg-type]
                if disclosed is None:
                    node.bin = None
                elif (t, node.node_id) not in disclosed:
                    raise FailedPrecondition(f"party {node.owner} disclosed no threshold at {(t, node.node_id)}")
                else:
                    node.threshold = float(disclosed[(t, node.node_id)])
        return to_tensors(forest, self.settings.config.max_depth)

    def to_state(self) -> State:
        meta = {
            "settings": self.settings.to_dict(),
            "n_classes": self.n_classes,
            "n_passive": self.n_passive,
            "answered": sorted(self.answered),
            "counts": {str(p): c.tolist() for p, c in self.counts.items()},
            "weights": {str(p): w.tolist() for p, w in self.weights.items()},
            "pending": None if self.pending is None else list(self.pending.__dict__.values()),
            "epoch": self.epoch,
            "histograms": self.histograms.to_json(),
            "derived": list(self.derived),
            "smaller": self.smaller,
        }
        if self.builder is not None:
            meta["builder"] = json.loads(self.builder.to_state())
            meta["rows"], meta["sizes"] = self.builder.n_rows, self.builder.bin_sizes
        return {}, {"tree": meta}


def _meta(settings: TreeSettings, n_classes: int, owner: FeatureOwner | None) -> dict[str, Any]:
    return {
        "settings": settings.to_dict(),
        "n_classes": n_classes,
        "owner": None if owner is None else owner.to_state().decode(),
    }


def _restore_owner(meta: Mapping[str, Any]) -> tuple[TreeSettings, int, FeatureOwner | None]:
    values = dict(meta["settings"])
    settings = TreeSettings(TreeConfig.from_dict({k: v for k, v in values.items() if k != "party"}), values["party"])
    owner = None if meta["owner"] is None else FeatureOwner.from_state(meta["owner"].encode())
    return settings, meta["n_classes"], owner


# --- the tree family's own messages (proto/vflsec/v1/tree.proto), run by the engines' family_call ---
# At the key holder: the active party grows the trees node by node; each passive party submits its node's counts.
def _begin(trainer: TreeKeyHolder, ctx: KeyHolderContext, sample_index: np.ndarray, bins: list[list[int]]) -> None:
    """Growing starts on the training rows with the active party's bins per feature; each passive party's bins
    and aligned row count come from that party itself (the coordinator runs no PSI: the passive parties' alignment
    is authoritative), so rows never aligned, another party's invented bin counts and a training set below
    ``[policy] min_training_rows`` are refused before anything is grown."""
    index = ctx.check_rows(sample_index)
    if len(index) < ctx.min_training_rows:
        raise InvalidArgument(
            f"{len(index)} training rows; this coordinator's [policy] min_training_rows is {ctx.min_training_rows}"
        )
    if not bins:
        raise InvalidArgument("bins: the active party's bins per feature are due")
    sizes = [list(bins[0])]
    for p in range(1, trainer.n_passive + 1):
        own, _, training = _tree_link(ctx.peer(p)).shard(ctx.session_id)  # rows beyond the alignment: check_rows
        if training != len(index):
            raise FailedPrecondition(
                f"party {p} trains on {training} rows; the training rows named here are {len(index)}"
            )
        if len(bins) > p and list(bins[p]) != list(own):
            raise FailedPrecondition(f"party {p}'s bins per feature are not the ones it reports itself")
        sizes.append(list(own))
    if len(bins) > len(sizes):
        raise InvalidArgument(f"bins for {len(bins)} parties; the session has {len(sizes)}")
    trainer.begin(len(index), sizes, ctx.min_node_rows)
    ctx.trained(index)


def _next_node(trainer: TreeKeyHolder, ctx: KeyHolderContext) -> dict[str, Any] | None:
    """The next node to grow (a task, JSON form), None once every tree is grown."""
    return trainer.next_node()


def _open_node(
    trainer: TreeKeyHolder, ctx: KeyHolderContext, key: NodeKey, totals: np.ndarray
) -> tuple[bool, int, list[int]]:
    """The node's class totals from the active party; whether a split is searched (else it is a leaf), the key
    epoch of its products and the passive parties whose counts are derived (none of their products is due). A
    search that decrypts passive products, or derives counts from decrypted ones, charges the decision's bits to
    the key (rule 2) here, before anything of the node is decrypted."""
    if not trainer.open_node(key, totals):
        return False, trainer.epoch, []
    bits = trainer.decision_bits(key)
    if bits:
        trainer.epoch = ctx.decision(bits)
    return True, trainer.epoch, list(trainer.derived)


def _node_keys(trainer: TreeKeyHolder, ctx: KeyHolderContext, key_epoch: int) -> bytes:
    """The public keys of a key epoch still held (the current node's)."""
    return ctx.public_keys(key_epoch)


def _submit_counts(
    trainer: TreeKeyHolder,
    ctx: KeyHolderContext,
    key: NodeKey,
    products: list[bytes],
    part: int,
    parts: int,
    mask_sums: np.ndarray | None,
    bin_weights: np.ndarray | None = None,
    task_digest: bytes = b"",
) -> None:
    """A passive party's masked per-bin products for the node, in ``parts`` parts (the last carries its mask sums
    and bin weights),
    under the node's key epoch (its decision charged at OpenNode); opened once per party and node. Whether any are
    due is decided first, with one refusal for every node that expects none from the caller (review 14, F2)."""
    trainer.due(ctx.caller, key)
    keys = ctx.held_keys(trainer.epoch)
    received = trainer.receive_part(keys, ctx.caller, key, products, part, max(parts, 1), task_digest, ctx.session_id)
    if received is not None:  # the last part
        if mask_sums is None or bin_weights is None:
            raise InvalidArgument("mask sums and bin weights: the last part of a node's products carries them")
        trainer.submit_counts(keys, ctx.caller, key, received, mask_sums, bin_weights, task_digest, ctx.session_id)


def _decide(trainer: TreeKeyHolder, ctx: KeyHolderContext, key: NodeKey, own: np.ndarray | None) -> Split | None:
    """The node's best split over every party's counts (``own``: the active party's), None for a leaf. A passive
    party's split is applied here: asked by the coordinator, its owner partitions the node's rows and keeps the
    threshold. The split's ``owner`` is a position (0: the active party, 1..P: the passive parties)."""
    split = trainer.decide(key, own)
    if split is not None and split.owner:
        ctx.save()  # the decision is recorded before its owner learns it: a restart repeats it, never makes another
        peer = _tree_link(ctx.peer(split.owner))
        left = peer.apply_split(ctx.session_id, trainer.current(key), split.feature, split.bin)
        trainer.apply(key, left, split.owner)
    return split


def _partition(trainer: TreeKeyHolder, ctx: KeyHolderContext, key: NodeKey, goes_left: np.ndarray) -> None:
    """The active party's partition of the node's rows under its own split (it keeps the threshold)."""
    trainer.apply(key, goes_left, ACTIVE)


# At a passive party: its bins and counts for the active party, its splits and thresholds for the coordinator.
def _fit_bins(trainer: TreePassive, ctx: PassiveContext, sample_index: np.ndarray) -> list[int]:
    """Fit this party's bins on its whole shard (at least ``[policy] min_training_rows`` aligned rows), and keep the
    training rows; the bin count per feature (the bin edges stay here)."""
    if ctx.aligned_rows < ctx.min_training_rows:
        raise FailedPrecondition(
            f"{ctx.aligned_rows} aligned rows; this party's [policy] min_training_rows is {ctx.min_training_rows}"
        )
    if len(sample_index) < ctx.min_training_rows:
        raise InvalidArgument(
            f"{len(sample_index)} training rows; this party's [policy] min_training_rows is {ctx.min_training_rows}"
        )
    if (leaf := trainer.settings.config.min_samples_leaf) < (least := ctx.min_node_rows):  # rule 3: its own policy
        raise FailedPrecondition(f"min_samples_leaf {leaf} is below this party's [policy] min_node_rows {least}")
    features = ctx.features  # a family step has them
    assert features is not None
    assert ctx.shard is not None
    x_train = features(sample_index)
    sizes = trainer.begin(ctx.shard(), x_train, ctx.aligned_rows)
    # to this party's plugins: its training rows in the order the nodes' positions refer to (the label attacks)
    ids = tuple(ctx.sample_ids(sample_index))
    ctx.emit(kinds.TRAINING_DATA, ctx.owner, sample_ids=ids, arrays={"features": x_train}, meta={"tree_rows": True})
    ctx.completed(sample_index, 1)  # the trees grow in the session's one training step (inference shares name it)
    return sizes


def _shard(trainer: TreePassive, ctx: PassiveContext) -> tuple[list[int], int, int]:
    """This party's own word for the coordinator: bins per feature, aligned rows, training rows."""
    owner = trainer._owner()
    return owner.bins.sizes, *trainer.shard


def _node_counts(
    trainer: TreePassive, ctx: PassiveContext, node: Mapping[str, Any], indicators: he.WireMatrix, key_epoch: int
) -> None:
    """Masked per-bin products of the node's encrypted class indicators under its key epoch, made and sent to the
    coordinator outside the session lock: the coordinator may be waiting on this party meanwhile (ApplySplit), and
    this party fetches the epoch's public keys from it (NodeKeys)."""
    if not indicators.ciphertexts:  # the node is searched, its counts derived (histogram subtraction): no products
        trainer.opened(node, indicators)
        return
    task, over = trainer.search(node, indicators)
    link = _tree_link(ctx.key_holder)
    rows = {"rows": np.asarray(task.rows, dtype=np.int64), "weights": np.asarray(task.weights, dtype=float)}
    where = {"tree": task.tree, "node_id": task.node_id, "depth": task.depth}
    ctx.emit(kinds.NODE_ROWS, ctx.owner, arrays=rows, meta=where)  # to this party's plugins: the node's rows

    def accepted() -> None:
        if (sibling := trainer.accepted(task)) is not None:  # its right sibling's rows: the parent's other rows
            implied = {"tree": sibling.tree, "node_id": sibling.node_id, "depth": sibling.depth, "implied": True}
            arrays = {"rows": sibling.rows, "weights": sibling.weights}
            ctx.emit(kinds.NODE_ROWS, ctx.owner, arrays=arrays, meta=implied)

    def send() -> None:
        trainer.keys = _epoch_keys(
            trainer.keys, ctx.backend.name, key_epoch, functools.partial(link.node_keys, ctx.session_id)
        )
        made = trainer.node_products(trainer.keys[1], over, indicators, ctx.session_id, key_epoch)
        link.submit_counts(ctx.session_id, task.key, *made)
        ctx.locked(accepted)  # recorded (and checkpointed) only once the coordinator took the products

    ctx.defer(send)


def _apply_split(
    trainer: TreePassive, ctx: PassiveContext, node: Mapping[str, Any], feature: int, bin_index: int
) -> np.ndarray:
    """The coordinator's choice of this party's split: which of the node's rows go left (the threshold stays)."""
    left = np.asarray(trainer.apply_split(node, feature, bin_index), dtype=np.int64)
    arrays = {"rows": np.asarray(node["rows"], dtype=np.int64), "goes_left": left}
    ctx.emit(kinds.OWN_SPLIT, "coordinator", arrays=arrays, meta={"tree": node["tree"], "node_id": node["node_id"]})
    return left


def _thresholds(trainer: TreePassive, ctx: PassiveContext, specs: list[str]) -> dict[NodeKey, float] | None:
    """This party's thresholds per split node it owns, through the parameter-release chain ``specs``: withheld
    (None) unless the chain asks for them explicitly with ``thresholds`` (luo's PRA / GRN-RF setting) and has no
    ``withhold``."""
    try:
        names = [parse_spec(spec)[0] for spec in specs]
    except ValueError as exc:
        raise InvalidArgument(f"parameter-release steps: {exc}") from exc
    unknown = sorted(set(names) - {"withhold", RELEASE_THRESHOLDS})
    if unknown:
        raise InvalidArgument(f"a tree's thresholds are released whole or withheld; no step {unknown[0]!r}")
    return trainer.thresholds() if RELEASE_THRESHOLDS in names and "withhold" not in names else None


STEPS: Mapping[str, Mapping[str, FamilyStep]] = {
    COORDINATOR: {
        "begin": FamilyStep(_begin, frozenset({ACTIVE_ROLE})),
        # Idempotent: it changes nothing, so it writes no checkpoint (a repeat must cost no rewrite).
        "next_node": FamilyStep(_next_node, frozenset({ACTIVE_ROLE}), checkpoint=False),
        "open_node": FamilyStep(_open_node, frozenset({ACTIVE_ROLE})),
        "node_keys": FamilyStep(_node_keys, frozenset({ACTIVE_ROLE, PASSIVE}), checkpoint=False),
        "submit_counts": FamilyStep(_submit_counts, frozenset({PASSIVE})),
        "decide": FamilyStep(_decide, frozenset({ACTIVE_ROLE})),
        "partition": FamilyStep(_partition, frozenset({ACTIVE_ROLE})),
    },
    PASSIVE: {
        "begin": FamilyStep(_fit_bins, frozenset({ACTIVE_ROLE})),
        "shard": FamilyStep(_shard, frozenset({COORDINATOR}), checkpoint=False),
        "node_counts": FamilyStep(_node_counts, frozenset({ACTIVE_ROLE})),
        "apply_split": FamilyStep(_apply_split, frozenset({COORDINATOR})),
        "thresholds": FamilyStep(_thresholds, frozenset({COORDINATOR})),
    },
}


class TreeFamily:
    """``tree`` (one CART tree) and ``forest`` (a random forest): one family, registered under both names."""

    releases_passive_blocks = False
    # Inference: each split node's bit from its owner's share alone (Coordinator._selected); an additive sum let the
    # active party add 1 in a passive node's column and learn the passive bit from the refusal (issue 27, finding 4).
    selects_share_columns = True
    steps = STEPS

    def __init__(self, name: str) -> None:
        self.name = name

    @staticmethod
    def block_width(n_features: int, *, active: bool) -> int:
        return n_features

    @staticmethod
    def min_batch_size(widths: Iterable[int]) -> int:
        return 1  # no gradient leaves anyone: the per-bin counts stay at the coordinator

    @staticmethod
    def default_batch_size(widths: Iterable[int]) -> int:
        return ONE_STEP

    @staticmethod
    def answers_per_step(widths: Iterable[int], n_classes: int) -> int:
        # The opened per-bin counts never leave the coordinator (only the winning split does); a stand-in as LR's.
        return sum(widths) * max(n_classes - 1, 1)

    def settings(self, values: Mapping[str, Any]) -> TreeSettings:
        return TreeSettings.of(values, self.name)

    def new_active(
        self, n_classes: int, n_features: int, settings: TreeSettings, passive_features: Sequence[int] = ()
    ) -> TreeActive:
        return TreeActive(self.name, TreeSettings(settings.config, ACTIVE), n_classes)

    def restore_active(self, state: State) -> TreeActive:
        return TreeActive(self.name, *_restore_owner(state[1]["tree"]))

    def new_passive(self, n_classes: int, n_features: int, settings: TreeSettings) -> TreePassive:
        if settings.party < 1:
            raise ValueError("a passive party's position must be >= 1")
        return TreePassive(self.name, settings, n_classes)

    def restore_passive(self, state: State) -> TreePassive:
        meta = state[1]["tree"]
        searched = {(t, i): rows for t, i, rows in meta.get("searched", [])}
        shard = tuple(meta.get("shard", (0, 0)))
        return TreePassive(
            self.name,
            *_restore_owner(meta),
            searched=searched,
            known=KnownRows.from_json(meta.get("known", {})),
            attempts=meta.get("attempts", 0),
            shard=shard,  # type: ignore[arg-type]
        )

    def new_key_holder(self, n_classes: int, passive_parties: Sequence[str], settings: TreeSettings) -> TreeKeyHolder:
        return TreeKeyHolder(self.name, TreeSettings(settings.config, ACTIVE), n_classes, len(passive_parties))

    def restore_key_holder(self, state: State) -> TreeKeyHolder:
        meta = state[1]["tree"]
        settings, n_classes, _ = _restore_owner({**meta, "owner": None})
        holder = TreeKeyHolder(self.name, settings, n_classes, meta["n_passive"])
        holder.answered = {tuple(k) for k in meta["answered"]}  # type: ignore[misc]
        holder.counts = {int(p): np.asarray(c) for p, c in meta["counts"].items()}
        holder.weights = {int(p): np.asarray(w) for p, w in meta.get("weights", {}).items()}
        holder.pending = None if meta["pending"] is None else Split(*meta["pending"])
        holder.epoch = meta.get("epoch", 0)
        holder.histograms = Histograms.from_json(meta.get("histograms", []))
        holder.derived = tuple(meta.get("derived", ()))
        holder.smaller = meta.get("smaller", False)
        if "builder" in meta:
            holder.builder = Builder.from_state(
                json.dumps(meta["builder"]).encode(), settings.config, n_classes, meta["rows"], meta["sizes"]
            )
        return holder


TREE = register(TreeFamily("tree"))
FOREST = register(TreeFamily("forest"))
