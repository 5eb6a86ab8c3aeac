"""embedding_noise's per-row release budget through a live federation (loopback gRPC, mTLS, plain split-NN
active-top): the passive party answers each aligned row at most ``max_answers`` times a session in the clear
(training and inference), refuses the next request for that row with RESOURCE_EXHAUSTED naming the bound, counts
nothing for a refused request or for the same training request asked again, and keeps its counts over a restart."""

from __future__ import annotations

import numpy as np
import pytest

from vflsec.client.federation.launcher import FederationSpec, run_in_process, write_federation
from vflsec.client.federation.operator import Operator
from vflsec.services.app import start_party
from vflsec.services.config import load_config
from vflsec.services.data import datasets
from vflsec.services.errors import PeerFailed
from vflsec.services.transport import tls
from vflsec.services.transport.links import PassiveClient
from vflsec.services.transport.server import peer_channel

N, D_A, D_B, BOUND, WIDTH = 200, 3, 4, 3, 8
PASSIVE = "passive-1"


def _dataset() -> datasets.Dataset:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(N, D_A + D_B))
    y = (X[:, 0] + X[:, D_A] > 0).astype(np.int64)
    ids = np.array([f"s{i:04d}" for i in range(N)])
    return datasets.Dataset("budget", ids, X, y, [f"f{j}" for j in range(D_A + D_B)], ["0", "1"])


def test_each_row_is_answered_at_most_max_answers_times_and_a_restart_keeps_the_counts(tmp_path) -> None:
    spec = FederationSpec(
        _dataset(), n_passive=1, passive_features=D_B, backend="plain", model="splitnn", topology="active-top",
        embedding_release=[f"embedding_noise:sigma=0.1,max_answers={BOUND}"], checkpoints=True,
    )  # fmt: skip
    layout = write_federation(spec, tmp_path / "fed")
    active = next(party for party in layout.configs if tls.role_of(party) == "active")
    with run_in_process(layout) as parties, layout.operator_channel() as channel:
        operator = Operator(channel)
        info = operator.create_session("plain", family="splitnn", settings={"topology": "active-top"}, seed=1)
        sid = info.session_id
        common = operator.align(sid)
        list(operator.train(sid, common, 1))  # one epoch: every aligned row answered once
        engine = parties[PASSIVE].engine
        s = engine.sessions[sid]
        assert s.embedding.announced() == [("embedding_noise", {"sigma": "0.1", "max_answers": str(BOUND)})]
        assert s.answers is not None and s.answers.dtype == np.uint16
        assert np.array_equal(s.answers, np.ones(len(common), dtype=np.uint16))

        with peer_channel(layout.addresses[PASSIVE], PASSIVE, layout.tls(active), 64 << 20) as peer:
            link = PassiveClient(PASSIVE, peer).splitnn
            # the next training step, asked twice (a redo at the same weights): counted once
            step = s.completed_step + 1
            rows = np.array([0, 1])
            first = link.plain_forward(sid, step, rows, WIDTH)
            assert np.array_equal(link.plain_forward(sid, step, rows, WIDTH), first)
            assert s.answers[:3].tolist() == [2, 2, 1]
            link.plain_forward(sid, 0, np.array([0]), WIDTH)  # inference counts too: row 0 is at its bound
            with pytest.raises(PeerFailed) as err:
                link.plain_forward(sid, 0, np.array([2, 0]), WIDTH)
            assert err.value.code == "RESOURCE_EXHAUSTED"
            assert f"embedding_noise max_answers = {BOUND}" in str(err.value)
            assert "sample index 0" in str(err.value)
            assert s.answers[:3].tolist() == [3, 2, 1]  # nothing counted for the refused request
            link.plain_forward(sid, 0, np.array([2]), WIDTH)  # other rows are still answered

        # a restart resumes the session from its checkpoint with the counts as they were
        parties[PASSIVE].stop()
        parties[PASSIVE] = start_party(load_config(layout.configs[PASSIVE], "passive"))
        restored = parties[PASSIVE].engine.sessions[sid]
        assert restored.answers is not None and restored.answers[:3].tolist() == [3, 2, 2]
        with peer_channel(layout.addresses[PASSIVE], PASSIVE, layout.tls(active), 64 << 20) as peer:
            link = PassiveClient(PASSIVE, peer).splitnn
            assert link.plain_forward(sid, step, rows, WIDTH).shape == (2, WIDTH)  # the same request: not counted
            with pytest.raises(PeerFailed) as err:
                link.plain_forward(sid, 0, np.array([0]), WIDTH)
            assert err.value.code == "RESOURCE_EXHAUSTED"
            assert restored.answers[:3].tolist() == [3, 2, 2]
