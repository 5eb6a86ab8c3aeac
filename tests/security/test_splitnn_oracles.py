"""Issue 27's split-NN findings, replayed against a live federation (loopback gRPC, mTLS, real CKKS).

1. TopStep was a decryption oracle: the active party sent crafted [[h]] of honest form for 8,192 rows (E = 1) and got
   N functionals of the training key from one step. Now nothing of a training step is decrypted: each passive party
   sends h_p + r_p straight to the coordinator, the owner sends h_a − Σ r_p, and the coordinator adds the shares in
   Z_2^64 (services/crypto/ring_mask.py). A crafted share is clipped, never refused (rule 4: the range refusal read one
   bit of Σ h_p per step); labels must be classes (0.5 is refused, not truncated); rows must be aligned.
2. active-top: the passive bottom's initial weights came from the seed the active party chose, so z_p = X_p W_pᵀ of the
   first batch gave X_p exactly; and PlainForward at step 0, before any training, returned every aligned row. Now
   every module starts from its holder's OS entropy, and step 0 is answered only after FinishTraining.
Lead: a passive party knew the session seed, hence the coordinator's initial top model: gone with rule 1.
Review 10 (live, of the masked sums): a pad reused when a step's rows were computed twice (F2), a refusal on h_p's
range (F3) and empty rows answered INTERNAL (F5) are closed; the owner's probing of Σ h_p through its own share (F1)
is a documented residual, replayed here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import torch

from tests.integration.conftest import Federation
from tests.security.conftest import federation
from vflsec.services.crypto import he, ring_mask
from vflsec.services.models.splitnn.modules import build_bottom, build_top
from vflsec.services.models.splitnn.trainers import SplitNNSettings
from vflsec.services.transport.tensors import from_tensor, to_tensor
from vflsec.v1 import passive_pb2, passive_pb2_grpc, splitnn_pb2, splitnn_pb2_grpc

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
    """The active party's own certificate, talking to the coordinator and the passive party as a deviating client
    would; it holds what the owner holds, the passive party's embedding-mask key among it."""

    def __init__(self, fed: Federation, sid: str, coordinator: grpc.Channel, passive: grpc.Channel) -> None:
        self.sid, self.widths = sid, _widths(fed, sid)
        self.mask_key = fed.parties["active"].engine.sessions[sid].share_mask_keys["passive-1"]
        self.splitnn = splitnn_pb2_grpc.SplitNnCoordinatorStub(coordinator)
        self.passive = splitnn_pb2_grpc.SplitNnPassiveStub(passive)
        self.backward = passive_pb2_grpc.PassiveStub(passive).Backward

    def send_embedding(self, step: int, rows: list[int]) -> None:
        request = passive_pb2.ForwardRequest(session_id=self.sid, step=step, sample_index=rows)
        self.nonce = self.passive.SendEmbedding(request).nonce

    def step_back(self, step: int, rows: list[int], gradient: Any) -> None:
        """∂L/∂h to the passive party, as the owner ends a step."""
        request = passive_pb2.BackwardRequest(session_id=self.sid, step=step, sample_index=rows, gradient=gradient)
        self.backward(request)

    def top_step(self, step: int, words: np.ndarray, labels: np.ndarray, rows: list[int] | None = None) -> Any:
        return self.splitnn.TopStep(
            splitnn_pb2.TopStepRequest(
                session_id=self.sid, step=step, sample_index=list(range(len(words))) if rows is None else rows,
                share=ring_mask.to_bytes(words), labels=to_tensor(labels), widths=self.widths,
            )
        )

    def unmasked(self, step: int, rows: list[int], h_a: np.ndarray) -> np.ndarray:
        """The owner's honest share of h_a: the passive party's mask taken out of the sum."""
        mask = ring_mask.embedding_mask(self.mask_key, self.sid, step, self.nonce, np.asarray(rows), h_a.shape[1])
        return ring_mask.encode(h_a) - mask


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


def test_topstep_decrypts_nothing_whatever_the_owner_sends(fed: Federation, monkeypatch) -> None:
    """The review's probe (crafted input for 8,192 rows, E = 1) and crafted shares of aligned rows: no slot of anything
    is decrypted in training, so no step answers a functional of any key; training runs without a key."""
    sid, common = _session(fed, "ckks", embedding=1, top_hidden=[4])
    opened = _decryptions(monkeypatch)
    list(fed.operator.train(sid, common[:256], 1))  # 8 honest steps of 32 rows
    with fed.channel("active", "coordinator") as owner, fed.channel("active", "passive-1") as passive:
        attacker = _Attacker(fed, sid, owner, passive)
        with pytest.raises(grpc.RpcError) as refused:  # 8,192 rows no one aligned
            attacker.top_step(9, np.zeros((8192, 1), np.uint64), np.zeros(8192))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "never aligned" in refused.value.details()
        rows = list(range(300))
        with pytest.raises(grpc.RpcError) as refused:  # no passive share for the step: nothing to sum
            attacker.top_step(9, np.zeros((300, 1), np.uint64), np.zeros(300), rows)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "SendEmbedding" in refused.value.details()
        attacker.send_embedding(9, rows)
        crafted = np.arange(300, dtype=np.uint64).reshape(300, 1) << np.uint64(40)  # words of every size
        reply = attacker.top_step(9, crafted, np.zeros(300), rows)
        assert from_tensor(reply.gradient, "gradient").shape == (300, 1)
    s = fed.parties["coordinator"].engine.session(sid)
    assert s.last_step == 9
    assert opened == [] and s.spent == {} and set(s.epochs) == {0}  # no decryption, no key beyond OpenSession's


