"""Black-box attack with one passive feature (rassouli §VI): only the signs of ω and b are needed.

With d_p = 1 every released score gives v_i = ω X_i + b with ω = (D W_pas) unknown and b the unknown
passive-independent offset. Over N predictions min X_i → 0 and max X_i → 1 in probability (Lemma 2), so
the extreme observations pin the affine map down:

* case 1 (b = 0, e.g. the bias is disclosed and subtracted): X̂_i = v_i / v_M, M = argmax |v_i|;
* case 2 (ωb > 0): |v| grows with X, so X̂ = (|v| − min|v|) / (max|v| − min|v|) — rassouli's
  1 / (1 − α_i) written in closed form;
* case 3.1 (ωb < 0, all v_i of one sign): |v| shrinks with X — the same map reversed;
* case 3.2 (ωb < 0, mixed signs): the two orientations are indistinguishable, and the MSE-optimal mixture of
  the two mirrored estimates is ½ (rassouli §VI-C-2), which is returned.

The empirical MSE converges in probability to 0 with N in cases 1, 2 and 3.1.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from vflsec.services.models.lr import difference_operator

from .base import Attack, NotApplicable, Observations, Reconstruction, register
from .linear import log_ratios

SignRelation = Literal["same", "opposite"]


class SignOnly(Attack):
    """``sign_relation`` is the adversary's only knowledge about ω and b: "same" (ωb > 0) or "opposite".

    If the bias is released (and ``use_bias``), subtracting it leaves v = ωX, i.e. case 1, whatever the hint.
    """

    needs = frozenset({"scores", "w_active"})
    families = frozenset({"lr"})

    def __init__(self, sign_relation: SignRelation = "same", use_bias: bool = True) -> None:
        if sign_relation not in ("same", "opposite"):
            raise ValueError(f"sign_relation must be 'same' or 'opposite', got {sign_relation!r}")
        self.sign_relation = sign_relation
        self.use_bias = use_bias

    def reconstruct(self, obs: Observations) -> Reconstruction:
        if obs.d_passive != 1:
            raise NotApplicable(f"sign_only needs exactly one passive feature, got d_p = {obs.d_passive}")
        assert obs.scores is not None and obs.w_active is not None
        if obs.n_samples < 2:
            raise NotApplicable("sign_only needs at least two predictions")
        dop = difference_operator(obs.k_logits, obs.n_classes)
        v_all = log_ratios(obs.scores) - np.asarray(obs.x_active, float) @ (dop @ obs.w_active).T
        zero_offset = self.use_bias and obs.bias is not None
        if zero_offset:
            v_all = v_all - dop @ obs.bias
        # Each equation row carries the same X with its own ω_m; the row with the widest spread is the one
        # least affected by round-off or score defenses.
        row = int(np.argmax(np.ptp(v_all, axis=0)))
        v = v_all[:, row]
        x_hat, case = (self._ratio(v), "1") if zero_offset else self._affine(v)
        return Reconstruction(x_passive=x_hat[:, None], meta={"case": case, "equation_row": row})

    @staticmethod
    def _ratio(v: np.ndarray) -> np.ndarray:
        v_max = v[np.argmax(np.abs(v))]
        return v / v_max if v_max != 0 else np.full_like(v, 0.5)

    def _affine(self, v: np.ndarray) -> tuple[np.ndarray, str]:
        magnitude = np.abs(v)
        spread = np.ptp(magnitude)
        if spread == 0:
            return np.full_like(v, 0.5), "degenerate"
        scaled = (magnitude - magnitude.min()) / spread
        if self.sign_relation == "same":
            return scaled, "2"
        if np.all(v > 0) or np.all(v < 0):
            return 1.0 - scaled, "3.1"
        return np.full_like(v, 0.5), "3.2"


register("sign_only", SignOnly)
