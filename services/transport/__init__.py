"""gRPC transport: the server, the links to peers (plain values in, protobuf on the wire), message conversions and
checks, mutual TLS. The servicers are services/rpc/."""
