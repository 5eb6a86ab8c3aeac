"""Party services: coordinator, active and passive parties, and the plain-Python engines behind them."""
