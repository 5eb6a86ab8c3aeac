"""Generated protobuf / gRPC modules for the vflsec v1 protocol (see scripts/gen_proto.py)."""
