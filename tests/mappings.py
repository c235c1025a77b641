"""What a process maps, read from ``/proc/<pid>/maps``: for tests that check weights are views of a
file's mapping, not copies of it."""

from __future__ import annotations

from pathlib import Path


def mappings(pid: int | str = "self") -> list[tuple[int, int, str]]:
    """Every file-backed (or named) mapping of ``pid`` as (start, end, name)."""
    out = []
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6:  # anonymous mappings have no sixth field
            start, end = (int(v, 16) for v in parts[0].split("-"))
            out.append((start, end, parts[5]))
    return out


def mapped_files(pid: int | str = "self") -> set[str]:
    """The names of everything ``pid`` maps."""
    return {name for _, _, name in mappings(pid)}


def mapped_ranges(path: Path, pid: int | str = "self") -> list[tuple[int, int]]:
    """The address ranges at which ``pid`` maps ``path``."""
    target = str(path.resolve())
    return [(start, end) for start, end, name in mappings(pid) if name == target]
