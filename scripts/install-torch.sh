#!/bin/sh
# Install torch==VERSION into the venv's python, from INDEX when one is given (make sets it to the PyTorch CPU
# wheel index on a machine without an NVIDIA GPU), else from whatever pip is configured with.
#   usage: sh scripts/install-torch.sh PYTHON VERSION [INDEX]
# An INDEX that cannot be reached costs seconds, not minutes (short timeout, no retries): pip then falls back
# to its own configuration (PyPI, a mirror, or a local wheel folder).
set -u
PY="$1"; VERSION="$2"; INDEX="${3:-}"
if [ -n "$INDEX" ]; then
  echo "installing torch==$VERSION from $INDEX (override with make TORCH_INDEX=URL, or TORCH_INDEX= for pip's own configuration)"
  if "$PY" -m pip install --quiet --timeout 5 --retries 0 --index-url "$INDEX" "torch==$VERSION"; then
    exit 0
  fi
  echo "could not install torch from $INDEX; falling back to pip's own configuration"
fi
echo "installing torch==$VERSION with pip's own configuration"
exec "$PY" -m pip install --quiet "torch==$VERSION"
