"""A whole federation on one machine: certificates, per-party data and configs, and the parties themselves
either as separate OS processes (the demo) or as in-process servers (integration tests).

Both use exactly the same config files that ``vflsec serve ROLE --config FILE`` reads.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, get_args

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from vflsec.services.config import dump_toml, load_config
from vflsec.services.data import datasets
from vflsec.services.models import family as families
from vflsec.services.models import lr
from vflsec.services.transport import tls
from vflsec.services.transport.server import peer_channel

# The demo's held-out share of the aligned IDs (stratified, seeded) for the reported accuracy.
TEST_FRACTION = 0.2
# The default batch keeps an epoch to at most this many round trips (plus the floor lr.DEFAULT_BATCH_SIZE).
STEPS_PER_EPOCH = 32
# Epochs 0 (attack's default) asks for ceil(ROW_VISITS / training rows) epochs within [MIN_EPOCHS, MAX_EPOCHS]
# for LR: an epoch's cost grows with its rows (CKKS: every row is encrypted and multiplied), while the logistic
# model converges in a number of passes that falls as the rows grow (accuracy on the training / queried rows
# against the 30th epoch's: Bank, 36k rows, 6 epochs -0.01 / +0.1 pp; Adult, 43k rows, 5 epochs +0.01 / -0.4 pp;
# docs/performance.md, "The attack command"). Tables up to ROW_VISITS / MAX_EPOCHS rows keep the former fixed
# 30; split-NN keeps 30 (not measured), as does early stopping, for which the epochs are a ceiling.
ROW_VISITS = 200_000
MIN_EPOCHS, MAX_EPOCHS = 3, 30
OPTIMIZERS = ("adam", "sgd")
MODELS = ("lr", "splitnn", "tree", "forest")
SHARD_CHUNK_ROWS = 100_000  # rows the dealer copies out of the table at a time
TREE_MODELS = ("tree", "forest")  # grown once, in one pass over the training rows


class SpecError(ValueError):
    """A federation spec the system would refuse; raised before anything is written or started."""


class Stopped(BaseException):
    """SIGTERM or SIGINT reached the launcher (:func:`stop_on_signals`). A BaseException, so no ``except Exception``
    swallows it and click does not turn it into "Aborted!": every ``with`` unwinds, stopping the parties and removing
    the temporary federation folders, and the CLI says so in one line."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.cleaned: list[str] = []  # what unwinding did, for that line
        super().__init__(signal.Signals(signum).name)


_stopping: Stopped | None = None  # set while a stop unwinds: the launchers note what they clean up


