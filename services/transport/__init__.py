"""gRPC transport: servers, peer links, wire checks, mutual TLS and authorisation."""
