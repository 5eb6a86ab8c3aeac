"""Security regression suite: each test replays a probe of the protocol review against a live federation.

The federations are the integration suite's (real gRPC on loopback, real mTLS, real CKKS), so a probe here
attacks exactly what a deployment runs. A test plays one curious or deviating identity and checks that the
probe is now refused with a precise status or learns nothing.
"""

from __future__ import annotations

from tests.integration.conftest import Federation, federation

__all__ = ["Federation", "federation"]
