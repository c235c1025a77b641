# What every GPU check script starts with (sourced, not run): the repository root as the working
# directory, $OUT made, $PYTHON chosen, the wheels the GPU image lacks installed from .whl (see the
# device notes), and the GPU's name with torch's and transformers' versions written to $OUT/gpu.txt.
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] && PYTHON=.venv/bin/python
# Wheels the GPU image lacks (fastapi, uvicorn, pydantic-settings, ...) travel in .whl (see the device notes).
if [ -d .whl ]; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

nvidia-smi --query-gpu=name,memory.total --format=csv >"$OUT/gpu.txt" 2>&1
"$PYTHON" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" \
    >>"$OUT/gpu.txt" 2>&1
