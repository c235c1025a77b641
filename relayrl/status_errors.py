"""Errors that travel as gRPC statuses: a service raises one, its servicer answers with the
error's ``code``, and its client raises the same class again from the status that came back, so
callers handle a service's own errors and never a raw gRPC one."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

import grpc


class StatusError(RuntimeError):
    """A service's error with its gRPC status (``code``; subclasses fix their own) and message."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, details: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(details)
        self.details = details
        if code is not None:
            self.code = code


E = TypeVar("E", bound=StatusError)


def error_for_status(
    base: type[E], by_code: Mapping[grpc.StatusCode, type[E]], code: grpc.StatusCode, details: str
) -> E:
    """The error class ``by_code`` names for ``code`` (``base`` for codes no caller handles)."""
    return by_code.get(code, base)(details, code)
