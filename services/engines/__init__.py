"""Model-agnostic party engines: sessions, PSI, checkpoints, plugins, policy and release, in plain Python (no
protobuf: services/rpc/ and services/transport/ convert)."""
