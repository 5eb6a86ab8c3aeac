"""Issue 27's split-NN findings, replayed against a live federation (loopback gRPC, mTLS, real CKKS).

1. TopStep was a decryption oracle: the active party sent crafted [[h]] of honest form for 8,192 rows (E = 1) and got
   N functionals of the training key from one step. Now the engine charges every decrypted slot to the key's budget
   (N/4, one key per split-NN step) and refuses a step above it before decrypting; a ciphertext under a foreign key or
   values of 1e9 fall outside the range an honest h has; labels must be classes (0.5 is refused, not truncated).
2. active-top: the passive bottom's initial weights came from the seed the active party chose, so z_p = X_p W_pᵀ of the
   first batch gave X_p exactly; and PlainForward at step 0, before any training, returned every aligned row. Now
   every module starts from its holder's OS entropy, and step 0 is answered only after FinishTraining.
Lead: a passive party knew the session seed, hence the coordinator's initial top model: gone with rule 1.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import numpy as np
import pytest

from tests.integration.conftest import Federation
from tests.security.conftest import federation
from vflsec.services.crypto import he
from vflsec.services.models.splitnn.modules import build_bottom, build_top
from vflsec.services.models.splitnn.trainers import SplitNNSettings
from vflsec.services.transport import wire
from vflsec.services.transport.tensors import from_tensor, to_tensor
from vflsec.v1 import coordinator_pb2, coordinator_pb2_grpc, passive_pb2, splitnn_pb2, splitnn_pb2_grpc

SEED = 7  # the session seed the active party chooses (and every party receives)


@pytest.fixture(scope="module")
def fed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Federation]:
    with federation(tmp_path_factory.mktemp("oracles"), dataset="breast_cancer", n_passive=1, allow_plain=True) as f:
        yield f


def _session(fed: Federation, backend: str, **settings: object) -> tuple[str, list[str]]:
    info = fed.operator.create_session(backend, family="splitnn", settings=settings, batch_size=32, seed=SEED)
    return info.session_id, fed.operator.align(info.session_id)


def _widths(fed: Federation, sid: str) -> dict[str, int]:
    engine = fed.parties["active"].engine
    s = engine.sessions[sid]
    return dict(engine._widths(s))


class _Attacker:
    """The active party's own certificate, talking to the coordinator as a deviating client would."""

    def __init__(self, fed: Federation, sid: str, channel: grpc.Channel) -> None:
        self.sid, self.widths = sid, _widths(fed, sid)
        self.coordinator = coordinator_pb2_grpc.CoordinatorStub(channel)
        self.splitnn = splitnn_pb2_grpc.SplitNnCoordinatorStub(channel)

    def keys(self, step: int) -> he.Backend:
        context = self.coordinator.GetTrainingContext(
            coordinator_pb2.TrainingContextRequest(session_id=self.sid, step=step)
        )
        return he.open_public("ckks", context.data)

    def top_step(
        self, step: int, h: he.EncryptedMatrix, keys: he.Backend, labels: np.ndarray, rows: list[int] | None = None
    ) -> object:
        return self.splitnn.TopStep(
            splitnn_pb2.TopStepRequest(
                session_id=self.sid, step=step, sample_index=list(range(h.shape[0])) if rows is None else rows,
                embedding=wire.to_message(keys, h), labels=to_tensor(labels), widths=self.widths,
            )
        )


