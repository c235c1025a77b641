"""Errors the stores raise; the gRPC layer maps each onto one status code."""

from __future__ import annotations


class BadRequest(ValueError):
    """A caller's argument is invalid (→ INVALID_ARGUMENT); the message says which and why."""


class QueueFull(Exception):
    """Capacity stayed exhausted for the whole push timeout (→ RESOURCE_EXHAUSTED)."""
