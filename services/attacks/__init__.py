"""Feature-inference attacks on released models and label-inference attacks on received gradients; importing the
package registers every attack."""

from . import agnostic, aware, binary, black_box, chebyshev, closed_form, gradient, labelled, labels, trees
from .base import (
    ATTACKS,
    WHITE_BOX_NEEDS,
    Attack,
    NotApplicable,
    Observations,
    Reconstruction,
    auc,
    make_attack,
    mse,
    mse_per_feature,
    register,
    run_attack,
)

__all__ = [
    "ATTACKS",
    "WHITE_BOX_NEEDS",
    "Attack",
    "NotApplicable",
    "Observations",
    "Reconstruction",
    "agnostic",
    "auc",
    "aware",
    "binary",
    "black_box",
    "chebyshev",
    "closed_form",
    "gradient",
    "labelled",
    "labels",
    "make_attack",
    "mse",
    "mse_per_feature",
    "register",
    "run_attack",
    "trees",
]
