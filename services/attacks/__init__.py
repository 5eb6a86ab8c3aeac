"""Feature-inference attacks on released models; importing the package registers every attack."""

from . import agnostic, aware, binary, black_box, chebyshev, closed_form, gradient, labelled, trees
from .base import (
    ATTACKS,
    WHITE_BOX_NEEDS,
    Attack,
    NotApplicable,
    Observations,
    Reconstruction,
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
    "aware",
    "binary",
    "black_box",
    "chebyshev",
    "closed_form",
    "gradient",
    "labelled",
    "make_attack",
    "mse",
    "mse_per_feature",
    "register",
    "run_attack",
    "trees",
]
