"""Score and parameter release defenses and the release chains that run them.

Importing this package imports the modules that define the built-in steps, which register themselves with
the release registries (services/defenses/release.py): release.py never imports them, so there is no cycle.
"""

from vflsec.services.defenses import gradients, params, release, scores

__all__ = ["gradients", "params", "release", "scores"]
