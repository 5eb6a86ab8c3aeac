"""Issue 27's tree findings, replayed by a deviating active party against live federations (real gRPC over loopback,
mTLS; CKKS where the finding is about what the coordinator decrypts): each probe is now refused or learns nothing.

* Finding 3: a passive party fitted its bins on rows the active party named at Begin and an empty parameter chain
  released every passive threshold, so two named rows gave their exact values. Now the passive party fits on all its
  aligned rows, at least ``[policy] min_training_rows``, and its thresholds stay home unless the chain says
  ``thresholds`` (luo's setting).
* Finding 4: the coordinator refused a query whose summed inference shares were not bits, so +1 in a passive node's
  column of the active share read the passive answer from the refusal. Now each node's bit comes from its owner's
  share alone.
* Finding 5 / 6: Begin took 2,000,000 rows never aligned and the active party's word for the passive bin counts, and
  every idempotent NextNode rewrote the checkpoint. Now the passive parties' own word bounds both, and NextNode writes
  nothing.
"""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from tests.security.conftest import federation
from vflsec.services.config import MIN_NODE_ROWS, MIN_TRAINING_ROWS, parse_config
from vflsec.services.crypto import he, masking
from vflsec.services.engines.coordinator import Coordinator, QueryPolicy
from vflsec.services.errors import FailedPrecondition, ResourceExhausted
from vflsec.services.models.tree import steps, trainers
from vflsec.services.models.tree.binning import QuantileBins
from vflsec.services.transport.tensors import to_tensor
from vflsec.v1 import common_pb2, tree_pb2, tree_pb2_grpc

CODE = grpc.StatusCode


def _refused(call, request) -> tuple[grpc.StatusCode, str]:
    try:
        call(request, timeout=60)
    except grpc.RpcError as exc:
        return exc.code(), exc.details()
    return CODE.OK, ""


def _train(fed, family: str, settings: dict, backend: str = "plain") -> tuple[str, list[str]]:
    """A session of ``family`` grown on the first 120 aligned IDs (sorted); the rest are left for queries."""
    sid = fed.operator.create_session(backend, family=family, settings=settings).session_id
    common = sorted(fed.operator.align(sid))
    assert list(fed.operator.train(sid, common[:120], 1))[-1].done
    return sid, common[120:]


@pytest.fixture(scope="module")
def fed(tmp_path_factory):
    # passive-1 holds 10 of wine's 13 columns, so that it wins splits (a passive node to probe).
    with federation(tmp_path_factory.mktemp("tree-sec"), dataset="wine", n_passive=1, passive_features=10,
                    backend="plain") as fed:  # fmt: skip
        yield fed


def test_named_rows_cannot_shape_a_passive_threshold_and_thresholds_stay_home(fed) -> None:
    # The review's forest: depth 1, two bins, one candidate feature per node, no bootstrap, trained on two rows.
    settings = {"n_trees": 2, "max_depth": 1, "n_bins": 2, "bootstrap": False, "feature_fraction": 0.05}
    sid = fed.operator.create_session("plain", family="forest", settings=settings).session_id
    fed.operator.align(sid)
    to_passive = tree_pb2_grpc.TreePassiveStub(fed.channel("active", "passive-1"))
    to_coordinator = tree_pb2_grpc.TreeCoordinatorStub(fed.channel("active", "coordinator"))
    two = tree_pb2.TreeRows(session_id=sid, sample_index=[3, 7])
    code, message = _refused(to_passive.Begin, two)
    assert code == CODE.INVALID_ARGUMENT and "min_training_rows" in message
    d_active = fed.parties["active"].engine.data.X.shape[1]
    begin = tree_pb2.TreeBegin(session_id=sid, sample_index=[3, 7], bins=[tree_pb2.BinSizes(sizes=[2] * d_active)])
    code, message = _refused(to_coordinator.Begin, begin)
    assert code == CODE.INVALID_ARGUMENT and "min_training_rows" in message

    # The fewest rows it may name: the bins are still the passive party's whole shard's (every row it holds, aligned
    # or not, so neither the rows named here nor the IDs brought to PSI choose them), not theirs.
    named = list(range(0, 2 * MIN_TRAINING_ROWS, 2))
    to_passive.Begin(tree_pb2.TreeRows(session_id=sid, sample_index=named))
    passive = fed.parties["passive-1"].engine
    s = passive.session(sid)
    assert s.trainer.owner.bins == QuantileBins.fit(passive.data.X, 2)
    assert s.trainer.owner.bins != QuantileBins.fit(passive.data.X[s.rows][named], 2)

    # The default chain (empty) releases no passive threshold or bin, though passive-1 owns splits.
    sid, _ = _train(fed, "tree", {"max_depth": 2})
    forest = trainers.from_tensors(fed.operator.fetch_model(sid).tensors, "tree")
    passive_splits = [n for t in forest.trees for n in t.splits() if n.owner != 0]
    assert passive_splits and all(n.threshold is None and n.bin is None for n in passive_splits)


