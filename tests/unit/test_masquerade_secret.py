"""Masquerade's long-term secret (issue 12): every session of a passive party derives the same Q and the same bits,
so the z_B of several sessions over the same rows, stacked side by side, span no more than one session's — with a Q
per session, two sessions stacked spanned x again and Algorithm 1 read the binary feature off at 1.000."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import numpy as np
import pytest
import torch

from vflsec.services.attacks.binary import binary_match, enumerate_binary, regression_search, span_basis
from vflsec.services.crypto import he
from vflsec.services.crypto.entropy import derive_key, new_key
from vflsec.services.data.datasets import PartyData
from vflsec.services.defenses.embeddings import EmbeddingChain, EmbeddingNoise, Masquerade
from vflsec.services.engines.checkpoint import StateDir
from vflsec.services.engines.passive import PassiveParty, PassiveSession
from vflsec.services.models.splitnn.trainers import FAMILY

N, D, M, WIDTH, DRAWS = 600, 5, 1, 8, 10


def _data() -> np.ndarray:
    """ye's Bank shape: one binary feature among continuous ones."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, D))
    x[:, 0] = rng.random(N) < 0.3
    return x


# The secret's mechanics under ye's random drop; drop=binary's Q = R K comes from the same secret and K is kept
# beside it (tests/unit/test_masquerade_drop.py).
RANDOM = f"masquerade:m={M},drop=random"


def _session_layer(secret: bytes | None, specs: tuple[str, ...] = (RANDOM,)) -> torch.nn.Module:
    """The defended bottom one session of a party builds at JoinSession (None: a secret of the session's own, as
    every session had before the long-term secret)."""
    chain = EmbeddingChain.from_specs(specs).for_session(N, secret=secret)
    return chain.module(torch.nn.Linear(D, WIDTH).double(), D, WIDTH, bias=True)


def _versions(layer: torch.nn.Module, x: np.ndarray, steps: int = 2) -> np.ndarray:
    """z_B at ``steps`` + 1 model versions (SGD on P and b towards a random target), side by side."""
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.5)
    inputs, out = torch.from_numpy(x), []
    target = torch.from_numpy(np.random.default_rng(5).normal(size=(N, WIDTH)))
    for _ in range(steps + 1):
        with torch.no_grad():
            out.append(layer(inputs).numpy())
        optimizer.zero_grad()
        (layer(inputs) - target).pow(2).mean().backward()
        optimizer.step()
    return np.hstack(out)


def test_sessions_of_one_party_share_q_and_bits_those_of_two_parties_do_not() -> None:
    x = _data()
    party, other = new_key(), new_key()
    first, second, foreign = (_session_layer(s) for s in (party, party, other))
    assert torch.equal(first.q, second.q) and not torch.equal(first.q, foreign.q)
    assert not torch.equal(first.p.weight, second.p.weight)  # P's start: each session's own OS entropy
    bits = [layer.masquerade.bits(x) for layer in (first, second, foreign)]
    assert np.array_equal(bits[0], bits[1]) and not np.array_equal(bits[0], bits[2])
    assert first.masquerade._key == second.masquerade._key != foreign.masquerade._key
    # Q's rows are a prefix of one stream per d_B: another rank (the operator's choice) gives nested row spaces
    low = Masquerade(M, rank=2, drop="random").with_secret(party).resolve(N).projection(D)
    assert np.array_equal(low, first.q.numpy()[:2])
    # under noise too (its key stays per session: two sessions never share a model version)
    noisy = [_session_layer(party, (RANDOM, "embedding_noise:sigma=0.1")) for _ in range(2)]
    assert torch.equal(noisy[0].inner.q, first.q)
    assert isinstance(noisy[0].noise, EmbeddingNoise) and noisy[0].noise._key != noisy[1].noise._key
    announced = str(EmbeddingChain.from_specs(["masquerade"]).for_session(N, secret=party).announced())
    assert party.hex() not in announced and str(party) not in announced


