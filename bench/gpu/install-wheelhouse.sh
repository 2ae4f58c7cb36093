#!/usr/bin/env bash
# Install a wheelhouse made by wheelhouse.sh on a host without network, beside its own torch.
#   bench/gpu/install-wheelhouse.sh WHEELHOUSE_DIR TARGET_DIR [MORE.whl ...]
#   then: export PYTHONPATH=TARGET_DIR   (h200.sh install passes this tree's own wheels as MORE)
set -euo pipefail
WHEELS="${1:?usage: install-wheelhouse.sh WHEELHOUSE_DIR TARGET_DIR}"
TARGET="${2:?usage: install-wheelhouse.sh WHEELHOUSE_DIR TARGET_DIR}"
shift 2
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target "$TARGET" "$WHEELS"/*.whl "$@"
echo "installed $(($(find "$WHEELS" -name '*.whl' | wc -l) + $#)) wheels into $TARGET"
# A carried torch (STACK.txt: vLLM pins another torch than the host's) finds its CUDA libraries
# through its rpath, $ORIGIN/../../nvidia/<lib>/lib: the carried ones are in TARGET/nvidia, the
# host's others (cuBLAS, cudart, NVSHMEM, ...) are linked in beside them.
if [[ -s "$WHEELS/STACK.txt" ]]; then
  host_site="$(cd / && env -u PYTHONPATH python3 -c \
    'import pathlib, torch; print(pathlib.Path(torch.__file__).resolve().parents[1])')"
  mkdir -p "$TARGET/nvidia"
  for lib in "$host_site"/nvidia/*/; do
    lib="${lib%/}"
    [[ -d "$lib" ]] || continue
    if [[ ! -e "$TARGET/nvidia/$(basename "$lib")" ]]; then
      ln -s "$lib" "$TARGET/nvidia/$(basename "$lib")"
    fi
  done
  echo "carried: $(tr '\n' ' ' <"$WHEELS/STACK.txt"); the host's other CUDA libraries linked from $host_site/nvidia"
fi
# --no-deps installs whatever is there: import every entry point's modules now, so that a wheel
# missing from the wheelhouse is named here and not by the first load test (the twenty-third
# sitting's slo-loadtest failed on a missing kubernetes client).
PYTHONPATH="$TARGET${PYTHONPATH:+:$PYTHONPATH}" python3 -c '
import importlib, sys
missing = []
for name in ("vllm", "guidellm", "gemma4_batched_encoder.plugin", "slo_loadtest.cli", "slo_loadtest.k8s",
             "slo_loadtest.plots"):
    try:
        importlib.import_module(name)
    except ImportError as exc:
        missing.append(f"{name}: {exc}")
if missing:
    sys.exit("install-wheelhouse: the wheelhouse lacks what these need (rebuild it with wheelhouse.sh):\n  "
             + "\n  ".join(missing))
import torch, vllm
print(f"imports checked: vllm {vllm.__version__} on torch {torch.__version__}, guidellm, the plugin, "
      "slo-loadtest (k8s, plots)")
'
