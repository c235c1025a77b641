"""RelayRL: fully asynchronous RL post-training for LLMs.

This package is the core shared by every service: settings, logging, the staleness rule,
metrics, gRPC and HTTP server helpers, wire-message conversion, model loading and the
built-in tasks. The services themselves live under ``services/``.
"""

__version__ = "0.1.0"
