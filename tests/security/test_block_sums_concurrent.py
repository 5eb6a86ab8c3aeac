"""Block sums are decrypted outside the session lock (parties' requests of a step side by side): concurrent
requests still get one answer per party and step, repeats the very same flooded sums; while one request is being
decrypted, another of the same party and step is refused."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from tests.security.test_restart_policy import _coordinator, _open, _products, _scores
from vflsec.services.errors import FailedPrecondition

TAG = bytes(range(32))  # the caller's mask_tag (entropy.tag of its masks' context)


def test_concurrent_repeats_get_the_same_sums_and_another_request_nothing(tmp_path) -> None:
    c = _coordinator(tmp_path)
    _open(c)
    probs = _scores(c)
    blobs, other = _products(c, probs), _products(c, probs, mask_bound=1.0)
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: c.block_sums("s", 1, "passive-1", blobs, 2, TAG), range(4)))
    for sums in answers[1:]:
        np.testing.assert_array_equal(sums, answers[0])
    np.testing.assert_array_equal(c.block_sums("s", 1, "passive-1", other, 2, TAG), answers[0])  # nothing decrypted
    # The recorded answer survives a restart unchanged.
    np.testing.assert_array_equal(_coordinator(tmp_path).block_sums("s", 1, "passive-1", blobs, 2, TAG), answers[0])


def test_another_request_while_one_is_decrypted_is_refused(tmp_path, monkeypatch) -> None:
    import threading

    from vflsec.services.crypto import masking

    c = _coordinator(tmp_path)
    _open(c)
    probs = _scores(c)
    blobs, other = _products(c, probs), _products(c, probs, mask_bound=1.0)
    started, release = threading.Event(), threading.Event()
    block_sums = masking.block_sums

    def slow(*args, **kwargs):
        started.set()
        release.wait(30)
        return block_sums(*args, **kwargs)

    monkeypatch.setattr(masking, "block_sums", slow)
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(c.block_sums, "s", 1, "passive-1", blobs, 2, TAG)
        assert started.wait(30)
        with pytest.raises(FailedPrecondition, match="being computed from another request"):
            c.block_sums("s", 1, "passive-1", other, 2, TAG)
        release.set()
        sums = first.result(30)
    np.testing.assert_array_equal(c.block_sums("s", 1, "passive-1", other, 2, TAG), sums)
