"""Imported before any test module: vflsec must load before grpc so that its TLS pin is in force."""

from collections.abc import Iterator
from contextlib import contextmanager

import vflsec  # noqa: F401  (sets GRPC_SSL_CIPHER_SUITES before grpc reads it; see proto/vflsec/__init__.py)


@contextmanager
def pinned_initial_weights(seed: int) -> Iterator[None]:
    """Test-only: every split-NN module a service builds in this process starts as the central reference's of
    ``seed`` (parity tests). A deployment draws each module's weights from its holder's OS entropy
    (services/models/splitnn/modules.py own_seed); no RPC, configuration or CLI flag reaches this hook."""
    from vflsec.services.models.splitnn import modules

    drawn = modules.own_seed
    modules.own_seed = lambda: seed
    try:
        yield
    finally:
        modules.own_seed = drawn
