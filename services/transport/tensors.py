"""Plaintext tensors on the wire: numpy <-> ``vflsec.v1.Tensor`` with validation at every boundary."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from vflsec.services.errors import InvalidArgument
from vflsec.v1 import common_pb2

_TO_NUMPY = {
    common_pb2.DTYPE_FLOAT64: np.dtype("<f8"),
    common_pb2.DTYPE_FLOAT32: np.dtype("<f4"),
    common_pb2.DTYPE_INT64: np.dtype("<i8"),
}
_FROM_NUMPY = {np.dtype(v).str: k for k, v in _TO_NUMPY.items()}

MAX_ELEMENTS = 1 << 28  # 2 GiB of float64: far beyond any message limit, guards shape overflow


def to_tensor(array: np.ndarray) -> common_pb2.Tensor:
    array = np.asarray(array)
    if array.dtype.kind == "f":
        array = array.astype("<f8" if array.dtype.itemsize == 8 else "<f4", copy=False)
    elif array.dtype.kind in "iub":
        array = array.astype("<i8", copy=False)
    dtype = _FROM_NUMPY.get(array.dtype.str)
    if dtype is None:
        raise TypeError(f"cannot send dtype {array.dtype} as a Tensor")
    return common_pb2.Tensor(dtype=dtype, shape=list(array.shape), data=np.ascontiguousarray(array).tobytes())


def from_tensor(
    tensor: common_pb2.Tensor,
    name: str,
    *,
    ndim: int | None = None,
    shape: Sequence[int | None] | None = None,
    finite: bool = True,
) -> np.ndarray:
    """Decode and validate a Tensor; every failure is an :class:`InvalidArgument` naming the field."""
    dtype = _TO_NUMPY.get(tensor.dtype)
    if dtype is None:
        raise InvalidArgument(f"{name}: unsupported dtype {tensor.dtype}")
    dims = list(tensor.shape)
    if any(d < 0 for d in dims):
        raise InvalidArgument(f"{name}: negative dimension in shape {dims}")
    # Python integers: an int64 product wraps around (2^32 x 2^32 -> 0) and would pass the size check. The
    # nonzero extents are bounded too: numpy refuses an empty shape like (0, 2^62) whose extent overflows.
    count = math.prod(dims)
    if math.prod(d for d in dims if d) > MAX_ELEMENTS:
        raise InvalidArgument(f"{name}: shape {dims} is too large")
    if len(tensor.data) != count * dtype.itemsize:
        raise InvalidArgument(
            f"{name}: {len(tensor.data)} data bytes do not match shape {dims} of {dtype.name}"
            f" ({count * dtype.itemsize} expected)"
        )
    if ndim is not None and len(dims) != ndim:
        raise InvalidArgument(f"{name}: expected {ndim} dimensions, got shape {dims}")
    if shape is not None and (
        len(dims) != len(shape) or any(w is not None and w != d for w, d in zip(shape, dims, strict=True))
    ):
        want = ["*" if w is None else w for w in shape]
        raise InvalidArgument(f"{name}: expected shape {want}, got {dims}")
    array = np.frombuffer(tensor.data, dtype=dtype).reshape(dims)
    if finite and dtype.kind == "f" and not np.isfinite(array).all():
        raise InvalidArgument(f"{name}: contains NaN or infinite values")
    return array
