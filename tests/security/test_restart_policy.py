"""Issue 9 review: what a coordinator restart (or a crash) may not undo.

M1: the key epoch length T was fixed at OpenSession; a coordinator restarted with a wider [schema] or a smaller
[limits] key_rotation_steps kept the old T, so one key answered more than N/4 functionals. M2: a byte-identical
repeat of a refused DecryptBlockSums was answered OK with NaN sums, and a request in progress at a crash stayed
unanswerable forever. M3: a plain session outlived a restart under a ckks-only policy. L1: a kill between mkstemp
and os.replace left a temporary file (possibly a secret key) behind. Engine-level: the coordinator's restore is
what is under test, and every scenario restarts it over the same state folder.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from vflsec.services.crypto import he, masking, ring_mask
from vflsec.services.data.datasets import PartyData
from vflsec.services.defenses.release import ParamReleaseChain, ScoreReleaseChain
from vflsec.services.engines import checkpoint
from vflsec.services.engines.coordinator import Coordinator
from vflsec.services.engines.passive import PassiveParty
from vflsec.services.errors import FailedPrecondition, InvalidArgument, PermissionDenied

TAG = bytes(range(32))  # the caller's mask_tag (entropy.tag of its masks' context)

SCHEMA = {"active": 2, "passive-1": 2}  # widths 3 (with the bias column) and 2
WIDTHS = {"active": 3, "passive-1": 2}
# The passive party's word on its aligned rows, which the coordinator asks before a first training step.
ALIGNED = {"passive-1": SimpleNamespace(aligned_rows=lambda session_id: 10_000)}
N = 8  # rows per batch: 2 x the widest block


def _coordinator(state: Path, **options: object) -> Coordinator:
    options.setdefault("schema", SCHEMA)
    return Coordinator(
        ScoreReleaseChain.from_specs(()), ParamReleaseChain.from_specs(()), ALIGNED, state=checkpoint.StateDir(state),
        **options,
    )


def _open(c: Coordinator, backend: str = "ckks") -> str:
    c.open_session("s", backend, 2, ["passive-1"], owner="active")
    return "s"


def _zeros(rows: int) -> bytes:
    return ring_mask.to_bytes(np.zeros((rows, 1), dtype=np.uint64))


def _scores(c: Coordinator, step: int = 1) -> he.EncryptedMatrix:
    # passive-1's share and the owner's are zero words: z = 0, every p is 0.5
    c.family_call("s", "passive-1", "submit_training_share", step=step, sample_index=np.arange(N), share=_zeros(N))
    keys = c.sessions["s"].backend
    return he.matrix_from_wire(keys, c.training_scores("s", step, _zeros(N), 1, np.arange(N), WIDTHS))


def test_a_wider_schema_or_tighter_limit_after_a_restart_refuses_the_session(tmp_path) -> None:
    _open(_coordinator(tmp_path))
    assert _coordinator(tmp_path).sessions["s"].rotation == he.key_rotation_steps(5)  # the same config resumes
    for changed in ({"schema": {"active": 2, "passive-1": 40}}, {"key_rotation_steps": 3}):
        c = _coordinator(tmp_path, **changed)
        for call in (lambda c=c: c.training_context("s", "passive-1", 1), lambda c=c: _scores(c)):
            with pytest.raises(FailedPrecondition, match="changed since this session opened; open a new session"):
                call()
        with pytest.raises(FailedPrecondition, match="changed since this session opened"):
            c.member("s", "active")
    # A looser limit is fine: T stays what the session opened with.
    looser = _coordinator(tmp_path, key_rotation_steps=10_000)
    assert looser.training_context("s", "active", 1)[1] == he.key_rotation_steps(5)
    # The owner can still close the refused session.
    c = _coordinator(tmp_path, key_rotation_steps=3)
    c.owned("s", "active", closing=True)
    c.close("s")
    assert not _coordinator(tmp_path).sessions


def test_widths_fixed_under_a_changed_schema_are_refused(tmp_path) -> None:
    c = _coordinator(tmp_path)
    _open(c)
    c.schema = {"active": 2, "passive-1": 40}  # as if changed under the open session before its first step
    with pytest.raises(FailedPrecondition, match="changed since this session opened"):
        c.training_scores("s", 1, _zeros(80), 1, np.arange(80), {"active": 3, "passive-1": 40})
    assert not c.sessions["s"].widths


def test_a_plain_session_is_refused_after_a_restart_that_disallows_plain(tmp_path) -> None:
    _open(_coordinator(tmp_path, allowed_backends=("ckks", "plain")), "plain")
    c = _coordinator(tmp_path)  # default policy: ckks only
    for call in (lambda: c.training_context("s", "passive-1", 1), lambda: c.admit_query("s", np.arange(3))):
        with pytest.raises(FailedPrecondition, match=r"runs on 'plain', which .*\[policy\] allowed_backends"):
            call()
    c.close("s")
    assert not _coordinator(tmp_path).sessions


class _Coordinator:
    """The one call JoinSession makes to the coordinator: a plain session opened by "active"."""

    def public_context(self, session_id: str) -> tuple[str, bytes, str]:
        return "plain", he.make_keyholder("plain").public_context(), "active"


def test_a_passive_party_refuses_plain_unless_its_own_policy_allows_it(tmp_path) -> None:
    data = PartyData(np.array(["a", "b"]), np.zeros((2, 1)), ["x"])

    def party(*backends: str) -> PassiveParty:
        return PassiveParty("passive-1", data, _Coordinator(), checkpoint.StateDir(tmp_path), allowed_backends=backends)

    def join(p: PassiveParty) -> int:
        return p.join("s", "plain", 2, {}, "active")  # LR with default settings

    with pytest.raises(PermissionDenied, match=r"'plain' is not allowed by passive-1's \[policy\] allowed_backends"):
        join(party("ckks"))
    join(party("ckks", "plain"))
    restarted = party("ckks")  # its operator no longer allows plain: the joined session goes no further
    with pytest.raises(FailedPrecondition, match="no longer allows; close it"):
        restarted.weights("s")
    restarted.owned("s", "active", closing=True)
    restarted.close("s")
    assert not party("ckks").sessions


def _products(c: Coordinator, probs: he.EncryptedMatrix, mask_bound: float = 0.0) -> list[bytes]:
    keys = c.sessions["s"].backend
    ones, rng = np.ones((N, 2)), np.random.default_rng()
    cts, _ = masking.masked_feature_products(
        keys, probs, ones, rng, mask_bound=mask_bound, parts=masking.product_parts(keys)
    )
    return [keys.serialize(ct) for ct in cts]


def _of_a_fresh_form(c: Coordinator, probs: he.EncryptedMatrix, width: int = 2) -> list[bytes]:
    """As many ciphertexts as a party's products, each of a fresh encryption's form (a prime too many): refused
    before decryption, on the caller's own bytes (a product's range is clipped, never refused: review 24, F3)."""
    keys = c.sessions["s"].backend
    count = len(masking.masked_feature_products(
        keys, probs, np.ones((N, width)), np.random.default_rng(), parts=masking.product_parts(keys)
    )[0])
    return [keys.serialize(keys.encrypt(np.zeros(probs.layout.ct_size))) for _ in range(count)]


class _Killed(BaseException):
    pass


def _killed_mid_decryption(c: Coordinator, blobs: list[bytes], monkeypatch) -> None:
    """The coordinator's process dies decrypting party passive-1's request of step 1, after the request's
    placeholder is durable."""

    def crash(*_args, **_kwargs):
        raise _Killed

    with monkeypatch.context() as patch:
        patch.setattr(masking, "block_sums", crash)
        with pytest.raises(_Killed):
            c.block_sums("s", 1, "passive-1", blobs, 2, TAG)


def test_a_request_in_progress_at_a_crash_is_answered_once_with_the_same_sums(tmp_path, monkeypatch) -> None:
    state = tmp_path / "state"
    c = _coordinator(state)
    _open(c)
    blobs = _products(c, _scores(c))
    _killed_mid_decryption(c, blobs, monkeypatch)
    # Two restarts from the same checkpoint both decrypt the retry: the released sums are identical (one flooding
    # sample, keyed by the seed checkpointed with the placeholder), not two independent samples to average.
    shutil.copytree(state, tmp_path / "twin")
    first = _coordinator(state).block_sums("s", 1, "passive-1", blobs, 2, TAG)
    second = _coordinator(tmp_path / "twin").block_sums("s", 1, "passive-1", blobs, 2, TAG)
    np.testing.assert_array_equal(first, second)
    assert np.abs(first - 0.5 * N).max() < 0.2 and np.any(first != 0.5 * N)  # p = 0.5, features 1; flooded
    # Answered now: a repeat gets the recorded sums, and so does any other request of the step (nothing decrypted).
    c = _coordinator(state)
    np.testing.assert_array_equal(c.block_sums("s", 1, "passive-1", blobs, 2, TAG), first)
    redone = _products(c, _scores(c), mask_bound=1.0)
    np.testing.assert_array_equal(c.block_sums("s", 1, "passive-1", redone, 2, TAG), first)


def test_a_request_whose_decryption_a_stop_cut_short_is_replaced_by_the_partys_next(tmp_path, monkeypatch) -> None:
    """Products are re-randomised (review 20, F3), so a party redoing a step after the coordinator stopped mid-way
    sends other bytes: that request takes the unfinished one's place and is answered once."""
    c = _coordinator(tmp_path)
    _open(c)
    blobs = _products(c, _scores(c))
    _killed_mid_decryption(c, blobs, monkeypatch)
    restarted = _coordinator(tmp_path)
    redo = _products(restarted, _scores(restarted))
    assert redo != blobs
    sums = restarted.block_sums("s", 1, "passive-1", redo, 2, TAG)
    assert np.abs(sums - 0.5 * N).max() < 0.2
    np.testing.assert_array_equal(_coordinator(tmp_path).block_sums("s", 1, "passive-1", blobs, 2, TAG), sums)