def test_a_crafted_active_share_neither_reads_nor_moves_a_passive_split(tmp_path, monkeypatch) -> None:
    with federation(tmp_path / "fed", dataset="wine", n_passive=1, passive_features=10) as fed:  # CKKS
        sid, queried = _train(fed, "tree", {"max_depth": 2}, "ckks")
        queried = queried[:20]
        honest = fed.operator.predict(sid, queried).scores
        owners = fed.parties["coordinator"].engine.session(sid).trainer.column_owners()
        column = int(np.flatnonzero(owners == 1)[0])  # a passive node (the released skeleton names owners)
        passive = fed.parties["passive-1"].engine
        s_p, s_a = passive.session(sid), fed.parties["active"].engine.session(sid)
        index = np.array([s_a.index_of[i] for i in queried])
        bits = trainers._shares(s_p.trainer.settings, s_p.trainer.owner, passive.data.X[s_p.rows[index]])[:, column]
        assert 0 < bits.sum() < bits.size  # the old coordinator refused exactly the rows whose bit is 1

        share = s_a.trainer.inference_share
        for offset in (1.0, -1.0, 0.4, 2.0**20):

            def crafted(x, offset=offset):  # type: ignore[no-untyped-def]
                out = share(x)
                out[:, column] += offset
                return out

            monkeypatch.setattr(s_a.trainer, "inference_share", crafted)
            for row in queried[:4]:  # one row per query: the review's probe
                released = fed.operator.predict(sid, [row]).scores  # never refused
                assert np.array_equal(released, honest[queried.index(row) : queried.index(row) + 1])
        monkeypatch.undo()


def test_begin_is_bounded_by_the_passive_parties_own_word_and_next_node_writes_nothing(fed) -> None:
    sid = fed.operator.create_session("plain", family="tree", settings={"max_depth": 1}).session_id
    fed.operator.align(sid)
    to_passive = tree_pb2_grpc.TreePassiveStub(fed.channel("active", "passive-1"))
    to_coordinator = tree_pb2_grpc.TreeCoordinatorStub(fed.channel("active", "coordinator"))
    d_active = fed.parties["active"].engine.data.X.shape[1]
    own = tree_pb2.BinSizes(sizes=[2] * d_active)

    def begin(rows, *bins):
        return tree_pb2.TreeBegin(session_id=sid, sample_index=rows, bins=[own, *bins])

    rows = list(range(40))
    sizes = list(to_passive.Begin(tree_pb2.TreeRows(session_id=sid, sample_index=rows)).sizes)
    # Finding 5: two million rows no one aligned; and rows of the right count, one of them never aligned.
    # The engine's bound (every family's): the rows the passive parties say they aligned.
    code, message = _refused(to_coordinator.Begin, begin(list(range(2_000_000))))
    assert code == CODE.INVALID_ARGUMENT and ("aligned" in message or "beyond" in message), message
    code, message = _refused(to_coordinator.Begin, begin([*rows[:-1], 10_000]))
    assert code == CODE.INVALID_ARGUMENT and "never aligned" in message, message
    # Finding 6: the passive bin counts are the passive party's word, not the active party's.
    code, message = _refused(to_coordinator.Begin, begin(rows, tree_pb2.BinSizes(sizes=[2**31 - 1] * len(sizes))))
    assert code == CODE.FAILED_PRECONDITION and "reports itself" in message
    assert _refused(to_coordinator.Begin, begin(rows))[0] == CODE.OK

    # Finding 5: an idempotent NextNode rewrites no checkpoint.
    checkpoint = fed.parties["coordinator"].engine.state.path / f"{sid}.npz"
    before = checkpoint.stat().st_mtime_ns, checkpoint.read_bytes()
    ref = common_pb2.SessionRef(session_id=sid)
    first = to_coordinator.NextNode(ref)
    for _ in range(3):
        assert to_coordinator.NextNode(ref) == first
    assert (checkpoint.stat().st_mtime_ns, checkpoint.read_bytes()) == before

    # Finding 6: negative class totals never reach the skeleton.
    key = tree_pb2.NodeKey(tree=first.tree, node_id=first.node_id)
    totals = np.array([50.0, -10.0, 0.0])
    request = tree_pb2.NodeTotals(session_id=sid, node=key, totals=to_tensor(totals))
    code, message = _refused(to_coordinator.OpenNode, request)
    assert code == CODE.INVALID_ARGUMENT and "non-negative" in message


