"""Review 21: the step's answer must be durable before any of it is released. Every repeat of a block-sums request
gets the step's one answer whatever its bytes, and a request a stopped coordinator never finished is replaced by the
party's next one with a fresh flooding seed. So sums released from memory but never written (their save failed:
a full disk, an I/O error) let the party, after a restart, have the step decrypted again under independent flooding:
two samples of one step's sums to average."""

from __future__ import annotations

import numpy as np
import pytest

from tests.security.test_restart_policy import _coordinator, _open, _products, _scores

TAG = bytes(range(32))  # the caller's mask_tag (entropy.tag of its masks' context)


@pytest.mark.parametrize("outcome", ["sums", "refusal"])
def test_an_answer_whose_save_failed_is_not_released(tmp_path, monkeypatch, outcome: str) -> None:
    state = tmp_path / "state"
    c = _coordinator(state)
    _open(c)
    probs = _scores(c)
    blobs = _products(c, probs) if outcome == "sums" else _products(c, probs, mask_bound=1e9)  # out of range
    saves = {"n": 0}
    save = c._save

    def failing_save(session_id, s):
        saves["n"] += 1
        if saves["n"] == 2:  # the first records the request before parsing, the second its outcome
            raise OSError(28, "No space left on device")
        return save(session_id, s)

    monkeypatch.setattr(c, "_save", failing_save)
    with pytest.raises(OSError):
        c.block_sums("s", 1, "passive-1", blobs, 2, TAG)
    monkeypatch.undo()
    other = _products(c, probs)  # the party's next request, other bytes
    first = _outcome(lambda: c.block_sums("s", 1, "passive-1", other, 2, TAG))
    second = _outcome(lambda: _coordinator(state).block_sums("s", 1, "passive-1", _products(c, probs), 2, TAG))
    # Whatever the party got before the restart, it gets again after it: one outcome for the step.
    assert first[0] == second[0]
    if first[0] == "sums":
        np.testing.assert_array_equal(first[1], second[1])


def _outcome(call):
    try:
        return "sums", call()
    except Exception as exc:  # the outcome (a refusal) is what is compared
        return type(exc).__name__, str(exc)
