"""Per-tensor digests named in the manifest.

``sha256`` is the default. ``crc32`` (zlib's CRC-32, hex) is about twice as fast on CPU and
detects accidental corruption (truncation, bit flips, misordered chunks), which is what a weight
broadcast inside one cluster needs; it is no defence against a deliberate forger.
"""

from __future__ import annotations

import hashlib
import zlib
from typing import Protocol

ALGORITHMS = ("sha256", "crc32")


class Hasher(Protocol):
    def update(self, data: bytes | memoryview) -> None: ...

    def hexdigest(self) -> str: ...


class _Crc32:
    def __init__(self) -> None:
        self._value = 0

    def update(self, data: bytes | memoryview) -> None:
        self._value = zlib.crc32(data, self._value)

    def hexdigest(self) -> str:
        return f"{self._value:08x}"


def new_hasher(algorithm: str) -> Hasher:
    if algorithm == "sha256":
        return hashlib.sha256()
    if algorithm == "crc32":
        return _Crc32()
    raise ValueError(f"unknown checksum algorithm {algorithm!r}; expected one of {', '.join(ALGORITHMS)}")
