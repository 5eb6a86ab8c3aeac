"""Malformed plaintext tensors (wrong dtype, shape, size, NaN/inf) are InvalidArgument, never another error.

No request carries a Tensor, but replies do (released scores, block sums, weight blocks): a party decoding a
faulty peer's reply must turn any defect into a precise status, not an INTERNAL error.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, seed, settings
from hypothesis import strategies as st

from vflsec.services.errors import InvalidArgument
from vflsec.services.transport.tensors import MAX_ELEMENTS, from_tensor, to_tensor
from vflsec.v1 import common_pb2

DTYPES = {common_pb2.DTYPE_FLOAT64: 8, common_pb2.DTYPE_FLOAT32: 4, common_pb2.DTYPE_INT64: 8}
DIM = st.one_of(st.integers(0, 5), st.sampled_from([-1, 2**31, 2**32, 2**62, 2**63 - 1]))


@st.composite
def tensors(draw: st.DrawFn) -> common_pb2.Tensor:
    dtype = draw(st.one_of(st.sampled_from(sorted(DTYPES)), st.integers(-5, 10)))
    shape = draw(st.lists(DIM, max_size=4))
    count = math.prod(shape) if all(0 <= d <= 64 for d in shape) else 0
    exact = bytes(count * DTYPES.get(dtype, 8))
    data = draw(st.one_of(st.just(exact), st.binary(max_size=80)))
    if data and dtype != common_pb2.DTYPE_INT64 and draw(st.booleans()):  # a NaN or inf among the elements
        special = np.array([draw(st.sampled_from([np.nan, np.inf, -np.inf]))], dtype="<f8" if dtype == 1 else "<f4")
        data = special.tobytes() + data[special.itemsize :] if len(data) >= special.itemsize else data
    return common_pb2.Tensor(dtype=dtype, shape=shape, data=data)


@seed(7)
@settings(max_examples=3000, deadline=None, database=None)
@given(tensor=tensors(), ndim=st.one_of(st.none(), st.integers(0, 3)))
def test_malformed_tensors_are_invalid_argument(tensor: common_pb2.Tensor, ndim: int | None) -> None:
    try:
        array = from_tensor(tensor, "t", ndim=ndim)
    except InvalidArgument:
        return
    # Accepted: exactly what the header promised, and finite.
    assert tensor.dtype in DTYPES and array.shape == tuple(tensor.shape)
    assert array.nbytes == len(tensor.data) and (ndim is None or array.ndim == ndim)
    assert array.dtype.kind == "i" or np.isfinite(array).all()


@pytest.mark.parametrize("shape", [[2**32, 2**32], [2**62, 4], [2**21, 2**21, 2**21], [0, 2**62]])
def test_shapes_whose_int64_product_wraps_are_rejected(shape: list[int]) -> None:
    """Regression: the element count was an int64 product, which wraps to 0 and matched empty data; and an
    empty shape with a huge extent passed the count check but made numpy's reshape raise ValueError."""
    assert math.prod(d for d in shape if d) > MAX_ELEMENTS
    with pytest.raises(InvalidArgument, match="too large"):
        from_tensor(common_pb2.Tensor(dtype=common_pb2.DTYPE_FLOAT64, shape=shape, data=b""), "t")


def test_round_trip_still_works() -> None:
    value = np.arange(6, dtype=np.float64).reshape(2, 3)
    np.testing.assert_array_equal(from_tensor(to_tensor(value), "t", shape=(2, None)), value)
