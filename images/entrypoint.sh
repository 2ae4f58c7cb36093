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
#                     needs "python local/vllm_cli.py serve", see README)
#   PROMETHEUS_MULTIPROC_DIR  metrics directory; wiped at start (default /tmp/vllm-metrics)
#   VLLM_MAX_IMAGE_PIXELS     largest image/frame accepted   (default 16777216 = 4096x4096)
#   GEMMA4_WARMUP     1: once /health answers, send media warm-up traffic
#                     (python -m gemma4_batched_encoder.warmup $GEMMA4_WARMUP_ARGS), then write
#                     GEMMA4_WARMUP_DONE_FILE (the chart's startup probe waits for it); vLLM
#                     then runs as this script's child, which passes SIGTERM/SIGINT on
#   GEMMA4_WARMUP_PYTHON      the Python that runs it    (default python3)
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
SERVE=("${LAUNCHER[@]}" --model "$MODEL" --host "$HOST" --port "$PORT"
  "${DEFAULT_FLAGS[@]}" "${EXTRA_FLAGS[@]}" "$@")
if [[ "${GEMMA4_WARMUP:-0}" != 1 ]]; then
  set -x
  exec "${SERVE[@]}"
fi

# Warm-up: the pod turns Ready only after first-time work (Triton kernels compiled for new batch
# mixes, bench/results/h200/vllm-0.20.0-11-warmup-full/NOTES.md) has happened on synthetic
# requests. A failed warm-up is logged and the server serves anyway: it only costs the first users' latency.
DONE_FILE="${GEMMA4_WARMUP_DONE_FILE:-/tmp/gemma4-warmup-done}"
rm -f "$DONE_FILE" # an emptyDir outlives a container restart: never trust an old one
read -r -a WARMUP_ARGS <<<"${GEMMA4_WARMUP_ARGS:-}"
# The API servers the server runs (the last --api-server-count wins, as in vLLM's parser): the
# warm-up checks through the metrics directory that it reached each one, since each process has
# first-time work of its own (GEMMA4_WARMUP_ARGS come after, so they can override this)
API_SERVERS=1
for ((i = 0; i < ${#SERVE[@]}; i++)); do
  case "${SERVE[i]}" in
  --api-server-count=*) API_SERVERS="${SERVE[i]#*=}" ;;
  --api-server-count | -asc) API_SERVERS="${SERVE[i + 1]:-1}" ;;
  esac
done
(
  set -x
  exec "${SERVE[@]}"
) &
server=$!
# TERM for INT too: a background job of a non-interactive shell starts with SIGINT ignored.
trap 'kill -TERM "$server" 2>/dev/null || true' TERM INT
(
  py=""
  trap 'kill -TERM "$py" 2>/dev/null || true; exit 143' TERM # the server stopped first
  "${GEMMA4_WARMUP_PYTHON:-python3}" -m gemma4_batched_encoder.warmup \
    --target "http://127.0.0.1:$PORT" --api-servers "$API_SERVERS" \
    --metrics-dir "$PROMETHEUS_MULTIPROC_DIR" "${WARMUP_ARGS[@]}" &
  py=$!
  rc=0
  wait "$py" || rc=$?
  if ((rc != 0)); then echo "gemma4 warm-up: exit $rc; serving without it" >&2; fi
  mkdir -p "$(dirname "$DONE_FILE")"
  touch "$DONE_FILE"
) &
warmup=$!
status=0
while kill -0 "$server" 2>/dev/null; do # a zombie still answers: the last wait reaps it
  status=0
  wait "$server" || status=$? # returns early (>128) when a trapped signal arrives
done
kill "$warmup" 2>/dev/null || true
exit "$status"
