"""Party start-up: a coordinator, active or passive process never imports torch or scipy (~3 CPU-s and ~190 MB per
party); only the optimising parameter defenses (on first use), split-NN and a configured embedding defense need
them."""

from __future__ import annotations

import subprocess
import sys

import pytest

# What services/app.py imports per role: its engine and its servicers.
MODULES = {
    "coordinator": ["engines.coordinator", "rpc.coordinator", "rpc.splitnn", "rpc.trees"],
    "active": ["engines.active", "rpc.active"],
    "passive": ["engines.passive", "rpc.passive", "rpc.splitnn", "rpc.trees", "defenses.embeddings"],
}


@pytest.mark.parametrize("role", sorted(MODULES))
def test_a_party_process_starts_without_torch_or_scipy(role: str) -> None:
    code = (
        "import sys\n"
        "import vflsec.services.app\n"
        + "".join(f"import vflsec.services.{module}\n" for module in MODULES[role])
        + "print(sorted(m for m in ('torch', 'scipy') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_parameter_defenses_still_reach_torch_and_scipy_when_used() -> None:
    code = (
        "import sys\n"
        "from vflsec.services.defenses import params\n"
        "assert 'torch' not in sys.modules\n"
        "params.torch.zeros(1); params.optimize.BFGS\n"
        "print(sorted(m for m in ('torch', 'scipy') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['scipy', 'torch']"


def test_the_engines_load_neither_grpc_nor_protobuf() -> None:
    """The engines are plain Python: services/app.py hands them the links; the plain helpers they share with the
    link layer live in services/common.py."""
    code = (
        "import sys\n"
        "from vflsec.services.engines import active, coordinator, passive\n"
        "print(sorted(m for m in ('grpc', 'google.protobuf', 'vflsec.v1') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_an_embedding_defense_reaches_torch_when_it_builds_a_layer() -> None:
    code = (
        "import sys\n"
        "from vflsec.services.defenses.embeddings import EmbeddingChain\n"
        "chain = EmbeddingChain.from_specs(['masquerade:m=1']).for_session(8, basis=__import__('numpy').eye(3))\n"
        "assert 'torch' not in sys.modules\n"
        "from torch import nn\n"
        "layer = chain.module(nn.Linear(3, 4), 3, 4, bias=True)\n"
        "print(type(layer).__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "MasqueradeLinear"