def _stacked_attack(z: np.ndarray, truth: np.ndarray) -> tuple[int, float, float, float]:
    """(span dimension, Algorithm 1's best match of the binary feature, Algorithm 2's best fit and best listed), the
    attacks searching the stack's whole span (its numerical rank, ones vector aside)."""
    rank = span_basis(z, z.shape[1]).shape[1]
    exact = enumerate_binary(z, rank - 1).vectors
    alg1 = float(binary_match(truth, exact, complements=True).max()) if exact.size else 0.0
    listed = regression_search(z, rank - 1, rng=np.random.default_rng(1)).vectors
    match = binary_match(truth, listed, complements=True)[0]
    return rank, alg1, float(match[0]), float(match.max())


def test_stacking_two_sessions_of_one_party_gives_the_attack_nothing_one_session_does_not() -> None:
    """masq_stack.py's attack (review 7) on z_B of two sessions over the same rows, each at three model versions, for
    DRAWS parties (each its own secret): (Algorithm 1, Algorithm 2's best fit, its best listed) per stack."""
    x = _data()
    truth = x[:, :1]
    results: dict[str, list[tuple[int, float, float, float]]] = {"one": [], "party": [], "per_session": []}
    for _ in range(DRAWS):
        party = new_key()
        one = _versions(_session_layer(party), x)
        same_party = np.hstack([one, _versions(_session_layer(party), x)])
        per_session = np.hstack([one, _versions(_session_layer(None), x)])  # before: a Q and a bit key per session
        for name, z in (("one", one), ("party", same_party), ("per_session", per_session)):
            results[name].append(_stacked_attack(z, truth))
        rank, alg1, best, listed = results["party"][-1]
        # Now: the stack spans [1, Q x, a(x)] like one session; Algorithm 1 finds the fabricated bit, not the feature.
        assert rank == results["one"][-1][0] == 1 + (D - 1) + M
        assert alg1 <= 0.6 and best <= 0.6
        bit = _session_layer(party).masquerade.bits(x)
        assert binary_match(bit, enumerate_binary(same_party, rank - 1).vectors, complements=True).max() == 1.0
        # Algorithm 2's other listed vectors depend on the party's Q draw (an input axis nearly in Q's row space lets
        # a near fit through), and one session shows whatever they show: stacking adds nothing to them.
        assert listed <= results["one"][-1][3] + 0.01
        # Before: the per-session Q's together span x, and both attacks read the binary feature off exactly.
        rank_old, alg1_old, _, listed_old = results["per_session"][-1]
        assert rank_old == 1 + D + 2 * M and alg1_old == 1.0 and listed_old == 1.0

    def cell(name: str) -> str:
        r = np.array(results[name])
        ranges = "; ".join(f"{r[:, j].min():.3f}-{r[:, j].max():.3f}" for j in (1, 2, 3))
        return f"{ranges} (span {int(r[0, 0])}, listed >= 0.99 in {int(np.sum(r[:, 3] >= 0.99))})"

    print(
        f"\nstacked sessions, n = {N}, d_B = {D}, m = {M}, {DRAWS} parties (Algorithm 1; Algorithm 2 best fit; best "
        f"listed): one session {cell('one')}; two sessions of one party {cell('party')}; two sessions with a Q each "
        f"{cell('per_session')}"
    )


def test_the_secret_is_made_once_kept_0600_and_survives_what_a_session_can_do(tmp_path) -> None:
    state = StateDir(tmp_path / "state")
    secret = state.secret("masquerade")
    assert secret is not None and len(secret) == 32
    file = tmp_path / "state" / "secrets" / "masquerade.bin"
    assert stat.S_IMODE(file.stat().st_mode) == 0o600
    assert StateDir(tmp_path / "state").secret("masquerade") == secret  # loaded at the next start
    state.remove("masquerade")  # closing a session whose id is the secret's name
    state.save_bytes("masquerade", b"a session's companion file")
    state.remove("masquerade")
    assert StateDir(tmp_path / "state").secret("masquerade") == secret
    assert StateDir(None).secret("masquerade") is None  # no folder: the party keeps one for its process
    file.write_bytes(b"short")
    with pytest.raises(ValueError, match="holds 5 bytes, not a 32-byte secret: restore it from a backup"):
        state.secret("masquerade")
    assert not [p for p in os.listdir(tmp_path / "state" / "secrets") if p.endswith(".tmp")]


