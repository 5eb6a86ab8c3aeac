"""Split-NN through the real services (loopback gRPC, mTLS, TenSEAL CKKS), both topologies: parity with the
central torch model on the same batches, and what the active party's recordings hold."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from tests.conftest import pinned_initial_weights
from tests.integration.conftest import federation
from vflsec.services import plugins
from vflsec.services.data import datasets
from vflsec.services.errors import PeerFailed
from vflsec.services.models import family as families
from vflsec.services.models import splitnn as sn
from vflsec.services.models.splitnn.trainers import SplitNNSettings
from vflsec.services.transport.links import CoordinatorClient, PassiveClient

SETTINGS = {"embedding": 8, "top_hidden": [16]}
TRAINING = {"optimizer": "adam", "learning_rate": 0.01, "l2": 0.0, "batch_size": 64, "seed": 5}
EPOCHS = 10


def _blocks(fed, ids: list[str]) -> tuple[np.ndarray, ...]:
    """Every party's own feature rows for ``ids``, as its engine holds them (scaled as it loaded them)."""
    out = []
    for party in ("active", *fed.layout.passive_parties):
        data = fed.parties[party].engine.data
        out.append(data.X[datasets.select_ids([str(i) for i in data.ids], ids)])
    return tuple(out)


def _run(
    fed,
    backend: str,
    ds: datasets.Dataset,
    topology: str = "coordinator-top",
    epochs: int = EPOCHS,
    training: dict = TRAINING,
    model: dict = SETTINGS,
    test_fraction: float = 0.25,
) -> tuple[float, float, dict]:
    """Federated and central test accuracy on the same split and batches; and the session's released model."""
    settings = {**model, "topology": topology}
    # The central model's initial weights: each party's modules start from its own OS entropy in a deployment,
    # so the parity run pins them in-process (test-only hook), as the clarifications allow.
    with pinned_initial_weights(training["seed"]):
        info = fed.operator.create_session(backend, family="splitnn", settings=settings, **training)
    common = sorted(fed.operator.align(info.session_id))  # one split in every run (PSI's order is random)
    labels = ds.y[datasets.select_ids(ds.ids, common)]
    split = datasets.train_test_split_ids(np.asarray(common), labels, test_fraction, seed=0)
    train_ids, test_ids = (list(a) for a in split)
    progress = list(fed.operator.train(info.session_id, train_ids, epochs))
    assert progress[-1].done
    released = fed.operator.predict(info.session_id, test_ids)
    y_test = ds.y[datasets.select_ids(ds.ids, test_ids)]
    federated = float(np.mean(released.scores.argmax(axis=1) == y_test))

    # The central model of the same architecture and seed, on the batches the active party drew: its batch order
    # is a generator seeded with the session's seed, one permutation per epoch (services/engines/active.py).
    rng = np.random.default_rng(training["seed"])
    orders = [rng.permutation(len(train_ids)) for _ in range(epochs)]
    train, test = _blocks(fed, train_ids), _blocks(fed, test_ids)
    data = sn.SplitData(train, ds.y[datasets.select_ids(ds.ids, train_ids)], test, y_test)
    # The same architecture and optimiser (the session's settings; the TrainingConfig's name, rate and L2).
    optimizer = {"name": training["optimizer"], "learning_rate": training["learning_rate"]}
    optimizer["weight_decay"] = training["l2"]
    net = SplitNNSettings.from_dict({**settings, "optimizer": {**optimizer, **settings.get("optimizer", {})}})
    config, optim = net.network(data.features, ds.n_classes), net.optim
    batch = training["batch_size"]
    central, _ = sn.central_run(
        config,
        optim,
        data,
        epochs=epochs,
        batch_size=batch,
        seed=training["seed"],
        batches_of=lambda epoch: families.batches(orders[epoch], batch, 1),
    )
    model = fed.operator.fetch_model(info.session_id)
    return federated, central.accuracy, {"family": model.family, "tensors": model.tensors, "released": released}