def _cleaned(what: str) -> None:
    if _stopping is not None:
        _stopping.cleaned.append(what)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGTERM (what ``timeout``, CI runners, docker and Kubernetes send) and SIGINT raise :class:`Stopped` in the
    main thread; further signals are ignored while the parties stop and the folders go (a second Ctrl-C would
    otherwise leave both half done). The previous handlers come back on exit."""
    global _stopping

    def handler(signum: int, frame: object) -> None:
        global _stopping
        for s in (signal.SIGTERM, signal.SIGINT):
            signal.signal(s, signal.SIG_IGN)
        _stopping = Stopped(signum)
        raise _stopping

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        _stopping = None
        for s, h in previous.items():
            signal.signal(s, h)


@contextlib.contextmanager
def temporary_folder(prefix: str) -> Iterator[Path]:
    """A temporary federation folder, removed on exit, error or :class:`Stopped`: private keys first (the CA's and
    every party's), so an interrupted removal leaves no key behind, then the rest."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        remove_folder(path)
        _cleaned(f"removed {path} (keys first)")


def remove_folder(path: Path) -> None:
    """``path`` and everything in it, the private keys (``*.key``, ``key.pem``) unlinked before anything else."""
    for key in [*path.rglob("*.key"), *path.rglob("key.pem")]:
        key.unlink(missing_ok=True)
    shutil.rmtree(path, ignore_errors=True)


class PartyExited(RuntimeError):
    """A party process that ended before it served (a config or shard it refuses): its log's last lines say why."""

    def __init__(self, party: str, log_file: Path | None, tail: str) -> None:
        self.party, self.log_file, self.tail = party, log_file, tail
        super().__init__(f"{party} exited during start-up" + (f"; the end of {log_file}:\n{tail}" if tail else ""))


def check_release_chains(
    score_release: Sequence[str] = (), param_release: Sequence[str] = (), *, family: str
) -> None:
    """Build both chains as the coordinator will and check them against the session's model ``family`` as its
    OpenSession will: an unknown step, a bad parameter or a step the family does not support fails now."""
    from vflsec.services.defenses.release import ParamReleaseChain, ReleaseConfigError, ScoreReleaseChain

    try:
        ScoreReleaseChain.from_specs(score_release, family=family)
        ParamReleaseChain.from_specs(param_release, family=family)
    except ReleaseConfigError as exc:
        raise SpecError(str(exc)) from exc


def _check_chain(
    what: str, parse: Callable[[Sequence[str]], object], specs: Sequence[str], got: tuple[str, str], where: str
) -> None:
    """Parse a chain of defense specs as its party will at start, refusing it for a model or topology it does not
    act on (``where``: the topology it needs, and why)."""
    model, topology = got
    needed = ("splitnn", where.split(",")[0])
    if got != needed:
        raise SpecError(
            f"{what} applies to --model splitnn --topology {needed[1]} only, where {where.split(',', 1)[1].strip()}; "
            f"got --model {model} --topology {topology}"
        )
    try:
        parse(specs)
    except ValueError as exc:  # PluginError included
        raise SpecError(f"{what} {list(specs)}: {exc}") from exc


def check_embedding_release(specs: Sequence[str], model: str, topology: str) -> None:
    """Parse the passive parties' embedding defenses as each party will at start; they act on split-NN active-top
    only (elsewhere a passive output leaves encrypted), so asking for them with another model is refused."""
    from vflsec.services.defenses.embeddings import EmbeddingChain

    where = "active-top, a passive party's z_p reaches the active party in the clear"
    _check_chain("embedding release", EmbeddingChain.from_specs, specs, (model, topology), where)


def check_gradient_defense(specs: Sequence[str], model: str, topology: str) -> None:
    """Parse the session's gradient defenses as the active party will at CreateSession; they act on the ∂L/∂h that
    split-NN coordinator-top forwards to the passive parties, so another model or topology is refused."""
    from vflsec.services.defenses.gradients import GradientChain

    where = "coordinator-top, the active party forwards ∂L/∂h to the passive parties"
    _check_chain("gradient defense", GradientChain.from_specs, specs, (model, topology), where)


def check_partition_defense(specs: Sequence[str], model: str, max_depth: int = 0) -> None:
    """Parse the session's partition defenses as every party will at CreateSession; they hide tree nodes from the
    passive parties, so another model is refused, and so is a step that hides no node at ``max_depth`` (0: the
    family's default)."""
    from vflsec.services.models.tree.config import TreeConfig
    from vflsec.services.models.tree.partitions import PartitionDefense

    if model not in TREE_MODELS:
        raise SpecError(
            f"partition defense applies to --model tree or forest only, where a passive party sees the rows of every "
            f"node it searches; got --model {model}"
        )
    try:
        PartitionDefense.from_specs(specs, model)
        depth = {"max_depth": max_depth} if max_depth else {}
        build = TreeConfig.forest if model == "forest" else TreeConfig
        build(partition_defense=tuple(specs), **depth)  # type: ignore[operator]
    except ValueError as exc:  # PluginError included
        raise SpecError(f"partition defense {list(specs)}: {exc}") from exc


@functools.lru_cache(maxsize=4)
def _load_dataset(name: str, label: str | None, categorical: str, stamp: tuple[int, int] | None) -> datasets.Dataset:
    """One load per dataset, encoding and file version in a process: every ``replace`` of a spec (the session
    plan, the dealer, the windows) would otherwise parse the file again (1-3 s for Bank). Its arrays are made
    read-only, so no user of the shared copy can change it for the others."""
    ds = datasets.load_dataset(name, label=label, categorical=categorical)
    for array in (ds.ids, ds.X, ds.y):
        array.flags.writeable = False
    return ds


@dataclass(frozen=True)
class FederationSpec:
    """Everything a run asks of a federation, as the CLI collected it: the dealer's split and configs
    (:func:`write_federation`), and the operator's session and training (demo, attack harness, curve).

    One bag from the CLI to the launcher, validated once: value checks here, the bounds that need the split
    (the minimum batch) in :meth:`batch_size_for`, both before any file is written or party started.
    """

    dataset: datasets.Dataset | str  # a loaded dataset, or a name / CSV path loaded on first use (with label)
    n_passive: int = 1
    passive_features: datasets.PassiveFeatures | None = None
    # onehot | ordinal: the loader's; target: the dealer replaces category codes by their mean label on the
    # session's training rows (session_split), before the columns are dealt out.
    encoding: str = "onehot"
    backend: str = "ckks"
    allow_plain: bool = False  # the coordinator also accepts plain sessions (always when backend is plain)
    score_release: Sequence[str] = ()
    param_release: Sequence[str] = ()
    # Every passive party's own [defenses] embedding (split-NN active-top), e.g. ["masquerade:m=16"].
    embedding_release: Sequence[str] = ()
    # The active party's gradient defenses of the session (split-NN coordinator-top), e.g. ["max_norm"]: they travel
    # in the session's settings (SplitNnModel.gradient_defense).
    gradient_defense: Sequence[str] = ()
    # The active party's partition defenses of a tree session, e.g. ["complete_secure:trees=1"]: they travel in the
    # session's settings (TreeModel.partition_defense).
    partition_defense: Sequence[str] = ()
    plugins: Sequence[dict] = ()  # [{"path": "pkg.mod:Factory", "options": {...}}] for the party ``plugins_at``
    plugins_at: str = "active"  # the party that runs ``plugins``: the active party, or a passive one ("passive-1")
    drop_fraction: float = 0.05  # each party misses this share of IDs, so PSI has work to do
    # Min-max ([0, 1]) as the attack papers scale; the demo asks for standard, which trains the LR best.
    scaling: str = "minmax"
    seed: int = 0
    query_policy: dict | None = None  # the coordinator's [policy] table (query_budget, refuse_training_ids, ...)
    checkpoints: bool = True  # session checkpoints in each party's state dir (crash recovery)
    limits: dict | None = None  # every party's [limits] table (e.g. psi_max_ids)
    # The active party's [psi] protocol: "oprf" (OT extension, the default) or "ecdh"; every passive party's
    # [psi] accept (empty: the default, both; ["ecdh"] refuses the OPRF hello).
    psi_protocol: str = "oprf"
    psi_accept: Sequence[str] = ()
    # Loopback with free ports (default), or fixed ports behind host names (compose: hosts are party ids).
    host: str = "127.0.0.1"
    compose_ports: dict[str, int] | None = None
    label: str | None = None  # label column of a CSV dataset
    # The operator's session: what it asks the active party for in CreateSession and Train.
    model: str = "lr"  # the model family: one of MODELS (lr, splitnn, tree, forest)
    topology: str = "coordinator-top"  # split-NN only
    embedding: int = 16  # split-NN: width of every bottom's output
    hidden: tuple[int, ...] = (32,)  # split-NN: the top model's hidden widths
    max_depth: int = 0  # tree / forest: 0 is the family's default (tree 5, forest 3)
    trees: int = 0  # forest: number of trees; 0 is the family's default (100)
    epochs: int = 30
    batch_size: int = 0  # 0: lr.DEFAULT_BATCH_SIZE, raised to the federation's minimum batch
    learning_rate: float = 0.1
    l2: float = 1e-4
    optimizer: str = "adam"
    # The session's split of the aligned IDs (session_split): None holds out TEST_FRACTION (the demo), a count
    # holds out that many for queries (the attack harness); train_rows subsamples the training side.
    queries: int | None = None
    train_rows: int | None = None
    # Early stopping (federation/training.py): > 0 stops when the validation accuracy has not improved for this many
    # epochs; the validation rows (this share of the training side, stratified) are then held out of training.
    early_stopping_patience: int = 0
    validation_fraction: float = 0.2

    def __post_init__(self) -> None:
        from vflsec.services.crypto import he

        for name in ("score_release", "param_release", "embedding_release", "gradient_defense", "partition_defense",
                     "plugins", "psi_accept"):  # frozen
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if isinstance(self.passive_features, list):
            object.__setattr__(self, "passive_features", tuple(self.passive_features))
        if self.backend not in he.BACKENDS:
            raise SpecError(f"backend must be one of {', '.join(sorted(he.BACKENDS))}, got {self.backend!r}")
        if self.encoding not in get_args(datasets.Encoding):
            raise SpecError(f"encoding must be one of {', '.join(get_args(datasets.Encoding))}, got {self.encoding!r}")
        object.__setattr__(self, "hidden", tuple(self.hidden))
        if self.model not in MODELS:
            raise SpecError(f"model must be one of {', '.join(MODELS)}, got {self.model!r}")
        runs = ["active", *(f"passive-{i}" for i in range(1, self.n_passive + 1))]
        if self.plugins_at not in runs:
            raise SpecError(f"plugins_at must be one of {', '.join(runs)}, got {self.plugins_at!r}")
        if self.model == "splitnn":
            from vflsec.services.models.splitnn import TOPOLOGIES, check_backend

            if self.topology not in TOPOLOGIES:
                raise SpecError(f"topology must be one of {', '.join(TOPOLOGIES)}, got {self.topology!r}")
            try:
                check_backend(self.topology, self.backend)
            except ValueError as exc:
                raise SpecError(str(exc)) from exc
        if self.model in TREE_MODELS:
            if self.epochs != 1:
                raise SpecError(
                    f"a {self.model} is grown once over its training rows: epochs must be 1 (got {self.epochs}); "
                    "the smallest and only accepted value is 1"
                )
            if self.batch_size not in (0, families.get(self.model).default_batch_size(())):
                raise SpecError(f"a {self.model} grows on every training row at once: leave the batch size at 0")
            if self.max_depth < 0 or self.trees < 0 or (self.trees and self.model == "tree" and self.trees != 1):
                raise SpecError(f"max_depth and trees must be positive (one tree for a tree), got {self.max_depth}, "
                                f"{self.trees}")  # fmt: skip
        if self.embedding < 1 or any(w < 1 for w in self.hidden):
            raise SpecError(f"split-NN widths must be positive, got embedding {self.embedding}, hidden {self.hidden}")
        if self.optimizer not in OPTIMIZERS:
            raise SpecError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {self.optimizer!r}")
        if not self.l2 >= 0.0:
            raise SpecError(f"l2 must be >= 0, got {self.l2}")
        if self.train_rows is not None and self.train_rows < 1:
            raise SpecError(f"train rows must be at least 1, got {self.train_rows}")
        if self.scaling not in get_args(datasets.ScalerKind):
            raise SpecError(f"scaling must be one of {', '.join(get_args(datasets.ScalerKind))}, got {self.scaling!r}")
        if self.n_passive < 1:
            raise SpecError(f"n_passive must be at least 1, got {self.n_passive}")
        if self.epochs < 0:
            raise SpecError(f"epochs must be 0 (the default rule) or positive, got {self.epochs}")
        if self.early_stopping_patience < 0:
            raise SpecError(f"early stopping patience must be 0 (off) or positive, got {self.early_stopping_patience}")
        if not 0.0 < self.validation_fraction < 1.0:
            raise SpecError(f"validation fraction must lie in (0, 1), got {self.validation_fraction}")
        if self.batch_size < 0:
            raise SpecError(f"batch size must be 0 (the default) or positive, got {self.batch_size}")
        if not self.learning_rate >= 0.0:
            raise SpecError(f"learning rate must be >= 0, got {self.learning_rate}")
        if not 0.0 <= self.drop_fraction < 1.0:
            raise SpecError(f"drop fraction must lie in [0, 1), got {self.drop_fraction}")
        check_release_chains(self.score_release, self.param_release, family=self.model)
        if self.embedding_release:
            check_embedding_release(self.embedding_release, self.model, self.topology)
        if self.gradient_defense:
            check_gradient_defense(self.gradient_defense, self.model, self.topology)
        if self.partition_defense:
            check_partition_defense(self.partition_defense, self.model, self.max_depth)

    @property
    def name(self) -> str:
        """The dataset as the user named it (reports keep this spelling)."""
        return self.dataset if isinstance(self.dataset, str) else self.dataset.name

    @cached_property
    def data(self) -> datasets.Dataset:
        if not isinstance(self.dataset, str):
            return self.dataset
        try:
            coded = "onehot" if self.encoding == "onehot" else "ordinal"  # target: codes first (dealt_data)
            path = Path(self.dataset)
            stamp = (path.stat().st_mtime_ns, path.stat().st_size) if path.is_file() else None
            return _load_dataset(self.dataset, self.label, coded, stamp)
        except (ValueError, OSError) as exc:
            raise SpecError(f"dataset {self.dataset!r}: {exc}") from exc

    @cached_property
    def split(self) -> datasets.VerticalSplit:
        try:
            return datasets.split_columns(
                self.data.feature_names, self.n_passive, passive_features=self.passive_features, seed=self.seed
            )
        except (ValueError, TypeError, KeyError) as exc:
            why = exc.args[0] if isinstance(exc, KeyError) else exc  # an unknown column: its message, unquoted
            raise SpecError(f"passive features {self.passive_features!r} on {self.name}: {why}") from exc

    @cached_property
    def party_rows(self) -> list[np.ndarray]:
        """The rows of the dataset the dealer gives each data party (active first): each misses a seeded share."""
        return datasets.overlapping_rows(self.data.n_samples, 1 + self.n_passive, self.drop_fraction, self.seed)

    def id_sets(self) -> list[np.ndarray]:
        """The IDs of :attr:`party_rows`."""
        return [self.data.ids[rows] for rows in self.party_rows]

    def session_sets(self, common: Sequence[str], labels: np.ndarray) -> tuple[list[str], list[str], list[str]]:
        """The session's training, validation and held-out IDs of the aligned set: the one choice that the
        dealer's target encoding, the demo and the attack harness share. Independent of the order PSI returns.
        The validation rows (early stopping only; else none) come out of the training side, before
        ``train_rows`` subsamples it."""
        order = np.argsort(np.asarray(common).astype(str), kind="stable")
        ids, labels = np.asarray(common).astype(str)[order], np.asarray(labels)[order]
        if self.queries is None:
            train, held = (list(s) for s in datasets.train_test_split_ids(ids, labels, TEST_FRACTION, self.seed))
        else:
            shuffled = list(ids[np.random.default_rng(self.seed).permutation(len(ids))])
            n_query, _ = self.queries_for(len(shuffled))
            # The queried rows never train the model (scored and attacked in-sample they would flatter both).
            held, train = shuffled[:n_query], shuffled[n_query:]
        validation: list[str] = []
        if self.early_stopping_patience:
            label_of = dict(zip(ids.tolist(), labels.tolist(), strict=True))
            kept, held_back = datasets.train_test_split_ids(
                train, [label_of[i] for i in train], self.validation_fraction, self.seed
            )
            train, validation = list(kept), list(held_back)
        if self.train_rows is not None and self.train_rows < len(train):
            keep = np.random.default_rng(self.seed).permutation(len(train))[: self.train_rows]
            train = [train[i] for i in sorted(keep)]
        return train, validation, held

    def queries_for(self, n_aligned: int) -> tuple[int, str]:
        """How many of ``n_aligned`` rows are queried (held out of training) and one line saying why: the requested
        ``queries``, shrunk to half the rows when more would leave fewer training rows than queried ones."""
        wanted = self.queries if self.queries is not None else n_aligned
        most = n_aligned // 2
        if wanted <= most:
            return wanted, f"{wanted} queried, held out of the {n_aligned} aligned rows"
        return most, (
            f"{most} queried, not the {wanted} asked: the {n_aligned} aligned rows give half to training "
            "(queried rows are held out of training; at most half are queried)"
        )

    def session_split(self, common: Sequence[str], labels: np.ndarray) -> tuple[list[str], list[str]]:
        """The training and held-out IDs of :meth:`session_sets`."""
        train, _, held = self.session_sets(common, labels)
        return train, held

    @cached_property
    def dealt_rows(self) -> np.ndarray:
        """The rows every data party was dealt (positions, so no ID is looked up): what alignment will find."""
        return functools.reduce(np.intersect1d, self.party_rows)

    def dealt_common(self) -> np.ndarray:
        """The IDs of :attr:`dealt_rows`."""
        return self.data.ids[self.dealt_rows]

    def dealt_sets(self) -> tuple[list[str], list[str], list[str]]:
        """:meth:`session_sets` of :meth:`dealt_common`."""
        return self.session_sets(self.dealt_common(), self.data.y[self.dealt_rows])

    def dealt_split(self) -> tuple[list[str], list[str]]:
        """:meth:`session_split` of :meth:`dealt_common`."""
        train, _, held = self.dealt_sets()
        return train, held

    def dealt_data(self) -> datasets.Dataset:
        """The dataset as the dealer deals it. With target encoding the dealer, who sees the labels (the papers'
        setting), fits each category's mean label on the session's training rows among the aligned IDs."""
        ds = self.data
        if self.encoding != "target":
            return ds
        train, _ = self.dealt_split()
        return datasets.target_encode(ds, datasets.select_ids(ds.ids, train))

    def batch_size_for(self, widths: Sequence[int], n_rows: int | None = None) -> tuple[int, str]:
        """The batch size the session asks for and one line saying why. The default is
        max(lr.DEFAULT_BATCH_SIZE, ceil(n_rows / STEPS_PER_EPOCH)) for ``n_rows`` training rows, raised to the
        coordinator's minimum batch (lr.min_batch_size); an explicit size below the minimum is refused."""
        family = families.get(self.model)
        if self.model in TREE_MODELS:
            return family.default_batch_size(widths), "every training row at once (trees grow in one pass)"
        smallest = family.min_batch_size(widths)
        base = lr.DEFAULT_BATCH_SIZE if self.model == "lr" else family.default_batch_size(widths)
        if self.batch_size:
            if self.batch_size < smallest:
                raise SpecError(
                    f"batch size {self.batch_size} is below the federation's minimum batch {smallest} (2 x the "
                    f"widest block, {max(widths)} columns); the smallest accepted value is {smallest}"
                )
            return self.batch_size, f"as requested; minimum {smallest}"
        by_rows = math.ceil(n_rows / STEPS_PER_EPOCH) if n_rows else 0
        wanted = max(base, by_rows)
        batch = max(wanted, smallest)
        rule = (
            f"default {wanted} (= {n_rows} training rows / {STEPS_PER_EPOCH} steps per epoch)"
            if by_rows > base
            else f"default {base}"
        )
        raised = "" if batch == wanted else " raised to the minimum batch (2 x the widest block)"
        return batch, f"{rule}{raised}; minimum {smallest}"

    def epochs_for(self, n_rows: int) -> tuple[int, str]:
        """The epochs the session trains and one line saying why (epochs 0: the default rule, see ROW_VISITS)."""
        if self.epochs:
            return self.epochs, "as requested"
        if self.model != "lr" or self.early_stopping_patience:
            why = "split-NN" if self.model != "lr" else "a ceiling for early stopping"
            return MAX_EPOCHS, f"default {MAX_EPOCHS} ({why})"
        epochs = min(MAX_EPOCHS, max(MIN_EPOCHS, math.ceil(ROW_VISITS / max(n_rows, 1))))
        rule = f"min({MAX_EPOCHS}, max({MIN_EPOCHS}, {ROW_VISITS:,} / {n_rows} training rows))"
        return epochs, f"default {epochs} = {rule}"

    def session_options(self) -> dict[str, Any]:
        """The training configuration the operator asks the active party for (``Operator.create_session``)."""
        options: dict[str, Any] = {
            "optimizer": self.optimizer,
            "learning_rate": self.learning_rate,
            "l2": self.l2,
            "batch_size": self.batch_size,
            "seed": self.seed,
        }
        if self.model in TREE_MODELS:
            options["family"] = self.model
            options["settings"] = {"max_depth": self.max_depth or None, "n_trees": self.trees or None}
            if self.partition_defense:
                options["settings"]["partition_defense"] = list(self.partition_defense)
        if self.model == "splitnn":
            options["family"] = "splitnn"
            options["settings"] = {
                "topology": self.topology,
                "embedding": self.embedding,
                "top_hidden": list(self.hidden),
            }
            if self.gradient_defense:
                options["settings"]["gradient_defense"] = list(self.gradient_defense)
        return options

    def scaled_peak(self, ds: datasets.Dataset | None = None) -> float:
        """The largest |x| a data party's columns reach after its own ``scaling`` of its shard (of ``ds``, default
        :meth:`dealt_data`), as the parties will compute it at start-up; each refuses one beyond
        ``he.FEATURE_BOUND`` (the masks hide no more). Column by column: the scaling is, and no shard is copied."""
        ds = self.dealt_data() if ds is None else ds
        peak = 0.0
        for rows, columns in zip(self.party_rows, self.split.parties, strict=True):
            for j in ds.column_indices(columns) if len(rows) else ():
                column = ds.X[rows, j][:, None]
                peak = max(peak, float(np.abs(datasets.Scaler.fit(column, self.scaling).transform(column)).max()))
        return peak

    @property
    def widths(self) -> list[int]:
        """Block widths of the dealt split as the coordinator counts them (the active block with its bias)."""
        return [len(self.split.active) + 1, *(len(p) for p in self.split.passive)]


    @property
    def allows_plain(self) -> bool:
        return self.allow_plain or self.backend == "plain"


# Fixed ports of the compose deployment (docker-compose.yml publishes the same).
COMPOSE_BASE_PORT = 50051


def compose_ports(n_passive: int) -> dict[str, int]:
    parties = ["coordinator", "active", *[f"passive-{i}" for i in range(1, n_passive + 1)]]
    return {party: COMPOSE_BASE_PORT + i for i, party in enumerate(parties)}


@dataclass
class FederationLayout:
    """Folder per party (config.toml, data.csv, tls/), the operator's folder, and the CA in certs/."""

    workdir: Path
    configs: dict[str, Path]  # party id -> config file
    addresses: dict[str, str]  # as the operator on this host reaches them
    split: datasets.VerticalSplit

    @property
    def passive_parties(self) -> list[str]:
        return [p for p in self.configs if p.startswith("passive")]

    def tls(self, party: str) -> tls.TlsFiles:
        folder = self.workdir / party / "tls"
        return tls.TlsFiles.from_dir(folder)

    def operator_channel(
        self, max_message_bytes: int = 256 * 1024 * 1024, *, aio: bool = False
    ) -> grpc.Channel | grpc.aio.Channel:
        return peer_channel(self.addresses["active"], "active", self.tls("operator"), max_message_bytes, aio=aio)

    @classmethod
    def load(cls, workdir: Path) -> FederationLayout:
        """Re-open a layout written by :func:`write_federation` (addresses as its configs say)."""
        configs = {p.parent.name: p for p in sorted(workdir.glob("*/config.toml"))}
        addresses = {party: load_config(path).listen for party, path in configs.items()}
        split = datasets.VerticalSplit.from_dict(json.loads((workdir / "split.json").read_text()))
        return cls(workdir, configs, addresses, split)


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def write_federation(
    spec: FederationSpec, workdir: Path, on_rows: Callable[[int], None] | None = None
) -> FederationLayout:
    """Certificates, one data file and one config per party, ready for ``vflsec serve``; ``on_rows`` hears of
    each chunk of shard rows written."""
    split = spec.split
    spec.batch_size_for(spec.widths)  # an explicit batch below the bound fails here, before anything is written
    from vflsec.services.crypto import he

    ds = spec.dealt_data()
    if (peak := spec.scaled_peak(ds)) > he.FEATURE_BOUND:  # the parties would refuse to start on it
        raise SpecError(
            f"features after {spec.scaling} scaling reach |x| = {peak:.4g}; parties refuse |x| > "
            f"{he.FEATURE_BOUND:g} (the gradient masks hide no more): scale min-max (--scaling minmax)"
        )
    workdir.mkdir(parents=True, exist_ok=True)
    parties = ["coordinator", "active", *[f"passive-{i}" for i in range(1, spec.n_passive + 1)]]
    if spec.compose_ports is None:
        ports = dict(zip(parties, free_ports(len(parties), spec.host), strict=True))
        listen = {p: f"{spec.host}:{ports[p]}" for p in parties}
        reach = dict(listen)
    else:
        ports = spec.compose_ports
        listen = {p: f"0.0.0.0:{ports[p]}" for p in parties}
        reach = {p: f"{p}:{ports[p]}" for p in parties}
    # The dealer's CA; each party's key is made in its own tls/ folder (never copied), its CSR signed here.
    ca = tls.CertificateAuthority.load_or_create(workdir / "certs")
    # Each passive party answers risk forecasts to its own operator only (services/engines/passive.py).
    passive_operators = [f"operator-{p}" for p in parties if p.startswith("passive")]
    columns = dict(zip(parties[1:], split.parties, strict=True))
    configs: dict[str, Path] = {}
    # Plain hides nothing: the coordinator runs it, and a passive party joins it, only when this spec asks for it.
    backends = ["ckks", "plain"] if spec.allows_plain else ["ckks"]
    for party in parties:
        folder = workdir / party
        folder.mkdir(exist_ok=True)
        tls.issue_into(ca, party, folder / "tls", hosts=[spec.host])
        raw: dict = {
            "role": tls.role_of(party),
            "party_id": party,
            "listen": listen[party],
            "tls": {"ca": "tls/ca.pem", "cert": "tls/cert.pem", "key": "tls/key.pem"},
        }
        if spec.limits:
            raw["limits"] = dict(spec.limits)
        if spec.checkpoints:
            # Session checkpoints (a restarted party resumes its sessions); compose mounts a writable volume
            # at /state, beside the read-only party folder.
            raw["state"] = {"dir": "/state" if spec.compose_ports else "state"}
        if party == "coordinator":
            raw["peers"] = {p: reach[p] for p in parties if p.startswith("passive")}
            raw["release"] = {"scores": list(spec.score_release), "params": list(spec.param_release)}
            raw["policy"] = {"allowed_backends": backends, **(spec.query_policy or {})}
            # The widths the parties agreed on (the split dealt here): the coordinator refuses any other.
            raw["schema"] = {p: len(columns[p]) for p in parties[1:]}
        else:
            rows = spec.party_rows[parties.index(party) - 1]
            is_active = party == "active"
            at = ds.column_indices(columns[party])
            # Chunk by chunk: the dealer never holds a whole shard beside the table.
            def chunks(rows: np.ndarray = rows, at: np.ndarray = at, is_active: bool = is_active) -> Iterator[tuple]:
                for part in np.array_split(rows, max(1, math.ceil(len(rows) / SHARD_CHUNK_ROWS))):
                    yield ds.ids[part], ds.X[np.ix_(part, at)], ds.y[part] if is_active else None
                    if on_rows is not None:
                        on_rows(len(part))

            class_names = ds.class_names if is_active else None
            datasets.write_party_csv_chunks(folder / "data.csv", columns[party], chunks(), class_names)
            raw["data"] = {"path": "data.csv", "scaling": spec.scaling}
            if is_active:
                raw["psi"] = {"protocol": spec.psi_protocol}
            else:
                if spec.psi_accept:
                    raw["psi"] = {"accept": list(spec.psi_accept)}
                raw["operator"] = f"operator-{party}"
                raw["policy"] = {"allowed_backends": backends}
                if spec.embedding_release:
                    raw["defenses"] = {"embedding": list(spec.embedding_release)}
            raw["peers"] = {p: reach[p] for p in parties if p != party and (is_active or p == "coordinator")}
            if party == spec.plugins_at and spec.plugins:
                raw["plugins"] = [dict(p) for p in spec.plugins]
        configs[party] = folder / "config.toml"
        configs[party].write_text(dump_toml(raw))
    for operator in ("operator", *passive_operators):
        tls.issue_into(ca, operator, workdir / operator / "tls", hosts=[spec.host])
    (workdir / "split.json").write_text(json.dumps(split.to_dict()))
    local = {p: f"{'127.0.0.1' if spec.compose_ports else spec.host}:{ports[p]}" for p in parties}
    return FederationLayout(workdir, configs, local, split)


def wait_for(
    channel: grpc.Channel,
    party: str,
    timeout: float,
    alive: Callable[[], bool] | None = None,
    log_file: Path | None = None,
) -> None:
    """Poll a party's gRPC health service until it is SERVING. A party that exits first fails with the last lines
    of its ``log_file`` (a bad config or shard stops a party at start with a message meant for its operator)."""
    stub = health_pb2_grpc.HealthStub(channel)
    deadline = time.monotonic() + timeout
    while True:
        if alive is not None and not alive():
            raise PartyExited(party, log_file, _last_lines(log_file))
        try:
            if (
                stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0).status
                == health_pb2.HealthCheckResponse.SERVING
            ):
                return
        except grpc.RpcError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{party} not healthy after {timeout:.0f} s")
        time.sleep(0.1)


