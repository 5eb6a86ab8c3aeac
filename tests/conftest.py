"""Imported before any test module: vflsec must load before grpc so that its TLS pin is in force."""

import vflsec  # noqa: F401  (sets GRPC_SSL_CIPHER_SUITES before grpc reads it; see proto/vflsec/__init__.py)
