"""Regression: CKKS training failed on an all-zero feature block once the training keys had rotated.

Reported: `vflsec attack --dataset digits --passive-features 0.4 --epochs 10 --seed 1 --predictions 300
--attacks esa` stopped at step 22 with INVALID_ARGUMENT "a product decrypts outside the masked range". Cause:
the parties made their masked products with the session's public context (epoch 0) while δ was encrypted under
the step's epoch key. Products are ct x pt, key-agnostic, except for a feature block that is all zero in a chunk
(digits' last passive group held only pixel_7_7, zero in all 78 rows of that batch): TenSEAL's zero plaintext is
replaced by a fresh encryption of zero (he.CkksBackend._mul_plain), made under epoch 0's key, which decrypts under
epoch 7's to ~8e19 in each of its 3 900 slots. Now both parties make their products under the step's epoch keys.

Since session 22 every LR product sum starts from an encryption of zero under the party's key
(he.CkksBackend.masked_sum), so an all-zero block is no longer special; a product under the wrong key still shows in
the model's comparison with the plain backend's. Here every step opens a new epoch ([limits] key_rotation_steps = 1,
so epoch 0 is never a training epoch) and
both parties hold an all-zero product in every step (under CKKS a product carries two feature groups, both zero
here); before the fix the first Backward was refused.
"""

from __future__ import annotations

import numpy as np

from vflsec.client.federation.launcher import FederationSpec, run_in_process, write_federation
from vflsec.client.federation.operator import Operator
from vflsec.services.crypto import he, masking
from vflsec.services.data import datasets
from vflsec.services.models.lr import trainers as lr_trainers

ZEROS = 40  # leading all-zero columns at each party: the first product (two replica groups) of both blocks is zero
INFORMATIVE = 3
# R = 8 over two chunks of δ, one product of two groups adding both (masking.gradient_fold); at 128-320 rows one
# product would carry every column (R = 22, two groups of it, 44 columns)
BATCH = 768
EPOCHS = 4


def _dataset() -> datasets.Dataset:
    rng = np.random.default_rng(7)
    n = 2100  # 2 batches of training rows after the 25 % test split
    informative = rng.uniform(size=(n, 2 * INFORMATIVE))
    zeros = np.zeros((n, ZEROS))
    X = np.hstack([zeros, informative[:, :INFORMATIVE], zeros, informative[:, INFORMATIVE:]])
    names = [f"a_zero{i}" for i in range(ZEROS)] + [f"a{i}" for i in range(INFORMATIVE)]
    names += [f"p_zero{i}" for i in range(ZEROS)] + [f"p{i}" for i in range(INFORMATIVE)]
    y = (informative.sum(axis=1) > INFORMATIVE).astype(int)
    return datasets.Dataset("zero_blocks", np.arange(n).astype(str), X, y, names, ["low", "high"])


def _train(operator: Operator, backend: str, ds: datasets.Dataset) -> tuple[str, list[str], list[str], list[int]]:
    info = operator.create_session(backend, learning_rate=0.1, batch_size=BATCH, seed=1)
    widths = [info.n_active_features + 1, *dict(info.passive_features).values()]
    common = operator.align(info.session_id)
    common = sorted(common)  # PSI returns the common IDs in its own order: both sessions train the same batches
    labels = ds.y[datasets.select_ids(ds.ids, common)]
    train_ids, test_ids = datasets.train_test_split_ids(np.asarray(common), labels, 0.25, seed=0)
    progress = list(operator.train(info.session_id, list(train_ids)[: 2 * BATCH], EPOCHS))  # 2 full batches
    assert progress[-1].done and progress[-1].step == 2 * EPOCHS
    return info.session_id, list(test_ids), widths


def test_products_of_all_zero_blocks_are_made_under_the_steps_epoch_key(tmp_path) -> None:
    ds = _dataset()
    passive = [f"p_zero{i}" for i in range(ZEROS)] + [f"p{i}" for i in range(INFORMATIVE)]
    spec = FederationSpec(ds, passive_features=passive, allow_plain=True, limits={"key_rotation_steps": 1})
    layout = write_federation(spec, tmp_path)
    with run_in_process(layout) as parties, layout.operator_channel() as channel:
        operator = Operator(channel)
        session, test_ids, widths = _train(operator, "ckks", ds)  # refused at its first Backward before the fix
        assert widths == [ZEROS + INFORMATIVE + 1, ZEROS + INFORMATIVE]
        # The premise: both parties' products begin with one whose two replica groups are all zero, in every step,
        # and every step runs under a new key (epoch s at step s: the session's epoch-0 context is never the key).
        replicas = lr_trainers.gradient_replicas(he.make_keyholder("ckks"), BATCH, 1, max(widths))
        assert (
            2 * replicas <= ZEROS
            and masking.gradient_fold(he.MatrixLayout.for_matrix((BATCH, 1), replicas, he.SLOTS)) == 2
        )
        assert parties["coordinator"].engine.sessions[session].rotation == 1
        plain_session, _, _ = _train(operator, "plain", ds)
        # The gradients came back right: the same batches train the same model as the plain backend. Compared on
        # the informative columns and the scores: Adam turns the flooding noise on the zero columns' (zero)
        # gradients into steps of up to the learning rate, but those weights multiply zeros.
        ckks, plain = operator.fetch_model(session), operator.fetch_model(plain_session)
        for c, p in (
            (ckks.active_weights[:, ZEROS:], plain.active_weights[:, ZEROS:]),
            (ckks.passive["passive-1"][:, ZEROS:], plain.passive["passive-1"][:, ZEROS:]),
            (ckks.bias, plain.bias),
        ):
            np.testing.assert_allclose(c, p, atol=0.03 * np.abs(p).max())  # measured 0.003
        ckks_scores = operator.predict(session, test_ids).scores
        plain_scores = operator.predict(plain_session, test_ids).scores
        np.testing.assert_allclose(ckks_scores, plain_scores, atol=5e-3)  # measured 3e-4
