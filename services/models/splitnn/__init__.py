"""Split neural networks: config, torch modules, optimiser, per-party protocol steps, central reference and an
in-process federated run. No transport here; the engines wire :mod:`.steps` to their RPCs."""

from .config import ACTIVATIONS, TOPOLOGIES, SplitNNConfig, check_backend
from .optim import OptimizerConfig, build_optimizer
from .reference import RunResult, SplitData, central_run
from .simulate import LocalFederation, simulate
from .steps import EMBEDDING_BOUND, Bottom, Head, HeadStep, open_masked

__all__ = [
    "ACTIVATIONS",
    "EMBEDDING_BOUND",
    "TOPOLOGIES",
    "Bottom",
    "Head",
    "HeadStep",
    "LocalFederation",
    "OptimizerConfig",
    "RunResult",
    "SplitData",
    "SplitNNConfig",
    "build_optimizer",
    "central_run",
    "check_backend",
    "open_masked",
    "simulate",
]
