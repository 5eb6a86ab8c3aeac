"""vflsec: vertical federated learning with measured privacy.

The package is assembled from three folders of the repository: the generated protocol (``vflsec.v1``,
from ``proto/``), the party services (``vflsec.services``, from ``services/``) and the operator side
(``vflsec.client``, from ``client/``).
"""

import os
import sys
import warnings

__version__ = "0.1.0"

# TLS 1.3 only, in every vflsec process (server and client side). gRPC Python has no TLS-version option
# (grpcio 1.85: ssl_server_credentials / ssl_channel_credentials take none) and BoringSSL fixes the TLS 1.3
# suites (AES-GCM, ChaCha20-Poly1305). What gRPC does read is its TLS 1.2 cipher list, GRPC_SSL_CIPHER_SUITES,
# once, when grpc loads: pinned to a single pre-shared-key suite, which gRPC can never negotiate (it configures
# no PSK), it leaves no TLS 1.2 handshake that can complete. So it is set here, before any module imports grpc.
TLS12_CIPHER_PIN = "ECDHE-PSK-CHACHA20-POLY1305"
if "grpc" in sys.modules and os.environ.get("GRPC_SSL_CIPHER_SUITES") != TLS12_CIPHER_PIN:
    warnings.warn("grpc was imported before vflsec: TLS 1.2 stays enabled in this process", stacklevel=2)
os.environ["GRPC_SSL_CIPHER_SUITES"] = TLS12_CIPHER_PIN
