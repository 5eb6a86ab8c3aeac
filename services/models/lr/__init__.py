"""Logistic regression (binary sigmoid and K-class softmax): the LR family's maths."""

from vflsec.services.models.lr.maths import (
    BATCH_MARGIN_FACTOR,
    DEFAULT_BATCH_SIZE,
    BlockOptimizer,
    OptimizerConfig,
    batches,
    confidence_scores,
    default_batch_size,
    link,
    min_batch_size,
    n_logits,
    sigmoid,
    softmax,
    softmax_layout,
    targets,
)
from vflsec.services.models.lr.system import RANK_RTOL, PassiveSystem, difference_operator

__all__ = [
    "BATCH_MARGIN_FACTOR",
    "DEFAULT_BATCH_SIZE",
    "RANK_RTOL",
    "BlockOptimizer",
    "OptimizerConfig",
    "PassiveSystem",
    "batches",
    "confidence_scores",
    "default_batch_size",
    "difference_operator",
    "link",
    "min_batch_size",
    "n_logits",
    "sigmoid",
    "softmax",
    "softmax_layout",
    "targets",
]
