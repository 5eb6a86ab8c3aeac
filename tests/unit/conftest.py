"""Fixtures shared by the unit tests."""

from collections.abc import Iterator

import pytest

from vflsec.services.attacks.gradient import torch_threads


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """Tiny networks: torch's intra-op threads only contend (x20 slower on a loaded 2-core machine)."""
    with torch_threads(1):
        yield
