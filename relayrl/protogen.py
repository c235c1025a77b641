"""Generates the Python gRPC stubs under ``relayrl/v1`` from ``protos/``.

``protos/`` is the only source of wire definitions; the generated files are committed so
that installing RelayRL needs no protoc, and a test checks they match a fresh generation.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PROTO_ROOT = REPO_ROOT / "protos"


def proto_files() -> list[Path]:
    return sorted(PROTO_ROOT.glob("relayrl/v1/*.proto"))


def generate(out_dir: Path) -> None:
    """Writes ``*_pb2.py``, ``*_pb2.pyi`` and ``*_pb2_grpc.py`` for every proto into ``out_dir``."""
    from grpc_tools import protoc

    args = [
        "grpc_tools.protoc",
        f"-I{PROTO_ROOT}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *(str(p.relative_to(PROTO_ROOT)) for p in proto_files()),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed: {' '.join(args)}")


def main() -> None:
    generate(REPO_ROOT)
    print(f"generated stubs for {len(proto_files())} protos into relayrl/v1", file=sys.stderr)


if __name__ == "__main__":
    main()