def test_topstep_clips_crafted_shares_and_refuses_fractional_labels_and_unaligned_rows(
    fed: Federation, monkeypatch
) -> None:
    """Rule 4: the owner shifting its own share by c was refused exactly when Σ h_p passed −c (the ±2^12 range check):
    now every shift is answered, clipped; labels and rows are checked before anything else."""
    sid, _ = _session(fed, "ckks", embedding=4, top_hidden=[4])
    n, rows = 16, list(range(16))
    with fed.channel("active", "coordinator") as owner, fed.channel("active", "passive-1") as passive:
        attacker = _Attacker(fed, sid, owner, passive)
        attacker.send_embedding(1, rows)
        honest = attacker.unmasked(1, rows, np.zeros((n, 4)))
        with pytest.raises(grpc.RpcError) as refused:  # 0.5 would have been class 0
            attacker.top_step(1, honest, np.full(n, 0.5), rows)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "integer" in refused.value.details()
        with pytest.raises(grpc.RpcError) as refused:  # finding 6: rows never aligned (AlignedRows, every family)
            attacker.top_step(1, honest, np.zeros(n), [*range(n - 1), 10_000])
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "row 10000 was never aligned" in refused.value.details()
        assert fed.parties["coordinator"].engine.session(sid).last_step == 0  # nothing trained on them
        held = fed.parties["coordinator"].engine.session(sid).trainer
        for step, shift in enumerate((2.0**12 - 0.5, -1e9, 1e9, 2.0**31), start=1):
            if step > 1:
                attacker.send_embedding(step, rows)
            shifted = attacker.unmasked(step, rows, np.full((n, 4), shift))
            reply = attacker.top_step(step, shifted, np.zeros(n), rows)  # never refused, whatever Σ h_p is
            assert from_tensor(reply.gradient, "gradient").shape == (n, 4)
            attacker.step_back(step, rows, reply.gradient)
        assert held.pending == {}


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


def test_no_key_budget_bounds_the_batch(fed: Federation) -> None:
    """Nothing is decrypted in training, so batch x E is bounded by no key: 512 rows of E = 16 train in one step."""
    info = fed.operator.create_session("ckks", family="splitnn", settings={"embedding": 16, "top_hidden": [4]},
                                       batch_size=512)
    common = fed.operator.align(info.session_id)
    assert list(fed.operator.train(info.session_id, common[:512], 1))[-1].done
    assert fed.parties["coordinator"].engine.session(info.session_id).last_step == 1
    default = fed.operator.create_session("ckks", family="splitnn", settings={"embedding": 16})
    assert fed.parties["active"].engine.sessions[default.session_id].training.batch_size == 128


def _h_p(fed: Federation, sid: str, rows: list[int]) -> np.ndarray:
    """The passive party's h_p of ``rows`` as its bottom computes it (eval mode), to score the attacks."""
    engine = fed.parties["passive-1"].engine
    s = engine.sessions[sid]
    module = s.trainer.bottom.module
    was, _ = module.training, module.eval()
    with torch.no_grad():
        out = module(torch.as_tensor(engine._features(s, np.asarray(rows)), dtype=torch.float64)).numpy()
    module.train(was)
    return out


def test_each_forward_of_a_step_has_its_own_pad(fed: Federation) -> None:
    """Review 10 F2: the mask was bound to (session, step, rows) only, so a step's rows computed twice (a repeat, a
    resumed step after a coordinator restart; with dropout h differs) carried one pad, and the coordinator read the
    difference of the two h exactly. Each forward now draws its own nonce: the two shares' difference says nothing."""
    sid, _ = _session(fed, "ckks", embedding=4, bottom_hidden=[8], dropout=0.5)
    rows = list(range(16))
    held = fed.parties["coordinator"].engine.session(sid).trainer
    with fed.channel("active", "coordinator") as owner, fed.channel("active", "passive-1") as passive:
        attacker = _Attacker(fed, sid, owner, passive)
        shares, nonces = [], []
        for _ in range(3):
            attacker.send_embedding(1, rows)
            shares.append(held.pending[1][2].copy())
            nonces.append(attacker.nonce)
    assert len(set(nonces)) == 3
    for later in shares[1:]:  # the pads no longer cancel: the difference is uniform words, not h2 − h1 (|h| ~ 1)
        assert np.median(np.abs(ring_mask.decode(later - shares[0]))) > 2.0**20


