"""Output activations shared by the families and the rooms that read their scores (score defenses): not a family,
so importing it ties no module to one (tests/unit/test_layering.py)."""

from __future__ import annotations

import numpy as np


def sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # overflow-free form of 1/(1+e^-z)


def softmax(z: np.ndarray) -> np.ndarray:
    """Row-wise softmax (rows are samples)."""
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)