def _decryptions(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Slots the coordinator's CKKS keys decrypt from now on (one entry per ciphertext)."""
    opened: list[int] = []
    decrypt = he.CkksBackend._decrypt

    def watched(self, ct):  # type: ignore[no-untyped-def]
        out = decrypt(self, ct)
        opened.append(len(out))
        return out

    monkeypatch.setattr(he.CkksBackend, "_decrypt", watched)
    return opened


def test_one_topstep_cannot_open_more_than_a_quarter_of_the_key(fed: Federation, monkeypatch) -> None:
    e = 8  # breast_cancer aligns 569 rows: 300 of them at E = 8 are more slots than a key's budget
    sid, _ = _session(fed, "ckks", embedding=e, top_hidden=[4])
    opened = _decryptions(monkeypatch)
    with fed.channel("active", "coordinator") as channel:
        attacker = _Attacker(fed, sid, channel)
        keys = attacker.keys(1)
        # The review's probe: 8,192 rows (E = 1), two full ciphertexts of honest form: rows no one aligned.
        crafted = he.encrypt_matrix(keys, np.zeros((2 * keys.slots, 1)))
        with pytest.raises(grpc.RpcError) as refused:
            attacker.top_step(1, crafted, keys, np.zeros(2 * keys.slots))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "never aligned" in refused.value.details()
        over = he.encrypt_matrix(keys, np.zeros((300, e)))  # aligned rows, 2,400 slots
        with pytest.raises(grpc.RpcError) as refused:
            attacker.top_step(1, over, keys, np.zeros(300))
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "decryption budget" in refused.value.details()
        assert opened == []  # nothing was decrypted
        # At most N/4 slots under one key: the step is answered, and the next step runs under a new key.
        n = he.KEY_BUDGET // e
        reply = attacker.top_step(1, he.encrypt_matrix(keys, np.zeros((n, e))), keys, np.zeros(n))
        assert from_tensor(reply.gradient, "gradient").shape == (n, e)
        assert sum(opened) == he.KEY_BUDGET
        assert attacker.keys(2).public_context() != keys.public_context()
        s = fed.parties["coordinator"].engine.session(sid)
        assert s.rotation == 1 and max(s.spent.values()) <= he.KEY_BUDGET


def test_topstep_refuses_foreign_keys_huge_values_and_fractional_labels(fed: Federation, monkeypatch) -> None:
    sid, _ = _session(fed, "ckks", embedding=4, top_hidden=[4])
    with fed.channel("active", "coordinator") as channel:
        attacker = _Attacker(fed, sid, channel)
        keys = attacker.keys(1)
        n = 16
        honest = he.encrypt_matrix(keys, np.zeros((n, 4)))
        opened = _decryptions(monkeypatch)
        with pytest.raises(grpc.RpcError) as refused:  # 0.5 would have been class 0
            attacker.top_step(1, honest, keys, np.full(n, 0.5))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "integer" in refused.value.details()
        assert opened == []  # checked before anything is decrypted
        foreign = he.make_keyholder("ckks")  # the attacker's own keys, of the session's parameters
        for h, what in (
            (he.encrypt_matrix(foreign, np.zeros((n, 4))), "a foreign key"),
            (he.encrypt_matrix(keys, np.full((n, 4), 1e9)), "values of 1e9"),
        ):
            with pytest.raises(grpc.RpcError) as refused:
                attacker.top_step(1, h, keys, np.zeros(n))
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, what
            assert "outside" in refused.value.details(), what
        # Finding 6: rows the passive parties never aligned (the engine's bound, every family's: AlignedRows).
        opened.clear()
        with pytest.raises(grpc.RpcError) as refused:
            attacker.top_step(1, honest, keys, np.zeros(n), rows=[*range(n - 1), 10_000])
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "row 10000 was never aligned" in refused.value.details()
        assert opened == []
        s = fed.parties["coordinator"].engine.session(sid)
        assert s.last_step == 0  # the top model never trained on them
        attacker.top_step(1, honest, keys, np.zeros(n))  # and the session goes on


def test_active_top_first_batch_and_step_zero_reveal_no_passive_feature(fed: Federation) -> None:
    sid, _ = _session(fed, "plain", topology="active-top")
    passive = fed.parties["passive-1"].engine
    s = passive.sessions[sid]
    rows = np.arange(32)
    x = passive._features(s, rows)  # the passive party's own rows, as its bottom reads them
    with fed.channel("active", "passive-1") as channel:
        stub = splitnn_pb2_grpc.SplitNnPassiveStub(channel)
        # Step 0 (inference) before any training: refused, where it used to return every aligned row's z_p.
        with pytest.raises(grpc.RpcError) as refused:
            stub.PlainForward(passive_pb2.ForwardRequest(session_id=sid, step=0, sample_index=rows.tolist()))
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        # The first training batch's z_p, solved with the bottom the session seed would have built.
        z = from_tensor(
            stub.PlainForward(passive_pb2.ForwardRequest(session_id=sid, step=1, sample_index=rows.tolist())), "z"
        )
    settings = SplitNNSettings.from_dict({**s.trainer.settings.to_dict()})
    config = settings.view(x.shape[1], 2)
    guessed = build_bottom(config, 1, SEED)[0]  # what the attacker computes from the seed it chose
    weight = guessed.weight.detach().numpy()
    bias = 0.0 if guessed.bias is None else guessed.bias.detach().numpy()
    solved = np.linalg.lstsq(weight, (z - bias).T, rcond=None)[0].T
    blind = np.mean((x - x.mean(axis=0)) ** 2)  # knowing only the column means
    assert np.mean((solved - x) ** 2) > 0.5 * blind  # was 2.5e-14 with the seed's weights
    actual = s.trainer.bottom.module[0].weight.detach().numpy()
    assert not np.allclose(actual, weight)


def test_no_party_can_compute_another_partys_initial_weights_from_the_seed(fed: Federation) -> None:
    sid, _ = _session(fed, "ckks", embedding=4, top_hidden=[4])
    top = fed.parties["coordinator"].engine.session(sid).trainer.head.module
    settings = fed.parties["coordinator"].engine.session(sid).trainer.settings
    guessed = build_top(settings.view(1, 2), SEED)
    for ours, theirs in zip(top.parameters(), guessed.parameters(), strict=True):
        assert not np.allclose(ours.detach().numpy(), theirs.detach().numpy())
    # Two sessions of the same seed start from different top models and bottoms.
    other, _ = _session(fed, "ckks", embedding=4, top_hidden=[4])
    again = fed.parties["coordinator"].engine.session(other).trainer.head.module
    assert not np.allclose(next(top.parameters()).detach().numpy(), next(again.parameters()).detach().numpy())
    bottoms = [fed.parties["passive-1"].engine.sessions[i].trainer.bottom.module for i in (sid, other)]
    assert not np.allclose(*(next(b.parameters()).detach().numpy() for b in bottoms))


def test_the_batch_follows_the_key_budget(fed: Federation) -> None:
    """batch x E <= N/4: an explicit larger batch is refused at creation naming the largest accepted value, and the
    default follows the bound (it never trips the engine's refusal mid-training)."""
    with pytest.raises(grpc.RpcError) as refused:
        fed.operator.create_session("ckks", family="splitnn", settings={"embedding": 16}, batch_size=256)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "the largest accepted value is 128" in refused.value.details()
    info = fed.operator.create_session("ckks", family="splitnn", settings={"embedding": 32, "top_hidden": [4]})
    assert fed.parties["active"].engine.sessions[info.session_id].training.batch_size == he.KEY_BUDGET // 32
