"""The gRPC servicers: one thin class per vflsec.v1 service, request -> plain call on an engine -> reply.

Protobuf stops here and in services/transport/ (the links to other parties); the engines see numpy, he objects
and plain dataclasses only. Each module also holds its services' ROLE_POLICY (services/rpc/authz.py).
"""
