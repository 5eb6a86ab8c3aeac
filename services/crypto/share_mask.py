"""Zero-sum masks on inference shares (docs/protocol.md, "Inference and release").

At JoinSession the active party sends each passive party p a fresh key k_p (32 bytes from os.urandom) over
mTLS. For a chunk of an admitted query, p sends the coordinator [[X_p W_pᵀ + r_p]] and the active party sends
[[X_a W_aᵀ + b − Σ_p r_p]], with r_p = :func:`share_mask` (k_p, ...): the masks cancel in the sum the
coordinator decrypts, while every share it stores alone is masked. The coordinator holds W_p after training,
so an unmasked share would give it X_p whenever d_p <= k.

Hiding: each entry of r_p is uniform in [-B, B] with B the backend's ``default_mask_bound`` (2^24 for CKKS,
the bound the gradient masks use, services/crypto/he.py; 0 for plain, which hides nothing anyway). For a share entry
z, z + r is uniform on [z − B, z + B], so two candidate values z, z′ give distributions at statistical
distance |z − z′| / 2B <= Z / B per entry (adding up over the entries of a query), where
|z| <= Z = FEATURE_BOUND · max_c ||W_p[c]||₁ (features are refused beyond FEATURE_BOUND = 64): a block with
row norms up to 2^6 is hidden to within 2^-12 per entry, a trained block whose shares are a few units to
about 2^-22. The nonce binds the session, the model's training step, the query id and the rows, so two
different values of a share never carry the same mask, even if a coordinator reused a query id after
retraining. What the masks cannot hide: the key holder colluding with the active party, which knows every k_p.

Decryption error: the masks cancel in the plaintext sum only up to the CKKS encoding error of values of size
B. Measured (2000 x 3 logits, two passive shares, three draws; tests/unit/test_share_mask.py checks it):
max |decrypted sum − z| is 1.4e-8 without masks, 1.8e-8 at B = 2^24 (2.7e-7 at 2^28, 4.0e-6 at 2^32). On a
live federation (tests/security/test_inference_shares.py) released scores match the unmasked model's to 3e-9.
"""

from __future__ import annotations

import numpy as np

from vflsec.services.crypto import entropy


def share_mask(
    key: bytes, bound: float, session_id: str, model_step: int, query_id: str, sample_index: np.ndarray, k: int
) -> np.ndarray:
    """r_p for the rows ``sample_index`` of query ``query_id``: (len(sample_index), k), uniform in ±bound."""
    rows = np.asarray(sample_index, dtype="<i8").tobytes()
    stream = entropy.keyed_stream(key, "share-mask", session_id, model_step, query_id, rows)
    return stream.uniform(-bound, bound, size=(len(sample_index), k))
