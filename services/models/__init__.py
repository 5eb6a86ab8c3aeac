"""Model families: each package owns its maths and protocol steps."""
