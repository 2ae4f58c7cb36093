#!/usr/bin/env bash
# Cut a wheelhouse into carry-sized parts for the device machine (64 MiB per call, the working
# tree included, so a part is 64 MiB minus the tree minus 3 MiB unless PART_MB says otherwise):
#
#   bench/gpu/parts.sh .wheelhouse/vllm-0.26.0      # -> .whl/p01/part-aa ... .whl/pNN/ + our wheels
#
# Each .whl/pNN goes over in its own `bench/gpu/h200.sh stage` call (carry [".whl/pNN"]); the last
# folder also holds the plugin and slo-loadtest wheels built from this tree, so the install step
# always gets the code being measured. Wheels the host already has are left out even when an
# older wheelhouse still holds them (see wheelhouse.sh's EXCLUDE), except a torch stack the
# wheelhouse carries because vLLM pins another torch than the host's (its STACK.txt).
set -euo pipefail
WHEELHOUSE="${1:?usage: parts.sh WHEELHOUSE_DIR}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SKIP='^(torch|torchvision|torchaudio|triton|nvidia_|cuda_|transformers|huggingface_hub|tokenizers|safetensors|tokenspeed_|tilelang|z3_solver|vllm_gemma4_batched_encoder|slo_loadtest)-'
tree_bytes=$(cd "$ROOT" && git ls-files -co --exclude-standard -z | xargs -0 du -cb 2>/dev/null | tail -n1 | cut -f1)
PART_MB="${PART_MB:-$((61 - tree_bytes / 1048576))}"
echo "working tree $((tree_bytes / 1048576)) MiB: parts of $PART_MB MiB"
rm -rf "$ROOT/.whl"
mkdir -p "$ROOT/.whl/split"
name="$(basename "$WHEELHOUSE")"
stack="$WHEELHOUSE/STACK.txt"
[[ -f "$stack" ]] || stack=/dev/null
wheels="$(find "$WHEELHOUSE" -name '*.whl' -printf '%f\n')"
# STACK.txt travels too: install-wheelhouse.sh links the host's CUDA libraries by it
{
  grep -Fx -f "$stack" <<<"$wheels" || true
  grep -Ev "$SKIP" <<<"$wheels" || true
  [[ "$stack" == /dev/null ]] || echo STACK.txt
} | sort -u | sed "s|^|$name/|" | (cd "$(dirname "$WHEELHOUSE")" && tar -cf - -T -) |
  split -b "${PART_MB}M" - "$ROOT/.whl/split/part-"
i=0
for part in "$ROOT"/.whl/split/part-*; do
  i=$((i + 1))
  dir="$ROOT/.whl/$(printf 'p%02d' "$i")"
  mkdir -p "$dir"
  mv "$part" "$dir/"
done
rmdir "$ROOT/.whl/split"
# setuptools reuses an in-tree build/ (ignored by git): a module deleted from the tree would
# still ride along in the wheel being measured
rm -rf "$ROOT/plugin/build" "$ROOT/loadtest/build"
python3 -m pip wheel -q --no-deps -w "$dir" "$ROOT/plugin" "$ROOT/loadtest"
du -sh "$ROOT"/.whl/p* | tr '\n' ' '
echo
