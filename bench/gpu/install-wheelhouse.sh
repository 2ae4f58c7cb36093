#!/usr/bin/env bash
# Install a wheelhouse made by wheelhouse.sh on a host without network, beside its own torch.
#   bench/gpu/install-wheelhouse.sh WHEELHOUSE_DIR TARGET_DIR   then: export PYTHONPATH=TARGET_DIR
set -euo pipefail
WHEELS="${1:?usage: install-wheelhouse.sh WHEELHOUSE_DIR TARGET_DIR}"
TARGET="${2:?usage: install-wheelhouse.sh WHEELHOUSE_DIR TARGET_DIR}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$TARGET" "$WHEELS"/*.whl
echo "installed $(find "$WHEELS" -name '*.whl' | wc -l) wheels into $TARGET"
