"""Finding 1: release noise was predictable (the coordinator seeded it from the config ``seed``).

Probe: the active party rebuilt the Gaussian noise from ``SeedSequence(0)`` — the seed ``vflsec prepare``, compose
and the demo wrote into every config — and recovered the raw scores to 3.6e-10. Now every release-time draw
reads OS entropy: two federations with identical configs release different noise, and the rebuilt stream is
no closer to the raw scores than the noise itself.
"""

from __future__ import annotations

import numpy as np

from tests.security.conftest import federation
from vflsec.services.data import datasets
from vflsec.services.defenses.scores import gaussian_sigma
from vflsec.services.models import lr

CHAIN = "gaussian:epsilon=1"
SIGMA = float(gaussian_sigma(1.0, 1e-5, 0.1))


def _raw_scores(fed, session_id: str, ids: list[str]) -> np.ndarray:
    """Ground truth (the test sees every party's data): the model's undisturbed [1 - p, p] for ``ids``."""
    model = fed.operator.fetch_model(session_id)  # the parameter chain is empty: the whole model is released
    z = model.bias.copy()
    for party, weights in (("active", model.active_weights), *model.passive.items()):
        data = fed.parties[party].engine.data
        rows = datasets.select_ids(np.asarray([str(i) for i in data.ids]), ids)
        z = z + data.X[rows] @ weights.T
    return lr.confidence_scores(z)


def _release(tmp_path, name: str) -> tuple[np.ndarray, np.ndarray, dict]:
    spec = {"dataset": "breast_cancer", "n_passive": 1, "score_release": [CHAIN], "allow_plain": True}
    with federation(tmp_path / name, **spec) as fed:
        info = fed.operator.create_session("plain", batch_size=64, seed=0)
        common = sorted(fed.operator.align(info.session_id))
        train, query = common[:256], common[256:356]
        list(fed.operator.train(info.session_id, train, 2))
        released = fed.operator.predict(info.session_id, query).scores
        raw = _raw_scores(fed, info.session_id, query)
        _, meta = fed.parties["coordinator"].engine.sessions[info.session_id].to_state()
    return released, raw, meta


def test_identical_configs_release_unpredictable_noise(tmp_path) -> None:
    (released_a, raw_a, meta), (released_b, raw_b, _) = _release(tmp_path, "a"), _release(tmp_path, "b")
    # Same configs, same seeds, the exact plain backend: the two models and their raw scores are identical...
    np.testing.assert_allclose(raw_a, raw_b, atol=1e-12)
    # ...but the released noise is not, and it has the advertised size.
    noise_a, noise_b = released_a - raw_a, released_b - raw_b
    assert np.abs(noise_a - noise_b).min() > 0
    for noise in (noise_a, noise_b):
        assert 0.7 * SIGMA < noise.std() < 1.3 * SIGMA
    # The probe: rebuild the stream from every seed a config or a default could have held.
    for seed in (0, 1, None):
        seeds = np.random.SeedSequence(seed)
        rebuilt = np.random.default_rng(seeds.spawn(1)[0]).normal(0.0, SIGMA, size=released_a.shape)
        recovered = released_a - rebuilt
        assert np.abs(recovered - raw_a).mean() > 0.5 * SIGMA  # no better than not subtracting anything
    # No RNG state is checkpointed that could replay the noise after a restart.
    assert "rng" not in meta
