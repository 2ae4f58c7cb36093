#!/usr/bin/env bash
# Serve Gemma 4 with the blog's flags. This one script is the container's ENTRYPOINT and the
# local stack's serve command (local/stack.py), so the command the chart runs is the one tested.
#
# Environment (all optional):
#   MODEL             model id or local directory            (default google/gemma-4-E4B-it)
#   HOST, PORT        listen address                         (default 0.0.0.0:8000)
#   SERVE_FLAGS       replaces the default flags below entirely (rarely needed)
#   VLLM_EXTRA_ARGS   extra flags appended after the defaults (word-split; later flags win)
#   VLLM_LAUNCHER     how to start vLLM                      (default: "vllm serve"; the CPU wheel
#                     needs "python -m vllm.entrypoints.openai.api_server", see README)
#   PROMETHEUS_MULTIPROC_DIR  metrics directory; wiped at start (default /tmp/vllm-metrics)
#   VLLM_MAX_IMAGE_PIXELS     largest image/frame accepted   (default 16777216 = 4096x4096)
# Arguments given to the script are appended last, so any default flag can be overridden.
set -euo pipefail

MODEL="${MODEL:-google/gemma-4-E4B-it}"
HOST="${HOST:-0.0.0.0}"
PORT="${PORT:-8000}"
VLLM_LAUNCHER="${VLLM_LAUNCHER:-vllm serve}"

# The blog's serve flags: no prefix cache and no multimodal processor cache, so identical
# requests cannot hide the encoder; async scheduling; audio off.
DEFAULT_FLAGS=(
  --no-enable-prefix-caching
  --mm-processor-cache-gb 0
  --async-scheduling
  --limit-mm-per-prompt '{"audio": 0}'
)
if [[ -n "${SERVE_FLAGS:-}" ]]; then
  read -r -a DEFAULT_FLAGS <<<"$SERVE_FLAGS"
fi
EXTRA_FLAGS=()
if [[ -n "${VLLM_EXTRA_ARGS:-}" ]]; then
  read -r -a EXTRA_FLAGS <<<"$VLLM_EXTRA_ARGS"
fi

# The plugin's encoder metrics are written in the engine-core process; multi-process mode makes
# them (and every process's vLLM metrics) appear on the API server's /metrics. vLLM requires the
# directory to be empty at start, or counters from a previous run leak in.
export PROMETHEUS_MULTIPROC_DIR="${PROMETHEUS_MULTIPROC_DIR:-/tmp/vllm-metrics}"
rm -rf "${PROMETHEUS_MULTIPROC_DIR:?}"
mkdir -p "$PROMETHEUS_MULTIPROC_DIR"

# An image larger than this is rejected with a 400 instead of being decoded (vLLM's default is
# ~179 Mpx, enough to stall a step for seconds).
export VLLM_MAX_IMAGE_PIXELS="${VLLM_MAX_IMAGE_PIXELS:-16777216}"

read -r -a LAUNCHER <<<"$VLLM_LAUNCHER"
set -x
exec "${LAUNCHER[@]}" --model "$MODEL" --host "$HOST" --port "$PORT" \
  "${DEFAULT_FLAGS[@]}" "${EXTRA_FLAGS[@]}" "$@"
