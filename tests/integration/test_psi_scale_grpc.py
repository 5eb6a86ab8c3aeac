"""A 100k x 100k alignment through the live services (real gRPC + mTLS), by each protocol: OPRF (the default: U in
4 chunks of rows, the passive values in 3) and ECDH (the streamed exchange in 13 chunks a list, each party's process
pool). The known intersection comes back exactly, and common index i is the same sample on the active and the
passive side, row for row. (The same on the ECDH functions alone: tests/unit/test_psi_scale.py.) Marked long: OPRF
about 9 s on a shared host, ECDH about 40 CPU-seconds of curve work, over a minute."""

from __future__ import annotations

import numpy as np
import pytest

from tests.integration.conftest import federation

N = 100_000


@pytest.mark.long
@pytest.mark.parametrize("protocol", ["oprf", "ecdh"])
def test_100k_alignment_over_grpc_returns_exactly_the_known_intersection_row_for_row(tmp_path, protocol: str) -> None:
    rng = np.random.default_rng(0)  # the input rows only; the protocol draws from OS entropy
    common = [f"c{i:07d}" for i in range(int(0.9 * N))]
    active = np.array(common + [f"a{i:07d}" for i in range(N - len(common))])[rng.permutation(N)]
    passive = np.array(common + [f"p{i:07d}" for i in range(N - len(common))])[rng.permutation(N)]
    with federation(tmp_path, n_passive=1, allow_plain=True, psi_protocol=protocol) as fed:
        engines = {party: fed.parties[party].engine for party in ("active", "passive-1")}
        # Alignment reads the parties' IDs only (their features are not touched until training).
        engines["active"].data.ids, engines["passive-1"].data.ids = active, passive
        session_id = fed.operator.create_session("plain", seed=0).session_id
        aligned = fed.operator.align(session_id)
        active_rows = engines["active"].session(session_id).rows
        passive_rows = engines["passive-1"].session(session_id).rows
    assert len(aligned) == len(common) and set(aligned) == set(common)
    assert aligned == active[active_rows].tolist()  # the operator's order is the common order
    assert active[active_rows].tolist() == passive[passive_rows].tolist()  # the same sample at each common index
