"""Attacks measured over federations: the harness (runs.py runs an attack scenario through the services, harness.py
scores it), scenario files and their cells (scenario.py, runner.py, results.py), varasteh's privacy curve
(param_curve.py) and the seed papers' claims (reproduce/)."""
