#!/usr/bin/env bash
# Build an offline wheelhouse for a GPU host that already has torch (the air-gapped install path).
#
#   bench/gpu/wheelhouse.sh 0.26.0 .wheelhouse/vllm-0.26.0      # here, with network
#   bench/gpu/install-wheelhouse.sh .wheelhouse/vllm-0.26.0 /opt/site   # there, without
#
# Resolves vllm==VERSION + guidellm + py-spy + PyAV + this repo's two packages (with everything
# they require: the load test's kubernetes client was missing until the twenty-third sitting,
# when the resolution left them out) for CPython 3.12 manylinux x86_64 from package metadata
# only, then downloads every wheel except what the host already has (torch, torchvision,
# torchaudio, triton, nvidia-*: the host's CUDA build must stay in charge). A vLLM that pins
# another torch than the host's (0.32+: 2.14; the hosts have 2.11) gets that torch stack carried:
# torch, what goes with it, and the CUDA libraries whose release differs from the host's
# (bench/gpu/torch_stack.py decides; STACK.txt names them, parts.sh keeps them,
# install-wheelhouse.sh links the host's other CUDA libraries beside them).
# RESOLVE_ONLY=1: write OUT_DIR/PINS.txt and stop (no downloads).
set -euo pipefail
VERSION="${1:?usage: wheelhouse.sh VLLM_VERSION OUT_DIR}"
OUT="${2:?usage: wheelhouse.sh VLLM_VERSION OUT_DIR}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY_VERSION="${PY_VERSION:-3.12}"
GUIDELLM="${GUIDELLM:-guidellm==0.8.1}"
PROFILER="${PROFILER:-py-spy==0.4.1}"  # h200.sh profile
MEDIA_CHECK="${MEDIA_CHECK:-av==18.1.0}"  # h200.sh host: bench/yuv_rgb_exact.py (decoded planes)
# Left out: the host's torch stack, and its transformers stack: vLLM 0.26's resolution picks
# transformers 5.24 + huggingface-hub 2.x, which shadow the host's 5.17 and break its import
# (seen on the H200: "huggingface-hub>=1.5.0,<2.0 is required"). MLA/tilelang kernels are unused
# by Gemma 4 and cost ~170 MB.
EXCLUDE='torch|torchvision|torchaudio|triton|nvidia-.*|cuda-.*|transformers|huggingface-hub|tokenizers|safetensors|tokenspeed-.*|tilelang|z3-solver'
PLATFORMS=()
for p in manylinux_2_39 manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 \
  manylinux_2_24 manylinux_2_18 manylinux_2_17 manylinux2014 manylinux1; do
  PLATFORMS+=(--platform "${p}_x86_64")
done
export PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS='' PIP_CONSTRAINT=''
mkdir -p "$OUT"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

# 0. the torch stack to carry, if vLLM's torch is not the host's (nothing for 0.20-0.26)
python3 "$ROOT/bench/gpu/torch_stack.py" --python-version "$PY_VERSION" "$VERSION" \
  --stand-ins "$TMP/stand-ins.txt" >"$TMP/stack.txt"
: >"$OUT/STACK.txt"
if [[ -s "$TMP/stack.txt" && "${RESOLVE_ONLY:-0}" != 1 ]]; then
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PY_VERSION" \
    --implementation cp "${PLATFORMS[@]}" -d "$TMP/stack" -r "$TMP/stack.txt"
  (cd "$TMP/stack" && ls -- *.whl) >"$OUT/STACK.txt"
  mv "$TMP"/stack/*.whl "$OUT/"
  echo "carried torch stack: $(tr '\n' ' ' <"$OUT/STACK.txt")"
fi

# 1. resolve (metadata only) what vLLM + guidellm need on the target. The torch stack is stood
#    in for by empty placeholder wheels with a local version (`2.11.0+host` satisfies
#    `torch==2.11.0` and sorts above it, a carried `2.14.0+host` `torch==2.14.0`), so their CUDA
#    dependencies are never resolved.
mkdir -p "$TMP/placeholders"
while read -r spec; do
  python3 - "$TMP/placeholders" "${spec%%==*}" "${spec##*==}+host" <<'PY'
import sys, zipfile
out, name, version = sys.argv[1:]
dist = f"{name}-{version}.dist-info"
with zipfile.ZipFile(f"{out}/{name}-{version}-py3-none-any.whl", "w") as whl:
    whl.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    whl.writestr(f"{dist}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    whl.writestr(f"{dist}/RECORD", "")
PY
done <"$TMP/stand-ins.txt"
python3 -m pip install -q --dry-run --ignore-installed --report "$TMP/report.json" \
  --find-links "$TMP/placeholders" \
  --only-binary=:all: --python-version "$PY_VERSION" --implementation cp "${PLATFORMS[@]}" \
  --target "$TMP/target" "vllm==$VERSION" "$GUIDELLM" "$PROFILER" "$MEDIA_CHECK" \
  "$ROOT/plugin" "$ROOT/loadtest"
# this repo's packages are built in step 3, not downloaded
python3 - "$TMP/report.json" "$EXCLUDE|vllm-gemma4-batched-encoder|slo-loadtest" >"$TMP/pins.txt" <<'PY'
import json, re, sys
report, exclude = json.load(open(sys.argv[1])), re.compile(f"^({sys.argv[2]})$")
for item in report["install"]:
    name, version = item["metadata"]["name"], item["metadata"]["version"]
    if not exclude.match(name.lower().replace("_", "-")):
        print(f"{name}=={version}")
PY
if [[ "${RESOLVE_ONLY:-0}" == 1 ]]; then
  cp "$TMP/pins.txt" "$OUT/PINS.txt"
  echo "resolved $(wc -l <"$OUT/PINS.txt") wheels: $OUT/PINS.txt"
  exit 0
fi
# 2. download exactly those wheels
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PY_VERSION" \
  --implementation cp "${PLATFORMS[@]}" -d "$OUT" -r "$TMP/pins.txt"
# 3. this repo's packages (pure Python), without a stale in-tree build/ (setuptools reuses it)
rm -rf "$ROOT/plugin/build" "$ROOT/loadtest/build"
python3 -m pip wheel -q --no-deps -w "$OUT" "$ROOT/plugin" "$ROOT/loadtest"
cp "$TMP/pins.txt" "$OUT/PINS.txt"
echo "wheelhouse: $(find "$OUT" -name '*.whl' | wc -l) wheels, $(du -sh "$OUT" | cut -f1) in $OUT"