def test_active_top_matches_central_and_records_the_passive_output(tmp_path) -> None:
    """ye's setting: z_B reaches the active party in the clear (plain backend; CKKS is refused, it has nothing to
    protect there), which trains and scores on its own; its recordings hold z_B, exactly."""
    ds = datasets.load_dataset("breast_cancer")
    record = tmp_path / "record"
    spec = {"path": "vflsec.services.plugins:Recorder", "options": {"dir": str(record)}}
    with federation(tmp_path / "fed", dataset="breast_cancer", n_passive=1, backend="plain", plugins=[spec]) as fed:
        federated, central, model = _run(fed, "plain", ds, "active-top")
        queried = model["released"].sample_ids
        passive = fed.parties["passive-1"].engine
        sid = next(iter(passive.sessions))
        z_true = passive.sessions[sid].trainer.inference_share(_blocks(fed, queried)[1])
        bottom = passive.sessions[sid].trainer.releasable()
    assert central >= 0.85  # a trained model: 0.915 on the sorted split
    assert abs(federated - central) <= 0.01, (federated, central)
    assert model["family"] == "splitnn" and any(name.startswith("head/") for name in model["tensors"])
    _assert_released(model["tensors"], bottom)  # pulled by the coordinator as in coordinator-top
    entries = [json.loads(line) for line in (record / "transcript.jsonl").read_text().splitlines()]
    inference = [i for i, e in enumerate(entries) if e["kind"] == plugins.EMBEDDINGS and e["meta"]["step"] == 0]
    assert inference
    z = np.vstack([np.load(record / f"{i:06d}.npz")["z"] for i in inference])
    np.testing.assert_allclose(z, z_true, atol=1e-9)  # the passive party's output itself


@pytest.mark.parametrize("backend", ["ckks", "plain"])
def test_coordinator_top_matches_central(tmp_path, backend: str) -> None:
    ds = datasets.load_dataset("breast_cancer")
    with federation(tmp_path, dataset="breast_cancer", n_passive=1, allow_plain=backend == "plain") as fed:
        federated, central, model = _run(fed, backend, ds)
        passive = fed.parties["passive-1"].engine
        bottom = passive.sessions[next(iter(passive.sessions))].trainer.releasable()
    assert central >= 0.85  # 0.938 on the sorted split (PSI-ordered splits: 0.83-0.97, 1 in 12 < 0.85)
    assert abs(federated - central) <= 0.01, (federated, central)
    assert model["family"] == "splitnn"
    # The active party holds its own bottom, the released top model and (empty parameter chain) the passive bottom.
    assert any(name.startswith("top/") for name in model["tensors"])
    assert any(name.startswith("bottom/0/") for name in model["tensors"])
    _assert_released(model["tensors"], bottom)
    np.testing.assert_allclose(model["released"].scores.sum(axis=1), 1.0, atol=1e-9)


def _assert_released(tensors: dict, bottom: dict) -> None:
    """The passive party's bottom arrived whole and exact, under its own position's prefix."""
    assert bottom and all(name.startswith("bottom/1/") for name in bottom)
    assert {name for name in tensors if name.startswith("bottom/1/")} == set(bottom)
    for name, t in bottom.items():
        np.testing.assert_array_equal(tensors[name], t)


@pytest.mark.parametrize("topology", ["coordinator-top", "active-top"])
def test_withhold_keeps_the_passive_bottom_with_its_owner(tmp_path, topology: str) -> None:
    ds = datasets.load_dataset("breast_cancer")
    spec = {"n_passive": 1, "backend": "plain", "param_release": ["withhold"]}
    with federation(tmp_path, dataset="breast_cancer", **spec) as fed:
        _, _, model = _run(fed, "plain", ds, topology, epochs=1)
    assert any(name.startswith("top/" if topology == "coordinator-top" else "head/") for name in model["tensors"])
    assert not any(name.startswith("bottom/1/") for name in model["tensors"])


def _rows_of(found: np.ndarray, rows: np.ndarray, atol: float = 1e-6) -> np.ndarray:
    """Which rows of ``found`` equal (within ``atol``) some row of ``rows``: matched row by row, so neither the
    order of a batch nor the step that produced a row matters."""
    gaps = np.abs(found[:, None, :] - rows[None, :, :]).max(axis=2)
    return gaps.min(axis=1) <= atol