def test_rule_3_minimum_node_size_is_policy(fed) -> None:
    """A session asking for leaves below [policy] min_node_rows is refused, naming the bound: by each passive party
    at Begin (its own policy, review 16 F1), and by the coordinator (its own, with the smallest value)."""
    sid = fed.operator.create_session("plain", family="tree", settings={"min_samples_leaf": 1}).session_id
    common = sorted(fed.operator.align(sid))
    with pytest.raises(grpc.RpcError) as refused:
        list(fed.operator.train(sid, common[:120], 1))
    assert refused.value.code() == CODE.FAILED_PRECONDITION
    assert f"this party's [policy] min_node_rows {MIN_NODE_ROWS}" in refused.value.details()
    holder = trainers.TREE.new_key_holder(2, ["passive-1"], trainers.TREE.settings({"min_samples_leaf": 1}))
    with pytest.raises(FailedPrecondition, match=f"this coordinator's \\[policy\\] min_node_rows {MIN_NODE_ROWS}"):
        holder.begin(120, [[16], [16]], MIN_NODE_ROWS)


def test_default_query_budget_is_finite(tmp_path) -> None:
    raw = {"role": "coordinator", "party_id": "coordinator", "listen": "127.0.0.1:0", "schema": {"active": 1},
           "tls": {"ca": "ca.pem", "cert": "c.pem", "key": "k.pem"}}  # fmt: skip
    config = parse_config(raw, base=tmp_path)
    assert 0 < config.query_budget == QueryPolicy().budget
    assert (config.min_training_rows, config.min_node_rows) == (MIN_TRAINING_ROWS, MIN_NODE_ROWS)


def test_node_decisions_are_charged_to_their_key_and_keys_rotate_past_the_budget(tmp_path, monkeypatch) -> None:
    """Rule 2 for trees (issue 27): the coordinator decrypts a node's per-bin products, but all that depends on them
    is the node's decision, one of 1 + Σ candidate bins outcomes; OpenNode charges its bits to the key epoch before
    anything is decrypted, and fresh keys (older ones dropped, their files removed) take over when a key's budget
    cannot. Cut to 12 bits here, each node of a depth-3 tree on wine's 13 features x 16 bins (8 bits a node) has its
    own key, and grows the same tree as under the default budget."""
    budget = 12
    charged: list[tuple[int, int, dict[int, int], set[int]]] = []
    decision = Coordinator._decision

    def recording(self, session_id, s, bits):
        epoch = decision(self, session_id, s, bits)
        charged.append((epoch, bits, dict(s.spent), set(s.epochs)))
        return epoch

    with federation(tmp_path / "fed", dataset="wine", n_passive=1, passive_features=10, backend="ckks") as fed:
        with monkeypatch.context() as m:
            m.setattr(he, "KEY_BUDGET", budget)
            m.setattr(Coordinator, "_decision", recording)
            sid, queries = _train(fed, "tree", {"max_depth": 3}, "ckks")
        rotated = fed.operator.predict(sid, queries).scores
        reference, _ = _train(fed, "tree", {"max_depth": 3}, "ckks")  # the default budget: one key
        assert np.array_equal(fed.operator.predict(reference, queries).scores, rotated)
        coordinator = fed.parties["coordinator"].engine
        held = coordinator.sessions[sid].epochs
        files = sorted(p.name for p in (tmp_path / "fed").rglob(f"{sid}.e*.bin"))
        with fed.channel("active", "coordinator") as channel:
            stub = tree_pb2_grpc.TreeCoordinatorStub(channel)
            old = _refused(stub.NodeKeys, tree_pb2.NodeKeysRequest(session_id=sid, key_epoch=0))
            current = stub.NodeKeys(tree_pb2.NodeKeysRequest(session_id=sid, key_epoch=max(held)), timeout=60)
        with pytest.raises(ResourceExhausted, match="at most"):  # the engine refuses a decision above a whole key
            coordinator._decision(sid, coordinator.sessions[sid], he.KEY_BUDGET + 1)

    epochs = [epoch for epoch, *_ in charged]
    assert len(charged) >= 3 and epochs == list(range(len(charged)))  # 8 + 8 > 12: a fresh key each node
    for epoch, bits, spent, live in charged:
        assert bits == 8 and spent[epoch] <= budget and live == {epoch}  # only the newest key is held
    assert list(held) == [epochs[-1]] and len(files) == 1  # the dropped keys' files are gone
    assert old[0] == CODE.FAILED_PRECONDITION and "not held" in old[1]
    assert current.public_context == held[epochs[-1]].public_context()