def test_a_refused_request_is_refused_again_after_a_restart(tmp_path) -> None:
    c = _coordinator(tmp_path)
    _open(c)
    probs = _scores(c)
    loud = _of_a_fresh_form(c, probs)
    with pytest.raises(InvalidArgument, match="an honest product has") as refused:
        c.block_sums("s", 1, "passive-1", loud, 2, TAG)
    for engine in (c, _coordinator(tmp_path)):
        with pytest.raises(InvalidArgument) as again:
            engine.block_sums("s", 1, "passive-1", loud, 2, TAG)
        assert str(again.value) == str(refused.value)
        with pytest.raises(InvalidArgument) as other:  # any other request of the step: the same refusal
            engine.block_sums("s", 1, "passive-1", _products(engine, probs, mask_bound=1.0), 2, TAG)
        assert str(other.value) == str(refused.value)


def test_leftover_temporary_files_are_removed_at_start_up(tmp_path) -> None:
    _open(_coordinator(tmp_path))
    leftovers = [tmp_path / ".s.npz.k2j3.tmp", tmp_path / "epochs" / ".s.e1.bin.x8f0.tmp"]
    for f in leftovers:
        f.write_bytes(b"secret key material")
    (tmp_path / "notes.tmp").write_text("not ours")  # only StateDir's own ".<name>.<random>.tmp" go
    assert _coordinator(tmp_path).sessions["s"]
    assert not any(f.exists() for f in leftovers) and (tmp_path / "notes.tmp").exists()


