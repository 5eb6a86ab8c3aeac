"""Tree partition defenses: which nodes' training rows a passive party may be shown. They rule the tree family's
growth (``TreeConfig.shows_passive``), so they live with it: models import no defenses.

A passive party computes a node's encrypted per-bin counts over the node's rows, so every node it searches tells it
which training rows reached that node; the partitions carry the labels (ID2Graph, model completion: docs/attacks.md).
A node a step hides is grown from the active party's features alone: no passive party is asked for it, so none sees
its rows (nor, below it, its children's). The label holder chooses the steps per session (``TreeModel.
partition_defense``, every party sees the specs: Kerckhoffs); the coordinator names no passive candidate feature at a
hidden node (:func:`vflsec.services.models.tree.steps.candidate_features`) and the active party, which would send the
rows, refuses a task that does (``TreeActive``).

* ``complete_secure`` — FATE's SecureBoost complete-secure mode (``complete_secure``, FATE 2: the number of trees grown
  from the guest's features only; SecretFlow SGB's ``first_tree_with_label_holder_feature``): the first ``trees``
  trees are the active party's alone.
* ``passive_depth`` — FATE 1.x's layered mode seen from the passive side (hosts grow the first ``host_depth`` levels,
  the guest the rest on its own features): passive parties are searched only at nodes above ``depth``, so a passive
  party sees the rows of at most 2^(depth−1) disjoint nodes per tree (its own split at depth − 1 gives it one level
  more, from its own feature).

Every step is a plug-in of :data:`PARTITION_STEPS` (services/registry.py); the steps of a session combine by "and":
a node is shown only if every step shows it. Nothing here draws randomness.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from vflsec.services.registry import Plugin, Registry

__all__ = ["PARTITION_STEPS", "CompleteSecure", "PartitionDefense", "PartitionStep", "PassiveDepth"]

PARTITION_STEPS: Registry[PartitionStep] = Registry("partition defense step")
TREES = frozenset({"tree", "forest"})


class PartitionStep(Plugin):
    """One rule of which nodes the passive parties search (and so see the rows of). Parameters are public."""

    families = TREES

    def shows(self, tree: int, depth: int) -> bool:
        """Whether passive parties are asked for node at ``depth`` (root 0) of tree ``tree`` (0-based)."""
        return True

    def public_params(self) -> dict[str, str]:
        return {key: str(value) for key, value in self.get_params().items()}


def _positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


@PARTITION_STEPS.register("complete_secure")
class CompleteSecure(PartitionStep):
    """The first ``trees`` trees are grown from the active party's features alone (FATE's complete-secure mode)."""

    def __init__(self, trees: int = 1) -> None:
        _positive("trees", trees)
        self.trees = trees

    def shows(self, tree: int, depth: int) -> bool:
        return tree >= self.trees


@PARTITION_STEPS.register("passive_depth")
class PassiveDepth(PartitionStep):
    """Passive parties are searched only at nodes of depth < ``depth`` (root: depth 0); deeper nodes are grown from the
    active party's features alone."""

    def __init__(self, depth: int = 2) -> None:
        _positive("depth", depth)
        self.depth = depth

    def shows(self, tree: int, depth: int) -> bool:
        return depth < self.depth


@dataclass(frozen=True)
class PartitionDefense:
    """A session's partition steps (none: every node is shown, the undefended protocol)."""

    steps: tuple[PartitionStep, ...] = field(default_factory=tuple)

    @classmethod
    def from_specs(cls, specs: Sequence[str], family: str = "tree") -> PartitionDefense:
        return cls(tuple(PARTITION_STEPS.parse(spec, family=family) for spec in specs))

    def shows(self, tree: int, depth: int) -> bool:
        return all(step.shows(tree, depth) for step in self.steps)

    def describe(self) -> list[tuple[str, dict[str, str]]]:
        return [(step.name, step.public_params()) for step in self.steps]
