"""A tree node's products in the passive party's process pool (services/crypto/product_pool.py), real CKKS: the same
counts as in process, a bad ciphertext refused as before, and the workers gone after an error or close()."""

import concurrent.futures
import os

import numpy as np
import pytest

from vflsec.services.crypto import entropy, he, product_pool
from vflsec.services.errors import InvalidArgument
from vflsec.services.models.tree import KeyHolder, LabelHolder, TreeConfig
from vflsec.services.models.tree.steps import FeatureOwner, Task


@pytest.fixture(scope="module")
def node():
    """A 1,500-row binary node over 5 passive features of 12 bins (D = 60 columns, several chunks and groups, the
    last group short), its encrypted indicators as they leave the active party, the key holder's keys and the
    counts in the clear."""
    rng = np.random.default_rng(3)
    X, y = rng.normal(size=(1500, 5)), rng.integers(0, 2, 1500)
    owner = FeatureOwner.fit(1, X, TreeConfig(n_bins=12))
    task = Task(0, 0, 0, np.arange(1500), rng.integers(1, 3, 1500).astype(float), {1: tuple(range(5))})
    keys = he.CkksBackend.keyholder()
    public = he.open_public("ckks", keys.public_context())
    indicators = LabelHolder(y, 2).indicators(task)
    # every class but the last, as a product operand (2^30, one prime lower); 9 groups of 7 columns
    sent = he.encrypt_matrix(public, indicators[:, :1], replicas=7, form=he.OPERAND)
    assert sent.layout.n_chunks > 1 and owner.width(task) % sent.layout.replicas  # chunks, and a short last group
    expected = indicators.T @ owner.indicator_matrix(task)  # the per-bin class counts, in the clear
    return owner, task, keys, public, sent, he.matrix_to_wire(public, sent), expected


def _counts(node, products, mask_sums):
    owner, task, keys, _, sent, _, _ = node
    return KeyHolder(keys).open_counts(
        1, task, owner.width(task), sent.layout, products, mask_sums, owner.bin_weights(task)
    )


def _segments() -> set[str]:
    return {name for name in os.listdir("/dev/shm") if name.startswith("psm_")}


def _recording(monkeypatch) -> list[str]:
    """The names of the shared segments the pool makes from now on (another test worker's come and go meanwhile)."""
    made: list[str] = []
    write = product_pool._Shared.write

    def recorded(cls, wire):
        shared, segment = write(wire)
        made.append(segment.name.lstrip("/"))
        return shared, segment

    monkeypatch.setattr(product_pool._Shared, "write", classmethod(recorded))
    return made


def test_pooled_products_open_to_the_in_process_counts(node, monkeypatch):
    owner, task, _, public, sent, wire, expected = node
    monkeypatch.setattr(product_pool, "MIN_POOLED_PRODUCTS", 0)
    pool, made = product_pool.ProductPool(workers=2), _recording(monkeypatch)
    try:
        products, mask_sums = owner.pooled_products(pool, public, wire, task)
        workers = list(pool._pool._processes.values())  # type: ignore[union-attr]
        assert len(workers) == 2 and all(w.is_alive() for w in workers)  # made in the pool, not in this process
        assert made and not set(made) & _segments()  # the node's shared indicators unlinked once its products are in
    finally:
        pool.close()
    assert pool._pool is None and not any(w.is_alive() for w in workers)
    local, local_sums = owner.masked_products(public, sent, task, entropy.os_entropy())
    assert len(products) == len(local) and mask_sums.shape == local_sums.shape  # what crosses the wire: same shape
    assert not np.array_equal(mask_sums, local_sums)  # each process drew its own masks
    counts = _counts(node, products, mask_sums)
    np.testing.assert_array_equal(counts, _counts(node, [public.serialize(ct) for ct in local], local_sums))
    np.testing.assert_array_equal(counts, expected)


