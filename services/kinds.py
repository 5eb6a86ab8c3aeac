"""The kinds of message a party offers its plugins (services/plugins/): named once, here, where the trainers that emit
them (services/models/) and the plugins that read them may both import them. The active party emits the kinds above
SESSION; a passive party (a curious one, for the label attacks) emits SESSION, GRADIENT (split-NN), BLOCK_GRADIENT
(LR), NODE_ROWS and OWN_SPLIT (trees), and at FinishTraining TRAINING_DATA and OWN_MODEL."""

from __future__ import annotations

PUBLIC_CONTEXT = "public_context"  # blobs: context (the coordinator's public context)
ENCRYPTED_SCORES = "encrypted_scores"  # blobs: ciphertexts of [[p]] during training
EMBEDDINGS = "embeddings"  # arrays: z, a passive party's output in the clear (split-NN active-top); sample_ids
# arrays: the active party's own (unmasked) gradient blocks (LR: weights, bias), ∂L/∂h (split-NN: gradient); at a
# passive party: the split-NN gradient Backward carried (∂L/∂h, or ∂L/∂z_p in active-top), with its own sample_ids
GRADIENT = "gradient"
RELEASED_SCORES = "released_scores"  # arrays: scores, own_features; sample_ids
# arrays: the released model's named tensors (LR: w_active, bias, w_passive/<party>; split-NN: bottom/<p>/..., top/...)
RELEASED_MODEL = "released_model"
SESSION = "session"  # meta: schema and release chains announced for a session (a passive party: what it joined)
# arrays: features, labels of its own rows that a training run uses (a passive party: features only; sample_ids)
TRAINING_DATA = "training_data"
# What a passive party holds or receives in the families whose gradient does not reach it row by row:
BLOCK_GRADIENT = "block_gradient"  # arrays: gradient (K, w), its own LR gradient δᵀX_p of a step (flooded); sample_ids
NODE_ROWS = "node_rows"  # arrays: rows (training positions), weights, of a tree node it was asked to search
OWN_SPLIT = "own_split"  # arrays: rows, goes_left, of a node it split (its own split); meta: tree, node_id
OWN_MODEL = "own_model"  # arrays: outputs (its trained model on its training rows: LR z_p, split-NN h_p); sample_ids
