"""Cryptography: CKKS backends, PSI, OS-entropy randomness and inference share masks."""