def test_send_embedding_never_refuses_on_the_passive_partys_values(fed: Federation) -> None:
    """Review 10 F3: an h_p beyond the encoding's range was refused, so an owner that had driven W_p with crafted
    gradients read |x_j·x_i| >= bound from refusals. Encoding clips now: the share is sent whatever h_p is."""
    sid, _ = _session(fed, "ckks", embedding=4, top_hidden=[4])
    bottom = fed.parties["passive-1"].engine.sessions[sid].trainer.bottom.module
    with torch.no_grad():
        for parameter in bottom.parameters():
            parameter.mul_(1e15)  # what unchecked crafted gradients can make of W_p
    rows = list(range(16))
    assert np.abs(_h_p(fed, sid, rows)).max() > 2.0**32
    with fed.channel("active", "coordinator") as owner, fed.channel("active", "passive-1") as passive:
        attacker = _Attacker(fed, sid, owner, passive)
        attacker.send_embedding(1, rows)  # answered
        with pytest.raises(grpc.RpcError) as refused:  # Review 10 F5: no rows is refused, naming the field
            attacker.top_step(1, np.zeros((0, 4), np.uint64), np.zeros(0), [])
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "sample_index" in refused.value.details()


def test_residual_the_owner_reads_the_sum_of_passive_embeddings_by_probing_its_own_share(fed: Federation) -> None:
    """A documented residual (review 10 F1), not a defense: the owner chooses its own share and gets ∂L/∂h back, a
    function of Σ h_p at offsets of its choosing. With the top's leading relu, ∂L/∂h is 0 exactly where h < 0, so
    sending h_a = −m and a zero gradient back (nothing checks it) bisects every entry of Σ h_p; 20 steps read it to
    2^-16 here, on nearly every aligned row at once. With one passive party that is h_p."""
    # The owner's own choice of optimiser: no weight decay, so a zero gradient leaves every bottom where it is.
    info = fed.operator.create_session("ckks", family="splitnn", settings={"embedding": 4, "top_hidden": [8]}, l2=0.0)
    sid = info.session_id
    fed.operator.align(sid)
    rows = list(range(len(fed.parties["passive-1"].engine.sessions[sid].rows)))
    n, e = len(rows), 4
    lo, hi = np.full((n, e), -8.0), np.full((n, e), 8.0)
    with fed.channel("active", "coordinator") as owner, fed.channel("active", "passive-1") as passive:
        attacker = _Attacker(fed, sid, owner, passive)
        for step in range(1, 21):
            mid = (lo + hi) / 2
            attacker.send_embedding(step, rows)
            reply = attacker.top_step(step, attacker.unmasked(step, rows, -mid), np.zeros(n), rows)
            below = from_tensor(reply.gradient, "gradient") == 0.0
            hi, lo = np.where(below, mid, hi), np.where(below, lo, mid)
            attacker.step_back(step, rows, to_tensor(np.zeros((n, e))))
    # An entry is lost where the probe kills every hidden unit of the top for its row (the gradient is 0 for a reason
    # other than h < 0); which entries depends on the top's initial weights, the coordinator's own entropy.
    read = np.abs((lo + hi) / 2 - _h_p(fed, sid, rows)) < 2.0**-15
    assert read.mean() > 0.9


def test_residual_a_passive_party_reads_the_sign_pattern_of_the_others_sum(fed: Federation) -> None:
    """A documented residual (review 10 F4): ∂L/∂h, which every party gets, is 0 exactly where h < 0 (the top's leading
    relu), so a passive party that sends 0 in place of h_p reads the sign of every entry of the others' sum (with two
    parties, of h_a), every step."""
    sid, _ = _session(fed, "ckks", embedding=4, top_hidden=[8])
    rows, n = list(range(64)), 64
    h_a = np.random.default_rng(3).normal(size=(n, 4))  # the owner's embedding, honest
    key = fed.parties["passive-1"].engine.sessions[sid].share_mask_key  # the passive party's own
    with (
        fed.channel("active", "coordinator") as owner,
        fed.channel("active", "passive-1") as passive,
        fed.channel("passive-1", "coordinator") as sender,
    ):
        honest = _Attacker(fed, sid, owner, passive)
        honest.send_embedding(1, rows)
        zero = ring_mask.encode(np.zeros((n, 4))) + ring_mask.embedding_mask(key, sid, 1, honest.nonce, rows, 4)
        splitnn_pb2_grpc.SplitNnCoordinatorStub(sender).SubmitEmbedding(
            splitnn_pb2.EmbeddingShare(session_id=sid, step=1, sample_index=rows, share=ring_mask.to_bytes(zero))
        )
        gradient = from_tensor(honest.top_step(1, honest.unmasked(1, rows, h_a), np.zeros(n), rows).gradient, "g")
    # Where the gradient is not all zero its zeros are exactly the signs. An all-zero row is one whose h_a is negative
    # throughout (5 of these 64: read exactly too) or one whose probe kills every hidden unit of the top (unread; which
    # rows depends on the coordinator's own initial weights, and they are few). Counting the first kind as unread made
    # the test fail now and then: 5 such rows and 2 killed ones are below 90 %.
    alive = (gradient != 0.0).any(axis=1)
    assert np.array_equal(gradient[alive] == 0.0, h_a[alive] < 0)
    assert ((gradient == 0.0) == (h_a < 0)).all(axis=1).mean() > 0.9
