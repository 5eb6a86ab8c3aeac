"""The kinds of message a party offers its plugins (services/plugins/): named once, here, where the trainers that emit
them (services/models/) and the plugins that read them may both import them. The active party emits every kind; a
passive party (a curious one, for the label attacks) emits SESSION and GRADIENT."""

from __future__ import annotations

PUBLIC_CONTEXT = "public_context"  # blobs: context (the coordinator's public context)
ENCRYPTED_LOGITS = "encrypted_logits"  # blobs: ciphertexts of a passive party's [[z_p]]
ENCRYPTED_SCORES = "encrypted_scores"  # blobs: ciphertexts of [[p]] during training
EMBEDDINGS = "embeddings"  # arrays: z, a passive party's output in the clear (split-NN active-top); sample_ids
# arrays: the active party's own (unmasked) gradient blocks (LR: weights, bias), ∂L/∂h (split-NN: gradient); at a
# passive party: the split-NN gradient Backward carried (∂L/∂h, or ∂L/∂z_p in active-top), with its own sample_ids
GRADIENT = "gradient"
RELEASED_SCORES = "released_scores"  # arrays: scores, own_features; sample_ids
# arrays: the released model's named tensors (LR: w_active, bias, w_passive/<party>; split-NN: bottom/<p>/..., top/...)
RELEASED_MODEL = "released_model"
SESSION = "session"  # meta: schema and release chains announced for a session (a passive party: what it joined)
TRAINING_DATA = "training_data"  # arrays: features, labels of its own rows that a training run uses
