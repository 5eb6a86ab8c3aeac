"""A federation from the operator's side: dealing and launching the parties (launcher.py), the operator's gRPC
client (operator.py), training with early stopping (training.py), and the demo's align-train-predict run
(demo.py)."""