def test_crafted_indicators_cannot_make_a_refusal_read_a_passive_bins_weight(fed, monkeypatch) -> None:
    """Review 11 F2: the active party's [[Y]] put one target row's class mass at the node's weight, so that the
    coordinator chose a passive split whose true partition was lighter than min_samples_leaf, and Decide was refused
    naming that side's weight (6 of 8 targets; 2, 1, 3, 1, 1, 1 rows). Now the leaf size is judged on the passive
    party's own bin weights and counts must add up to them and to the class totals: no such refusal."""
    honest, chosen = trainers.LabelHolder.encrypt, {"row": 0}

    def crafted(self, backend, task, widest, pool=None):
        if task.depth < 1:
            return honest(self, backend, task, widest, pool)
        Y = np.zeros((task.rows.size, self.n_classes))
        Y[:, 1] = task.weights
        Y[chosen["row"] % task.rows.size] = 0.0
        Y[chosen["row"] % task.rows.size, 0] = task.weights.sum()
        Y = Y[:, : trainers.encrypted_classes(self.n_classes)]  # the classes that are encrypted
        layout = steps.indicator_layout(task, self.n_classes, widest, backend.slots, steps.product_parts(backend))
        return he.encrypt_to_wire(backend, Y, layout.replicas)

    monkeypatch.setattr(trainers.LabelHolder, "encrypt", crafted)
    for target in (0, 7, 19, 33):
        chosen["row"] = target
        sid = fed.operator.create_session("plain", family="tree", settings={"max_depth": 3}).session_id
        common = sorted(fed.operator.align(sid))
        assert list(fed.operator.train(sid, common[:120], 1))[-1].done  # no refusal, whatever the target


def test_crafted_products_cannot_read_chosen_labels_through_apply_split(fed, monkeypatch) -> None:
    """Review 11 F1: a passive party's products were [[Y]] times a plaintext of its choice (a target row alone in bin
    0 of feature f_c) with offsets in its mask sums, so that f_c won exactly when the row's class was c and ApplySplit
    named it (7 of 7 labels, 40 of 40 over a forest). Now counts that do not add up to the party's bin weights and the
    class totals are no candidate: the crafted features never win, so ApplySplit never names one. The last class's
    counts are the party's bin weights less the other classes' (K − 1 encrypted columns), so its offset is crafted
    in the bin weights it sends: caught the same way."""
    targets: dict = {}
    named: list = []
    honest_weights = trainers.FeatureOwner.bin_weights
    last = {}

    def crafted(self, backend, encrypted, task, rng):
        sizes, feats = self.bins.sizes, list(task.features.get(self.party, ()))
        offsets = np.cumsum([0] + [sizes[f] for f in feats])
        usable = [i for i, f in enumerate(feats) if sizes[f] >= 2][:3]
        X = np.zeros((task.rows.size, int(offsets[-1])))
        for i in usable:
            X[0, offsets[i]] = 1.0
        fold, parts = steps.product_fold(task), steps.product_parts(backend)
        products, mask_sums = masking.masked_feature_products(backend, encrypted, X, rng, fold=fold, parts=parts)
        weights = honest_weights(self, task)
        for c, i in enumerate(usable):
            if c < mask_sums.shape[1]:
                mask_sums[offsets[i], c] -= 3.0
                mask_sums[offsets[i] + 1, 0] -= float(task.weights.sum())
            else:  # the last class: its counts are the bin weights less the others'
                weights[offsets[i]] += 3.0
        last[task.key] = weights
        targets[task.key] = [feats[i] for i in usable]
        return products, mask_sums

    apply_split = trainers.TreePassive.apply_split

    def recording(self, node, feature, bin_index):
        named.append((node["tree"], node["node_id"], feature))
        return apply_split(self, node, feature, bin_index)

    monkeypatch.setattr(trainers.FeatureOwner, "masked_products", crafted)
    monkeypatch.setattr(
        trainers.FeatureOwner, "bin_weights", lambda self, task: last.get(task.key, honest_weights(self, task))
    )
    monkeypatch.setattr(trainers.TreePassive, "apply_split", recording)
    sid = fed.operator.create_session("plain", family="tree", settings={"max_depth": 4}).session_id
    common = sorted(fed.operator.align(sid))
    assert list(fed.operator.train(sid, common[:120], 1))[-1].done
    assert targets and not named  # every passive feature's counts were crafted: none was a candidate


