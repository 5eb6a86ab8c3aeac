"""Decision trees and random forests with HE split finding: config, per-party bins, the plain tree structure and
its released views, per-party protocol steps, the scikit-learn reference and an in-process federation. No
transport here; the engines wire :mod:`.steps` to their RPCs."""

from .binning import QuantileBins
from .config import KINDS, TreeConfig
from .reference import TreeData, accuracy, central_votes, fit_bins
from .simulate import LocalFederation, TreeRun, simulate
from .steps import Builder, FeatureOwner, KeyHolder, LabelHolder, Split, Task, best_split, combine, full_tree
from .structure import RELEASE_SETTINGS, Forest, Node, Tree, release, release_forest

__all__ = [
    "KINDS",
    "RELEASE_SETTINGS",
    "Builder",
    "FeatureOwner",
    "Forest",
    "KeyHolder",
    "LabelHolder",
    "LocalFederation",
    "Node",
    "QuantileBins",
    "Split",
    "Task",
    "Tree",
    "TreeConfig",
    "TreeData",
    "TreeRun",
    "accuracy",
    "best_split",
    "central_votes",
    "combine",
    "fit_bins",
    "full_tree",
    "release",
    "release_forest",
    "simulate",
]
