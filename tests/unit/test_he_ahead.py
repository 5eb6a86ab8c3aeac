"""ZeroPool: encryptions of zero made ahead are each handed out once, and an encryption through the pool is an
ordinary fresh CKKS encryption (same form, same precision)."""

from __future__ import annotations

import itertools

import numpy as np

from vflsec.services.crypto import he


def _drain() -> None:
    he._AHEAD.submit(lambda: None).result()  # one worker, first in first out: every refill before it is done


def test_each_zero_is_handed_out_once_and_the_pool_stays_bounded() -> None:
    made = itertools.count()
    pool = he.ZeroPool(lambda size: (size, next(made)), depth=2, sizes=3)
    handed = []
    for size in [5, 5, 5, 7, 9, 11, 5, 5, 11, 11, 11]:
        _drain()
        zero = pool.take(size)
        if zero is not None:
            assert zero[0] == size
            handed.append(zero)
    _drain()
    assert len(handed) == len(set(handed)) >= 5
    assert len(pool._ready) <= 3 and all(len(q) <= 2 for q in pool._ready.values())
    assert 7 not in pool._ready  # the least recently used size made room


def test_an_encryption_through_the_pool_is_a_fresh_encryption() -> None:
    keys = he.make_keyholder("ckks")
    public = he.open_public("ckks", keys.public_context())
    values = np.linspace(-3.0, 3.0, 1000)
    blobs = []
    for _ in range(4):
        _drain()  # the next encryption takes an Enc(0) made ahead
        ct = public.encrypt(values, ahead=True)
        keys.check_form([ct], product=False)
        assert np.abs(keys.decrypt(ct) - values).max() < 1e-6
        blobs.append(public.serialize(ct))
    assert len(set(blobs)) == len(blobs)  # never the same Enc(0) twice (equal messages would give equal bytes)
    assert public._zeros.take(1000) is not None
