"""A passive party's own embedding defense through a live federation (loopback gRPC, mTLS, plain split-NN
active-top): its operator's ``[defenses] embedding`` masquerade transforms z_B before it leaves, the chain's public
parameters reach the active party's recordings, and ye's attacks run on them as a Kerckhoffs attacker would."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest

from tests.integration.conftest import binary_passive_dataset
from vflsec.client.federation.launcher import FederationSpec, run_in_process, write_federation
from vflsec.client.federation.operator import Operator
from vflsec.services.attacks import NotApplicable, Observations, make_attack, run_attack
from vflsec.services.attacks.binary import attack_accuracy
from vflsec.services.data import datasets
from vflsec.services.engines.passive import PassiveSession
from vflsec.services.plugins import curious

N, D_A, D_B, TRAIN, EPOCHS = 2000, 3, 5, 1400, 30
# drop=binary's accuracy bound on this set (see the first test): a broken model scores the majority class, 0.517 of
# the 406 queried rows, or a coin's 0.5 ± 0.025; m = 1 trained to 0.680-0.754 in 40 runs (an audit), 0.65 was too near
BINARY_FLOOR = 0.60
ACTIVE_TOP = {"model": "splitnn", "topology": "active-top"}  # the only sessions embedding defenses act on


@dataclass
class Run:
    obs: Observations
    x_passive: np.ndarray  # the passive party's rows of the queried samples
    truth: np.ndarray  # their binary feature, (n, 1)
    accuracy: float  # of the trained model on the queried (held-out) rows
    session: PassiveSession


def _run(
    tmp_path: Path,
    embedding_release: list[str],
    settings: dict | None = None,
    epochs: int = EPOCHS,
    rebuilt: bool = False,
) -> Run:
    """Train an active-top session on TRAIN rows, score the rest; the curious plugin records what the active party
    received. Returns its observations and the ground truth to grade them."""
    ds = binary_passive_dataset(N, D_A, D_B, rebuilt)
    store = tmp_path / "curious.sqlite"
    plugin = {"path": "vflsec.services.plugins.curious:CuriousPlugin", "options": {"store": str(store)}}
    spec = FederationSpec(
        ds, n_passive=1, passive_features=D_B, backend="plain", plugins=[plugin], embedding_release=embedding_release,
        **ACTIVE_TOP,
    )  # fmt: skip
    layout = write_federation(spec, tmp_path / "fed")
    with run_in_process(layout) as parties, layout.operator_channel() as channel:
        operator = Operator(channel)
        info = operator.create_session(
            "plain", family="splitnn", settings={"topology": "active-top", **(settings or {})}, seed=1,
            learning_rate=0.05,
        )  # fmt: skip
        common = sorted(operator.align(info.session_id))  # the same split in every run (PSI's order is random)
        list(operator.train(info.session_id, common[:TRAIN], epochs))
        released = operator.predict(info.session_id, common[TRAIN:])
        passive = parties["passive-1"].engine
        x_passive = passive.data.X[datasets.select_ids([str(i) for i in passive.data.ids], common[TRAIN:])]
        session = passive.sessions[info.session_id]
    labels = ds.y[datasets.select_ids(ds.ids, released.sample_ids)]
    obs, queried = curious.observations(curious.ObservationStore(store), info.session_id)
    assert queried == list(common[TRAIN:]) and obs.embeddings is not None
    return Run(obs, x_passive, x_passive[:, :1], float(np.mean(released.scores.argmax(axis=1) == labels)), session)


def _chance(run: Run) -> float:
    """Above what a vector independent of the binary feature scores: a fabricated bit (a PRF under the party's OS-drawn
    key) matches it, or its complement, on 0.5 + |N(0, 1/(4 n))| of the n rows, a constant on the majority rate. 4.5
    standard errors (a false alarm 7e-6 a vector; 0.567 was 2.7 of them, 1-2 % a run); the feature read off scores 1."""
    majority = float(max(run.truth.mean(), 1 - run.truth.mean()))
    return max(majority, 0.5 + 4.5 * 0.5 / np.sqrt(len(run.truth)))


def _accuracy(attack: str, run: Run) -> tuple[float, float]:
    """ye §6.3's metric (complements allowed) for the attack's best vector (what it claims the feature is), and for
    the best of every vector it listed (a stronger reading)."""
    found = run_attack(make_attack(attack), run.obs).meta["binary_features"]
    best = attack_accuracy(run.truth, found[:, :1], complements=True)
    return best, attack_accuracy(run.truth, found, complements=True)


def test_masquerade_fools_the_plain_attack_the_adaptive_one_recovers_at_m1_and_fails_at_large_m(tmp_path) -> None:
    plain = _run(tmp_path / "none", [])
    assert plain.obs.embedding_chain == ()
    undefended, _ = _accuracy("ye_alg2", plain)
    assert undefended >= 0.99  # undefended: z_B spans the binary feature (ye §4)

    # ye's own setting (one keyed random direction dropped), which this test reproduces at m = 1
    one = _run(tmp_path / "m1", ["masquerade:m=1,drop=random"])
    # Kerckhoffs: the mechanism, m and drop are announced and recorded; the PRF key never is.
    assert one.obs.embedding_chain == (("masquerade", {"m": "1", "drop": "random"}),)
    assert one.obs.embeddings.shape[1] == 8  # max(d_B, 8) carries rank d_B − 1 plus the bit
    fooled, fooled_any = _accuracy("ye_alg2", one)
    adaptive, adaptive_any = _accuracy("ye_adaptive", one)
    # Step 1 of ye §5's adaptive attack: the fabricated bit lies exactly in the span and is found.
    assert run_attack(make_attack("ye_adaptive"), one.obs).meta["fabricated_m"] == 1

    # The defaults: m = ⌈log₂ n⌉ of the party's rows (groups of about one row), drop=binary, and no passive_width:
    # the party widens z_B to rank d_B − 2 (the binary column left out, and the direction of its sample correlation
    # with the others) plus m bits and announces it, and the active party's top model takes that width.
    many = _run(tmp_path / "default", ["masquerade"])
    m = math.ceil(math.log2(N))
    assert many.obs.embedding_chain == (("masquerade", {"m": str(m), "drop": "binary"}),)
    assert many.obs.embeddings.shape[1] == D_B - 2 + m
    majority = float(max(many.truth.mean(), 1 - many.truth.mean()))
    # Groups of about one row: the attack either says no group is attackable, or it ran inside one (covered_rows > 0)
    # and is scored; a give-up is never scored (its zeros would match the majority bit).
    try:
        result = run_attack(make_attack("ye_adaptive"), many.obs).meta
    except NotApplicable as exc:
        assert "no group of rows sharing a fabricated pattern is attackable" in exc.reason
        assert "the largest has" in exc.reason
        adaptive_many, many_cell = None, f"not applicable ({exc.reason})"
    else:
        assert result["covered_rows"] > 0 and result["fabricated_m"] <= m
        adaptive_many = attack_accuracy(many.truth, result["binary_features"], complements=True)
        many_cell = (
            f"adaptive any listed {adaptive_many:.3f} on {result['covered_rows']:.2f} of the rows covered, "
            f"{result['fabricated_m']} bits found, largest group {result['largest_group']}"
        )

    print(
        f"\nye, live active-top, {len(plain.truth)} queried rows, d_B = {D_B}: undefended alg2 {undefended:.3f}; "
        f"m=1: alg2 {fooled:.3f} (any listed {fooled_any:.3f}), adaptive {adaptive:.3f} (any {adaptive_any:.3f}); "
        f"m={m}: {many_cell} (majority {majority:.3f}); "
        f"model accuracy none {plain.accuracy:.3f}, m=1 {one.accuracy:.3f}, m={m} {many.accuracy:.3f}"
    )
    assert fooled <= _chance(one)  # the plain attack's best fit is the fabricated bit (ye §5)
    # ye §5 (split by the fabricated bit, attack inside the groups: m = 1 is no protection) held at 1.000 with a
    # trained Q. With review 6's fixed OS-entropy Q, which removes a random direction of x for the session, the
    # attack inside the groups recovers the feature in some runs only (1.000 twice, 0.507 once on 2026-11-24), so
    # the m = 1 figure is printed and reported (docs/defenses.md), not asserted.
    assert adaptive_many is None or adaptive_many <= _chance(many)  # groups of about one row: nothing to solve
    # The fresh key and (since Q is fixed, review 6) the fresh projection move the defended model: in process,
    # 16 seeds, m = 1 -3.2 ± 2.8 pp, m = 11 -4.5 ± 3.9 pp, one of 24 runs -11.5 pp (docs/defenses.md). The check
    # guards against a defense that breaks training (a broken model falls to the majority class, 0.517), not
    # ye's <= 1 pp, which the docs report as missed here.
    assert one.accuracy >= plain.accuracy - 0.15
    # drop=binary: the label is 2 × the binary column + …, and a linear bottom cannot use a column it hides (the
    # prototype: 0.92 -> 0.75 in process, docs/defenses.md). Still well above a broken model's majority class.
    assert many.accuracy >= BINARY_FLOOR


def test_the_default_drop_binary_leaves_both_attacks_at_the_majority_rate_at_m1(tmp_path) -> None:
    """Where ye's random drop leaves the feature to the adaptive attack at m = 1 (1.000 in some runs, above), the
    default drop=binary keeps only directions uncorrelated with it: Algorithm 2's every listed vector and the
    adaptive attack's stay at the majority rate. The party's continuous columns nearly rebuild the binary one (as
    on Bank): leaving the column out is then not enough, the kept directions must also be uncorrelated with it (a
    binary column independent of the others would pass either way)."""
    run = _run(tmp_path, ["masquerade:m=1"], rebuilt=True)
    assert run.obs.embedding_chain == (("masquerade", {"m": "1", "drop": "binary"}),)
    assert run.obs.embeddings.shape[1] == 8  # rank d_B − 1 (one binary column) plus the bit
    majority = float(max(run.truth.mean(), 1 - run.truth.mean()))
    _, plain_any = _accuracy("ye_alg2", run)
    adaptive, adaptive_any = _accuracy("ye_adaptive", run)
    print(
        f"\ndrop=binary, m = 1, live: alg2 any listed {plain_any:.3f}, adaptive {adaptive:.3f} (any {adaptive_any:.3f})"
        f", majority {majority:.3f}; model accuracy {run.accuracy:.3f}"
    )
    assert plain_any <= _chance(run) and adaptive_any <= _chance(run)
    assert run.accuracy >= BINARY_FLOOR


def test_the_defended_session_survives_its_checkpoint_with_the_same_bits_and_noise(tmp_path) -> None:
    run = _run(tmp_path, ["masquerade:m=1", "embedding_noise:sigma=0.01"], epochs=1)
    noise = ("embedding_noise", {"sigma": "0.01", "max_answers": "128"})  # the default budget, announced
    assert run.obs.embedding_chain == (("masquerade", {"m": "1", "drop": "binary"}), noise)
    arrays, meta = run.session.to_state()
    basis = run.session.embedding.masquerade._basis  # the party's kept K: sizes the restored Q
    restored = PassiveSession.from_state(arrays, meta, basis)
    x = run.x_passive[:50]
    masquerade = run.session.embedding.steps[0]
    assert np.array_equal(restored.embedding.steps[0].bits(x), masquerade.bits(x))  # the same PRF key
    noisy = run.session.trainer.inference_share(x)
    assert np.array_equal(run.session.trainer.inference_share(x), noisy)  # asked again: the same z_B
    assert np.array_equal(restored.trainer.inference_share(x), noisy)  # same layer, bits and noise key
    noise = run.session.embedding.steps[1]
    assert np.array_equal(restored.embedding.steps[1].draw(x, 8), noise.draw(x, 8))
    # a checkpoint from before the noise was keyed holds masquerade's key only: its bits survive, the noise is new
    arrays["masquerade_key"] = arrays.pop("embedding_keys")[:32]
    older = PassiveSession.from_state(arrays, meta, basis)
    assert np.array_equal(older.embedding.steps[0].bits(x), masquerade.bits(x))
    assert not np.array_equal(older.embedding.steps[1].draw(x, 8), noise.draw(x, 8))


def test_masquerade_wider_than_an_explicit_session_width_is_refused_naming_the_bound(tmp_path) -> None:
    ds = binary_passive_dataset(N, D_A, D_B)
    spec = FederationSpec(
        ds, n_passive=1, passive_features=D_B, backend="plain", embedding_release=["masquerade"], **ACTIVE_TOP
    )
    layout = write_federation(spec, tmp_path / "fed")
    settings = {"topology": "active-top", "passive_width": 8}  # the default width, but asked for explicitly
    with run_in_process(layout), layout.operator_channel() as channel, pytest.raises(grpc.RpcError) as err:
        Operator(channel).create_session("plain", family="splitnn", settings=settings, seed=1)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # m = ⌈log₂ n⌉ of the party's rows, rank d_B − 2 (drop=binary, one binary column): the width must carry both
    smallest = D_B - 2 + math.ceil(math.log2(N))
    assert "[defenses] embedding" in err.value.details()
    assert f"raise passive_width to at least {smallest}" in err.value.details()