def test_a_bad_ciphertext_is_refused_as_in_process_and_the_pool_shut_down(node, monkeypatch):
    owner, task, _, public, _, wire, _ = node
    monkeypatch.setattr(product_pool, "MIN_POOLED_PRODUCTS", 0)
    broken = he.WireMatrix(wire.shape, wire.replicas, wire.rows_per_ct, [*wire.ciphertexts[:-1], b"not a ciphertext"])
    with pytest.raises(InvalidArgument) as in_process:
        owner.pooled_products(product_pool.ProductPool(workers=1), public, broken, task)
    pool, made = product_pool.ProductPool(workers=2), _recording(monkeypatch)
    with pytest.raises(InvalidArgument) as pooled:
        owner.pooled_products(pool, public, broken, task)
    assert str(pooled.value) == str(in_process.value)
    assert str(pooled.value).startswith("indicators: invalid CKKS ciphertext")
    # Indicators of another form (a fresh encryption at the global scale) are refused before a product is made.
    fresh = he.matrix_to_wire(public, he.encrypt_matrix(public, np.ones((task.rows.size, 1)), replicas=7))
    with pytest.raises(InvalidArgument, match="indicators: ciphertext 0 has 2 polynomials, 3 primes"):
        owner.pooled_products(product_pool.ProductPool(workers=1), public, fresh, task)
    assert pool._pool is None  # shut down on the error; the next node starts fresh workers
    assert made and not set(made) & _segments()  # nor is its shared copy left behind
    products, _ = owner.pooled_products(pool, public, wire, task)
    assert products and pool._pool is not None
    pool.close()


def test_workers_follow_the_environment(monkeypatch):
    monkeypatch.setenv(product_pool.WORKERS_ENV, "3")
    assert product_pool.ProductPool().workers == 3
    monkeypatch.setenv(product_pool.WORKERS_ENV, "0")
    with pytest.raises(ValueError, match=f"{product_pool.WORKERS_ENV} must be a positive integer"):
        product_pool.ProductPool()


def test_pool_workers_exit_with_their_caller() -> None:
    """Review 20: a caller killed with SIGKILL left its forkserver workers (blocked on a queue they hold both ends of)
    and so the resource tracker, which unlinks its shared memory only once they have gone: a node's indicators stayed
    in /dev/shm. A worker now exits when its caller does (psi.exit_with), here a stand-in caller."""
    import subprocess
    import time

    from vflsec.services.crypto import psi

    caller = subprocess.Popen(["sleep", "60"])
    executor = concurrent.futures.ProcessPoolExecutor(
        max_workers=1, mp_context=psi.forkserver(), initializer=psi.exit_with, initargs=(caller.pid,)
    )
    try:
        worker = executor.submit(os.getpid).result(timeout=60)
        assert psi._alive(worker)
        caller.kill()
        caller.wait()
        deadline = time.monotonic() + 10
        while psi._alive(worker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not psi._alive(worker)
    finally:
        caller.kill()
        executor.shutdown(wait=False, cancel_futures=True)


def test_pooled_encryptions_are_the_in_process_layout_each_under_its_own_randomness(node):
    """The active party's [[Y]] encrypted by the pool's workers: the layout and form he.encrypt_to_wire gives, the
    same values to the key holder, and every ciphertext its own: equal rows in every chunk (what each worker is
    handed alike) encrypt to distinct ciphertexts, so no worker repeats another's or its own randomness (rule 1)."""
    _, _, keys, public, _, _, _ = node
    column = np.tile(np.arange(1.0, 586.0), 21)[:, None]  # 21 chunks of 585 rows x 7 replicas, every one alike
    pool = product_pool.ProductPool(workers=2)
    try:
        wire = pool.encrypt_to_wire(public, column, 7, form=he.OPERAND)
        workers = list(pool._pool._processes.values())  # type: ignore[union-attr]
        assert len(workers) == 2  # made in the pool
    finally:
        pool.close()
    alone = he.encrypt_to_wire(public, column, 7, form=he.OPERAND)
    assert (wire.shape, wire.replicas, wire.rows_per_ct) == (alone.shape, alone.replicas, alone.rows_per_ct)
    assert len(wire.ciphertexts) == len(alone.ciphertexts) >= 2 * product_pool.MIN_POOLED_ENCRYPTIONS
    vectors = he.MatrixLayout.for_matrix(column.shape, 7, public.slots).pack(column)
    assert (vectors == vectors[0]).all()  # the chunks are alike
    assert len(set(wire.ciphertexts)) == len(wire.ciphertexts)
    received = he.matrix_from_wire(keys, wire)
    keys.check_form(received.ciphertexts, product=False, form=he.OPERAND)
    np.testing.assert_allclose(he.decrypt_matrix(keys, received), column, atol=1e-3)
    few = product_pool.ProductPool(workers=2)
    assert len(few.encrypt_to_wire(public, column[:300], 7, form=he.OPERAND).ciphertexts) < 8 and few._pool is None
