"""Model-agnostic party engines: sessions, PSI, checkpoints, plugins, policy and release."""
