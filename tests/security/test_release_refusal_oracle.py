"""Rule 4 at inference (found live): ReleaseScores refused a query whose decrypted sum left ±2^23 (half the share-mask
bound). An owner that adds 2^23 − c to its own share then learned from the refusal alone whether the row's logit
(its own part, which it knows, plus the passive part) exceeds c: one bit of the passive logit per query, outside the
score-release chain. The outcome of a query must not depend on the passive value: both probes are answered alike."""

from __future__ import annotations

import numpy as np

from tests.security.conftest import federation

HALF_MASK_BOUND = 2.0**23


def test_a_shifted_own_share_reads_no_passive_bit_from_the_outcome(tmp_path) -> None:
    with federation(tmp_path / "fed", dataset="wine", n_passive=1, passive_features=3) as fed:
        info = fed.operator.create_session("ckks", seed=0)
        sid = info.session_id
        common = fed.operator.align(sid)
        list(fed.operator.train(sid, common[:100], 2))
        active, passive = fed.parties["active"].engine, fed.parties["passive-1"].engine
        s_a, s_p = active.session(sid), passive.session(sid)
        row = common[120]
        i = s_a.index_of[row]
        z = (  # the row's true logit of class 0: the owner's part plus the passive part
            active.data.X[s_a.rows[i]] @ s_a.trainer.weights[0] + s_a.trainer.bias[0]
            + passive.data.X[s_p.rows[i]] @ s_p.trainer.weights[0]
        )
        honest = s_a.trainer.inference_share

        def probe(c: float) -> tuple[str, np.ndarray | None]:
            """The attack: the owner's share of class 0 shifted by 2^23 − c; the outcome and what was released."""

            def crafted(x: np.ndarray) -> np.ndarray:
                share = honest(x)
                share[:, 0] += HALF_MASK_BOUND - c
                return share

            s_a.trainer.inference_share = crafted
            try:
                return "released", fed.operator.predict(sid, [row]).scores
            except Exception as exc:  # the refusal is the oracle
                return f"refused: {exc}", None
            finally:
                s_a.trainer.inference_share = honest

        below, above = probe(z - 1.0), probe(z + 1.0)  # c below the logit, then above it
        assert below[0] == above[0] == "released", (below[0], above[0])
        np.testing.assert_array_equal(below[1], above[1])  # the same released scores: nothing told them apart
        # Both queries were spent: the budget counts every admitted row, answered or not.
        assert fed.parties["coordinator"].engine.scored[active.party_id] == 2
