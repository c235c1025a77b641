"""Fuzzing of every service interface: gRPC from the protobuf descriptors, REST from the OpenAPI
schemas (schemathesis), against the real services started as local processes (``relayrl fuzz``)."""