def test_active_party_records_no_passive_embedding(tmp_path, monkeypatch) -> None:
    """coordinator-top under CKKS: the active party receives ∂L/∂h and nothing of any h_p (no ciphertext, no share:
    each passive share goes straight to the coordinator)."""
    from vflsec.services.models.splitnn.trainers import SplitNNPassive

    produced: list[np.ndarray] = []  # every h_p the passive party computed, at the weights of its own step
    forward = SplitNNPassive.forward

    def recording_forward(self, x: np.ndarray, *, replay: bool, epoch: int) -> np.ndarray:
        h = forward(self, x, replay=replay, epoch=epoch)
        produced.append(np.array(h, dtype=np.float64))
        return h

    monkeypatch.setattr(SplitNNPassive, "forward", recording_forward)
    record = tmp_path / "record"
    spec = {"path": "vflsec.services.plugins:Recorder", "options": {"dir": str(record)}}
    with federation(tmp_path / "fed", dataset="breast_cancer", n_passive=1, plugins=[spec]) as fed:
        info = fed.operator.create_session("ckks", family="splitnn", settings=SETTINGS, **TRAINING)
        common = fed.operator.align(info.session_id)
        list(fed.operator.train(info.session_id, common[:128], 1))

    entries = [json.loads(line) for line in (record / "transcript.jsonl").read_text().splitlines()]
    kinds = [e["kind"] for e in entries]
    assert kinds.count(plugins.GRADIENT) == 2  # 2 batches of 64
    received = [e for e in entries if e["source"] != "active"]
    # The only plaintext arrays from others during training: ∂L/∂h, batch x E.
    assert {name for e in received for name in e["arrays"]} == {"gradient"}
    h_p = np.vstack(produced)
    assert h_p.shape == (128, SETTINGS["embedding"])
    assert _rows_of(h_p[::-1], h_p).all()  # the check finds a leaked h_p in any order
    arrays = [a for path in record.glob("*.npz") for a in np.load(path).values()]
    assert arrays
    for array in arrays:  # no row of any received array is a row of the passive party's h_p
        if array.ndim == 2 and array.shape[1] == h_p.shape[1]:
            assert not _rows_of(np.asarray(array, dtype=np.float64), h_p, atol=1e-3).any()


def test_ye_recovers_binary_passive_features_from_the_curious_plugin_recordings(tmp_path) -> None:
    """ye's Algorithm 1 on what the curious plugin recorded in an active-top session: every binary passive feature
    of the queried rows, exactly (ye §4: noise-free z_B = W_B x_B spans them)."""
    from vflsec.client.federation.launcher import FederationSpec, run_in_process, write_federation
    from vflsec.client.federation.operator import Operator
    from vflsec.services.attacks import make_attack, run_attack
    from vflsec.services.attacks.binary import binary_match
    from vflsec.services.plugins import curious

    rng = np.random.default_rng(0)
    n, ids = 400, np.array([f"s{i:04d}" for i in range(400)])
    x_active, x_passive = rng.normal(size=(n, 3)), rng.integers(0, 2, size=(n, 5)).astype(float)
    y = x_active[:, 0] + x_passive @ np.array([1.0, -1.0, 1.0, -1.0, 1.0]) + rng.normal(0, 0.5, n) > 0.5
    names = [f"a{j}" for j in range(3)] + [f"b{j}" for j in range(5)]
    X = np.hstack([x_active, x_passive])
    ds = datasets.Dataset("binary-passive", ids, X, y.astype(np.int64), names, ["0", "1"])
    store = tmp_path / "curious.sqlite"
    plugin = {"path": "vflsec.services.plugins.curious:CuriousPlugin", "options": {"store": str(store)}}
    spec = FederationSpec(ds, n_passive=1, passive_features=5, backend="plain", plugins=[plugin])
    layout = write_federation(spec, tmp_path / "fed")
    with run_in_process(layout) as parties, layout.operator_channel() as channel:
        operator = Operator(channel)
        info = operator.create_session("plain", family="splitnn", settings={"topology": "active-top"}, seed=1)
        common = operator.align(info.session_id)
        list(operator.train(info.session_id, common[:250], 2))
        operator.predict(info.session_id, common[250:])
        passive = parties["passive-1"].engine
        truth_rows = datasets.select_ids([str(i) for i in passive.data.ids], common[250:])
        truth = passive.data.X[truth_rows]
    obs, queried = curious.observations(curious.ObservationStore(store), info.session_id)
    assert queried == common[250:] and obs.embeddings is not None and obs.embeddings.shape[1] == 8
    # Every binary vector of the span, not x_passive's first d_p: on ~110 rows the span can hold a binary combination
    # of the true columns too (seen: 6 vectors for 5 columns), and x_passive keeps only d_p of them, in no order.
    found = run_attack(make_attack("ye_alg1"), obs).meta["binary_features"]
    assert set(np.unique(truth)) == {0.0, 1.0}
    assert np.all(binary_match(truth, found, complements=True).max(axis=1) == 1.0)


