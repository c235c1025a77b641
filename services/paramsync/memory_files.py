"""Memory files of this process whose bytes paramsync may copy instead of receiving them.

A process that keeps data in a memory file (``memfd``) it is willing to show paramsync registers
the file's mapping here: the trainer's gather buffers (``services/trainer/host_gather.py``). An
upload then names the file and offsets of each run of tensors that lies inside one
(``TensorChecksums.shared``), and paramsync, on the same host, copies the run from
``/proc/<pid>/fd/<fd>`` with one read per piece instead of receiving it over a socket: one copy
instead of a send and a receive through the kernel.
"""

from __future__ import annotations

import threading

_lock = threading.Lock()
# Start address of each registered mapping → (its end address, the file's descriptor).
_files: dict[int, tuple[int, int]] = {}


def register(start: int, size: int, fd: int) -> None:
    """The mapping at ``start`` of ``size`` bytes shows the memory file ``fd`` from its first byte."""
    with _lock:
        _files[start] = (start + size, fd)


def unregister(start: int) -> None:
    with _lock:
        _files.pop(start, None)


def locate(address: int, nbytes: int) -> tuple[int, int] | None:
    """(descriptor, offset) of the registered file holding bytes ``[address, address + nbytes)``, if any."""
    with _lock:
        for begin, (end, fd) in _files.items():
            if begin <= address and address + nbytes <= end:
                return fd, address - begin
    return None