def test_products_made_for_another_copy_of_the_node_are_refused_unopened(fed, monkeypatch) -> None:
    """Review 12 R2: the passive party made its bin weights and products on the node as the active party sent it, so
    fake multiplicities (the target row heavy, the node's sum kept) with matching [[Y]] and totals passed both sums
    and Decide was refused naming a passive side's true weight (4 of 8 targets at 64 bins: 1, 3, 3, 1). Now the
    passive party sends the digest of the node it made them for, and the coordinator opens them only for its own
    copy: the refusal names the node, never a weight."""
    from vflsec.services.transport import tree_links

    chosen = {"row": 0}
    honest_totals, honest_encrypt = trainers.LabelHolder.totals, trainers.LabelHolder.encrypt
    honest_counts = tree_links.TreePassiveClient.node_counts

    def fake(task) -> np.ndarray:
        weights = np.ones_like(task.weights)
        weights[chosen["row"] % task.rows.size] = task.weights.sum() - (task.rows.size - 1)
        return weights

    def totals(self, task):
        if task.depth:
            return honest_totals(self, task)
        w, t = fake(task), chosen["row"] % task.rows.size
        return np.array([w[t], w.sum() - w[t]] + [0.0] * (self.n_classes - 2))

    def encrypt(self, backend, task, widest, pool=None):
        if task.depth:
            return honest_encrypt(self, backend, task, widest, pool)
        w, t = fake(task), chosen["row"] % task.rows.size
        Y = np.zeros((task.rows.size, self.n_classes))
        Y[:, 1], Y[t] = w, 0.0
        Y[t, 0] = w[t]
        layout = steps.indicator_layout(task, self.n_classes, widest, backend.slots, steps.product_parts(backend))
        replicas = layout.replicas
        return he.encrypt_to_wire(backend, Y[:, : trainers.encrypted_classes(self.n_classes)], replicas)

    def node_counts(self, session_id, node, indicators, key_epoch):
        if node["depth"] == 0:
            node = {**node, "weights": fake(trainers.Task.from_json(dict(node))).tolist()}
        return honest_counts(self, session_id, node, indicators, key_epoch)

    monkeypatch.setattr(trainers.LabelHolder, "totals", totals)
    monkeypatch.setattr(trainers.LabelHolder, "encrypt", encrypt)
    monkeypatch.setattr(tree_links.TreePassiveClient, "node_counts", node_counts)
    settings = {"n_trees": 1, "max_depth": 2, "bootstrap": True, "feature_fraction": 1.0, "n_bins": 64}
    for target in (11, 37, 52, 64):  # each refused naming a weight before
        chosen["row"] = target
        sid = fed.operator.create_session("plain", family="forest", settings=settings).session_id
        common = sorted(fed.operator.align(sid))
        with pytest.raises(grpc.RpcError) as refused:
            list(fed.operator.train(sid, common[:120], 1))
        assert "another version of node" in refused.value.details() and "weight" not in refused.value.details()