def test_each_family_rpc_refuses_a_session_of_another_family(tmp_path) -> None:
    """LR's training RPCs on a split-NN session and split-NN's on an LR session: FAILED_PRECONDITION naming the
    family, before anything is admitted or decrypted; both sessions keep training afterwards."""
    with federation(tmp_path, dataset="breast_cancer", n_passive=1, allow_plain=True) as fed:
        op = fed.operator
        nn = op.create_session("plain", family="splitnn", settings=SETTINGS, **TRAINING).session_id
        lr = op.create_session("plain", batch_size=64, seed=1).session_id
        common = {sid: op.align(sid) for sid in (nn, lr)}
        for sid in (nn, lr):
            list(op.train(sid, common[sid][:128], 1))
        coordinator = fed.parties["coordinator"].engine
        backend = coordinator.session(nn).backend
        rows = np.asarray(range(64), np.int64)
        widths = {sid: coordinator.session(sid).widths for sid in (nn, lr)}  # as training declared them
        words = np.zeros((64, 8), np.uint64)
        with (
            fed.channel("active", "coordinator") as owner,
            fed.channel("coordinator", "passive-1") as puller,
            fed.channel("passive-1", "coordinator") as sender,
            fed.channel("active", "passive-1") as driver,
        ):
            key_holder, passive = CoordinatorClient(owner), PassiveClient("passive-1", puller)
            puller_as_passive, owner_to_passive = CoordinatorClient(sender), PassiveClient("passive-1", driver)
            calls = {  # each wrong-family call, and the session family its refusal must name
                "ComputeTrainingScores": (
                    "splitnn",
                    lambda: key_holder.training_scores(backend, nn, 3, words, 1, rows, widths[nn]),
                ),
                "SubmitTrainingShare": ("splitnn", lambda: puller_as_passive.submit_training_share(nn, 3, rows, words)),
                "DecryptBlockSums": (
                    "splitnn",
                    lambda: key_holder.block_sums(nn, 2, [b""], widths[nn]["active"], bytes(32)),
                ),
                "GetWeights": ("splitnn", lambda: passive.weights(nn)),
                "GetBottom": ("lr", lambda: passive.splitnn.bottom(lr)),  # LR's W_p goes through GetWeights only
                "TopStep": (
                    "lr",
                    lambda: key_holder.splitnn.top_step(lr, 3, rows, words, np.zeros(64), widths[lr]),
                ),
                "SubmitEmbedding": (
                    "lr",
                    lambda: puller_as_passive.splitnn.submit_embedding(lr, 3, rows, words),
                ),
                "SendEmbedding": ("lr", lambda: owner_to_passive.splitnn.send_embedding(lr, 3, rows)),
                "ShareTrainingLogits": ("splitnn", lambda: owner_to_passive.share_training_logits(nn, 3, rows)),
            }
            for what, (family, call) in calls.items():
                with pytest.raises(PeerFailed) as failed:
                    call()
                assert failed.value.code == "FAILED_PRECONDITION", (what, str(failed.value))
                assert re.search(rf"\b{family}\b", str(failed.value)), (what, str(failed.value))
        for sid in (nn, lr):
            assert list(op.train(sid, common[sid][:128], 1))[-1].done