def _last_lines(log_file: Path | None, count: int = 3) -> str:
    try:
        lines = [line for line in log_file.read_text(errors="replace").splitlines() if line.strip()] if log_file else []
    except OSError:
        return ""
    return "\n".join(lines[-count:])


def wait_healthy(
    layout: FederationLayout,
    timeout: float = 60.0,
    processes: dict[str, subprocess.Popen] | None = None,
    on_ready: Callable[[str], None] | None = None,
    log_dir: Path | None = None,
) -> None:
    """Every party SERVING, checked over mTLS as the operator; a party process that dies fails fast, with the end of
    its log (``log_dir/<party>.log``)."""
    for party, address in layout.addresses.items():
        alive = (lambda p=processes[party]: p.poll() is None) if processes else None
        log_file = log_dir / f"{party}.log" if log_dir is not None else None
        with peer_channel(address, party, layout.tls("operator"), 4 * 1024 * 1024) as channel:
            wait_for(channel, party, timeout, alive, log_file)
        if on_ready is not None:
            on_ready(party)


@dataclass
class ProcessFederation:
    """Every party as its own ``vflsec serve`` process, with its output in ``log_dir/<party>.log``."""

    layout: FederationLayout
    log_dir: Path
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)

    def start(self, party: str) -> subprocess.Popen:
        role = tls.role_of(party)
        log = (self.log_dir / f"{party}.log").open("a")
        self.processes[party] = subprocess.Popen(
            [sys.executable, "-m", "vflsec.client.cli", "serve", role, "--config", str(self.layout.configs[party])],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        return self.processes[party]

    def kill(self, party: str) -> None:
        """SIGKILL: no clean shutdown, exactly what a crash looks like to the others."""
        proc = self.processes[party]
        proc.kill()
        proc.wait()

    def restart(self, party: str, timeout: float = 60.0) -> None:
        self.start(party)
        with peer_channel(self.layout.addresses[party], party, self.layout.tls("operator"), 4 << 20) as channel:
            alive = lambda: self.processes[party].poll() is None  # noqa: E731
            wait_for(channel, party, timeout, alive, self.log_dir / f"{party}.log")

    def stop(self, timeout: float = 10.0) -> None:
        for proc in self.processes.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        end = time.monotonic() + timeout
        for proc in self.processes.values():
            try:
                proc.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# Passive parties first: the coordinator and the active party dial them.
_START_ORDER = ("passive", "coordinator", "active")


@contextlib.contextmanager
def run_processes(
    layout: FederationLayout,
    log_dir: Path | None = None,
    timeout: float = 60.0,
    on_ready: Callable[[str], None] | None = None,
) -> Iterator[ProcessFederation]:
    """Each party as its own ``vflsec serve`` process; all are stopped on exit, error or Ctrl-C. ``timeout``:
    how long a party may take to load its data and report SERVING; ``on_ready`` hears of each that does."""
    fed = ProcessFederation(layout, log_dir or layout.workdir / "logs")
    fed.log_dir.mkdir(parents=True, exist_ok=True)
    try:
        for role in _START_ORDER:
            for party in layout.configs:
                if tls.role_of(party) == role:
                    fed.start(party)
        wait_healthy(layout, timeout, processes=fed.processes, on_ready=on_ready, log_dir=fed.log_dir)
        yield fed
    finally:
        fed.stop()
        _cleaned(f"stopped {len(fed.processes)} party processes")


@contextlib.contextmanager
def run_in_process(layout: FederationLayout, on_ready: Callable[[str], None] | None = None) -> Iterator[dict]:
    """Each party as a real gRPC server on loopback inside this process (tests); yields party -> Party."""
    from vflsec.services.app import start_party

    started: dict = {}
    try:
        for role in _START_ORDER:
            for party, config in layout.configs.items():
                if tls.role_of(party) == role:
                    started[party] = start_party(load_config(config, role))
                    if on_ready is not None:
                        on_ready(party)
        yield started
    finally:
        for party in reversed(list(started)):
            started[party].stop()