def test_a_checkpoint_of_the_previous_format_keeps_its_answers(tmp_path) -> None:
    c = _coordinator(tmp_path)
    _open(c)
    blobs = _products(c, _scores(c))
    sums = c.block_sums("s", 1, "passive-1", blobs, 2, TAG)
    arrays, meta = c.sessions["s"].to_state()
    answers = meta["current"].pop("answers")  # as the previous format wrote it: (digest, sums or NaN placeholder)
    meta["current"]["digests"] = {p: a["digest"] for p, a in answers.items()}
    checkpoint.StateDir(tmp_path).save("s", arrays, meta)
    np.testing.assert_array_equal(_coordinator(tmp_path).block_sums("s", 1, "passive-1", blobs, 2, TAG), sums)
    arrays["current/answer/passive-1"] = np.full_like(sums, np.nan)  # spent before any answer: decrypted again
    checkpoint.StateDir(tmp_path).save("s", arrays, meta)
    again = _coordinator(tmp_path).block_sums("s", 1, "passive-1", blobs, 2, TAG)
    assert np.isfinite(again).all() and np.abs(again - sums).max() < 0.2


def test_a_step_whose_scores_an_earlier_version_kept_is_not_replayed(tmp_path) -> None:
    """Review 25, F2 (review 26, F2): a coordinator restarted from a checkpoint an earlier version wrote mid-step holds
    that step's [[p]] in the fresh form, which no party accepts now (he.LOWERED): the replay is refused naming the way
    out, decided from the stored bytes, also after the session is saved again; the step's answers stay spent."""
    c = _coordinator(tmp_path)
    _open(c)
    probs = _scores(c)
    sums = c.block_sums("s", 1, "passive-1", _products(c, probs), 2, TAG)
    assert [c.sessions["s"].backend.serialize(ct) for ct in _scores(c).ciphertexts] == c.sessions["s"].current.scores
    keys = c.sessions["s"].backend
    arrays, meta = c.sessions["s"].to_state()
    fresh = he.encrypt_matrix(keys, np.full((N, 1), 0.5), 1)  # [[p]] as the earlier version made it
    arrays["current/score/0"] = checkpoint.from_bytes(keys.serialize(fresh.ciphertexts[0]))
    checkpoint.StateDir(tmp_path).save("s", arrays, meta)
    for _restart in range(2):  # the second after the session was saved again (the repeated block sums below)
        restarted = _coordinator(tmp_path)
        with pytest.raises(FailedPrecondition, match=r"step 1's training scores were kept by an earlier coordinator"):
            _scores(restarted)
        redone = _products(restarted, fresh, mask_bound=1.0)
        np.testing.assert_array_equal(restarted.block_sums("s", 1, "passive-1", redone, 2, TAG), sums)  # spent
        restarted.sessions.save("s", restarted.sessions["s"])


