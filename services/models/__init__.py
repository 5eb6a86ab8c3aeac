"""Model families: each package holds one family's maths and per-party protocol steps (no transport)."""
