"""Split neural networks: config, torch modules, optimiser, per-party protocol steps, central reference and an
in-process federated run. No transport here; the engines wire :mod:`.steps` to their RPCs."""

from .config import ACTIVATIONS, TOPOLOGIES, SplitNNConfig, check_backend
from .optim import OptimizerConfig, build_optimizer
from .reference import RunResult, SplitData, central_run
from .simulate import LocalFederation, simulate
from .steps import Bottom, Head, HeadStep, aggregate, encrypt_embedding, open_sum

__all__ = [
    "ACTIVATIONS",
    "TOPOLOGIES",
    "Bottom",
    "Head",
    "HeadStep",
    "LocalFederation",
    "OptimizerConfig",
    "RunResult",
    "SplitData",
    "SplitNNConfig",
    "aggregate",
    "build_optimizer",
    "central_run",
    "check_backend",
    "encrypt_embedding",
    "open_sum",
    "simulate",
]
