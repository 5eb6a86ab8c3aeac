"""The coordinator's query policy: budget (per owner), refusal of training IDs, query size; each a precise
status."""

from __future__ import annotations

import grpc
import pytest

from tests.integration.conftest import federation


def _status(call, *args) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as err:
        call(*args)
    return err.value.code(), err.value.details()


def test_query_policy(tmp_path) -> None:
    policy = {"query_budget": 60, "refuse_training_ids": True, "max_query_rows": 40}
    with federation(tmp_path, dataset="breast_cancer", n_passive=1, query_policy=policy, allow_plain=True) as fed:
        info = fed.operator.create_session("plain", seed=0)
        common = sorted(fed.operator.align(info.session_id))
        train, held_out = common[:200], common[200:]
        list(fed.operator.train(info.session_id, train, 1))

        code, details = _status(fed.operator.predict, info.session_id, [held_out[0], train[5]])
        assert code == grpc.StatusCode.PERMISSION_DENIED and "used in training" in details

        code, details = _status(fed.operator.predict, info.session_id, held_out[:41])
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "limit is 40" in details

        assert fed.operator.predict(info.session_id, held_out[:40]).scores.shape == (40, 2)
        assert fed.operator.predict(info.session_id, held_out[40:60]).scores.shape == (20, 2)
        code, details = _status(fed.operator.predict, info.session_id, held_out[60:61])
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "60 of 60" in details
        # The budget is the owner's, not the session's: a new session does not reset it.
        other = fed.operator.create_session("plain", seed=1)
        other_common = sorted(fed.operator.align(other.session_id))
        list(fed.operator.train(other.session_id, other_common[:200], 1))
        code, details = _status(fed.operator.predict, other.session_id, other_common[200:201])
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED and "60 of 60" in details