def test_a_repeat_under_other_masks_is_refused_not_answered(tmp_path) -> None:
    """Review 21, F9: a repeat of a step's block sums is answered from the step's one answer only under the first
    request's mask_tag; under another (a party that lost its mask key redoes the step with other masks) it gets
    FAILED_PRECONDITION, not sums its masks would not unmask. The tag survives a restart; a missing or short tag is
    refused naming the field, and none of this spends or changes the answer."""
    c = _coordinator(tmp_path)
    _open(c)
    with pytest.raises(InvalidArgument, match="mask_tag: must be 32 bytes, got 0"):
        c.block_sums("s", 1, "passive-1", _products(c, _scores(c)), 2, b"")
    blobs = _products(c, _scores(c))
    sums = c.block_sums("s", 1, "passive-1", blobs, 2, TAG)
    other = bytes(32)
    for engine in (c, _coordinator(tmp_path)):  # and after a restart, from the checkpoint
        for request in (blobs, _products(engine, _scores(engine), mask_bound=1.0)):
            with pytest.raises(FailedPrecondition, match="under other masks"):
                engine.block_sums("s", 1, "passive-1", request, 2, other)
        np.testing.assert_array_equal(engine.block_sums("s", 1, "passive-1", blobs, 2, TAG), sums)
    # A refusal is kept under its tag too: its repeats get the refusal, another tag the other-masks refusal.
    loud = _of_a_fresh_form(c, _scores(c), width=3)
    with pytest.raises(InvalidArgument, match="an honest product has") as refused:
        c.block_sums("s", 1, "active", loud, 3, TAG)
    with pytest.raises(FailedPrecondition, match="under other masks"):
        c.block_sums("s", 1, "active", loud, 3, other)
    with pytest.raises(InvalidArgument) as again:
        c.block_sums("s", 1, "active", loud, 3, TAG)
    assert str(again.value) == str(refused.value)


def test_a_request_resumed_from_a_checkpoint_without_tags_is_bound_to_its_tag(tmp_path, monkeypatch) -> None:
    """Review 22, F1: a request in progress at a crash, checkpointed before tags were kept, is resumed by the party's
    identical request; from then on it is bound to that request's tag like any other."""
    c = _coordinator(tmp_path)
    _open(c)
    blobs = _products(c, _scores(c))
    _killed_mid_decryption(c, blobs, monkeypatch)
    arrays, meta = c.sessions["s"].to_state()
    for answer in meta["current"]["answers"].values():
        del answer["tag"]  # as the format before the tag wrote it
    checkpoint.StateDir(tmp_path).save("s", arrays, meta)
    resumed = _coordinator(tmp_path)
    sums = resumed.block_sums("s", 1, "passive-1", blobs, 2, TAG)
    for engine in (resumed, _coordinator(tmp_path)):
        with pytest.raises(FailedPrecondition, match="under other masks"):
            engine.block_sums("s", 1, "passive-1", blobs, 2, bytes(32))
        np.testing.assert_array_equal(engine.block_sums("s", 1, "passive-1", blobs, 2, TAG), sums)
