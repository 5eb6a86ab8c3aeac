"""The ``vflsec bench`` measurements, one module per sub-command: speed figures through the real services,
measured side by side in one run (the CLI's ``commands/bench.py`` prints them)."""
