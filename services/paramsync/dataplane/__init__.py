"""Paramsync's bulk data plane: raw TCP frames that carry a version's bytes beside the gRPC control calls."""
