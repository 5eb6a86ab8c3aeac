"""``vflsec.api``: the command line as Python functions (implemented in :mod:`vflsec.client.api`)."""

from vflsec.client.api import VflsecError, attack, demo, experiment, frame, options, reproduce

__all__ = ["VflsecError", "attack", "demo", "experiment", "frame", "options", "reproduce"]