def _passive_session(embedding: EmbeddingChain) -> PassiveSession:
    context = he.make_keyholder("plain").public_context()
    settings = FAMILY.settings({"topology": "active-top", "party": 1})
    trainer = FAMILY.new_passive(2, D, settings).defended(embedding.module, embedding.min_width(D))
    return PassiveSession(
        backend=he.open_public("plain", context), public_context=context, n_classes=2, family="splitnn",
        trainer=trainer, mask_key=new_key(), owner="active", share_mask_key=new_key(), embedding=embedding,
    )  # fmt: skip


def test_checkpoints_restore_their_own_q_and_key_also_those_from_per_session_keys() -> None:
    """A session joined when Q and the bit key were per session restores with them (its z_B already spans its own
    Q x: switching it to the party's Q mid-session would span x); a new one restores the party's."""
    x = _data()[:50]
    party = new_key()
    chain = EmbeddingChain.from_specs([RANDOM, "embedding_noise:sigma=0.1"])
    for secret in (None, party):  # None: a checkpoint as the code before the long-term secret wrote it
        s = _passive_session(chain.for_session(N, secret=secret))
        restored = PassiveSession.from_state(*s.to_state())
        layer, again = s.trainer.bottom.module.inner, restored.trainer.bottom.module.inner
        assert torch.equal(again.q, layer.q) and torch.equal(again.p.weight, layer.p.weight)
        assert np.array_equal(again.masquerade.bits(x), layer.masquerade.bits(x))
        assert np.array_equal(restored.trainer.inference_share(x), s.trainer.inference_share(x))
        assert torch.equal(layer.q, _session_layer(party).q) == (secret is party)


class _Coordinator:
    """The one call JoinSession makes to the coordinator: a plain session opened by "active"."""

    def public_context(self, session_id: str) -> tuple[str, bytes, str]:
        return "plain", he.make_keyholder("plain").public_context(), "active"


def test_a_passive_party_keys_every_session_with_its_secret_and_says_when_it_lasts_one_process(
    tmp_path, caplog: pytest.LogCaptureFixture
) -> None:
    data = PartyData(np.array([f"r{i}" for i in range(N)]), _data(), [f"b{j}" for j in range(D)])

    def party(state: Path | None) -> PassiveParty:
        return PassiveParty("passive-1", data, _Coordinator(), StateDir(state), allowed_backends=("plain",),
                            embedding_release=[f"masquerade:m={M}"])  # fmt: skip

    def q(p: PassiveParty, sid: str) -> torch.Tensor:
        p.join(sid, "plain", 2, {"topology": "active-top", "party": 1}, "active", "splitnn")
        return p.sessions[sid].trainer.bottom.module.q

    kept = party(tmp_path / "state")
    first = q(kept, "s1")
    assert torch.equal(q(kept, "s2"), first)
    assert torch.equal(q(party(tmp_path / "state"), "s3"), first)  # restarted on the same folder
    assert "without a state folder" not in caplog.text
    with caplog.at_level(logging.WARNING):
        memory = party(None)
    assert "masquerade without a state folder" in caplog.text and "set state_dir" in caplog.text
    in_memory = q(memory, "s1")
    assert torch.equal(q(memory, "s2"), in_memory) and not torch.equal(in_memory, first)
    assert party(tmp_path / "plain").masquerade_secret is not None
    assert PassiveParty("passive-1", data, _Coordinator(), StateDir(tmp_path / "none")).masquerade_secret is None
    assert not (tmp_path / "none" / "secrets").exists()  # no masquerade configured: no secret made


def test_derived_keys_are_fixed_per_purpose_and_independent_across_purposes() -> None:
    secret = new_key()
    assert derive_key(secret, "a") == derive_key(secret, "a") != derive_key(secret, "b") != secret
    assert derive_key(new_key(), "a") != derive_key(secret, "a")
    with pytest.raises(ValueError, match="must be 32 bytes, got 16"):
        derive_key(bytes(16), "a")
