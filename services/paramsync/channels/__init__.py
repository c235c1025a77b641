"""Byte channels: every way a version's bytes travel, one module each holding both its ends.

``tcp`` (the bulk data plane), ``shared_memory`` (a version mapped on paramsync's host, over the
data plane), ``grpc_chunks`` (Publish/Fetch chunk streams), ``disk`` (a
safetensors directory on a shared volume), ``torch_dist`` (a torch.distributed broadcast).
"""
