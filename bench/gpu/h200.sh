#!/usr/bin/env bash
# Steps of one H200 sitting, each small enough for one device call (<= 10 min). The machine keeps
# /tmp between calls while it is warm, so: stage the wheelhouse in parts, install, start the
# servers (they outlive the call: setsid), measure, fetch. Results go to $OUT (device tool).
#
#   bench/gpu/h200.sh stage                 copy the carried .whl/**/part-* into /tmp/parts
#   bench/gpu/h200.sh prebuild              build the model in the background (torch + transformers
#                                           only: runs while the wheelhouse is still being staged)
#   bench/gpu/h200.sh install               join + install the wheelhouse and .whl/*.whl into /tmp/site
#                                           (and the model, unless prebuild is building it: waits;
#                                           INSTALL_MODEL=0: wheels only, the next install the model);
#                                           a carried .cache/gpu/compile-caches.tgz is unpacked first
#   bench/gpu/h200.sh save-caches           the host's compile caches (vLLM's, inductor's, Triton's)
#                                           packed as $OUT/compile-caches.tgz (~12 MB), to carry
#                                           into the next sitting's install (see bench/README)
#   bench/gpu/h200.sh verify                encoder bit identity only (no timing; safe beside a cold start)
#   bench/gpu/h200.sh graph-ranges          GEMMA4_ENGINE_GRAPH_RANGES' buffer in vLLM's compiled Triton
#                                           attention, bitwise against vLLM's range tensor, and
#                                           replayed from a CUDA graph after a refill (seconds)
#   bench/gpu/h200.sh v2-ranges-serve       the image-range buffer on Model Runner V2 (vLLM 0.26.0 with
#                                           VLLM_USE_V2_MODEL_RUNNER=1): three V2 servers without
#                                           torch.compile started together, eager (the reference),
#                                           FULL graphs with the buffer, FULL graphs without it
#                                           (vLLM's own: the negative control)
#   bench/gpu/h200.sh v2-ranges             then: wait, greedy outputs of each, the FULL ones
#                                           against eager, the plugin's log lines, refusals
#                                           (7 files: the three logs in one v2-logs.tgz, as the
#                                           device returns 8 a call; the twenty-eighth lost one)
#   bench/gpu/h200.sh v2-ranges-refusals    then: the buffer-less server replaced by FULL graphs with
#                                           a buffer of 2 ranges (a video's prefill then runs eager:
#                                           need_eager), greedy outputs against eager, refusals
#   bench/gpu/h200.sh stock-vs-plugin       two eager servers started together on the installed vLLM
#                                           (a carried torch too: 0.33.0, the image's): stock and
#                                           the plugin as the chart configures it, with every
#                                           encoder call shadow-verified against vLLM's own
#   bench/gpu/h200.sh stock-vs-plugin-check then: wait, greedy outputs compared, the shadow
#                                           verifications counted, the plugin's log lines; stops both
#   bench/gpu/h200.sh encoder               encoder verify + bench + media stages (torch + transformers only)
#   bench/gpu/h200.sh graphs                the encoder's CUDA graphs: verify fused (padded + unpadded
#                                           frames), unfused unpadded, fast; exact-fused vs fast timings
#   bench/gpu/h200.sh serve NAME PORT [ENV=VAL ...]   start vLLM (E4B dims, $WEIGHTS weights) in the background
#                                           (GEMMA4_WARMUP=1: the entrypoint's warm-up, as the chart;
#                                           `wait` then waits for it too; FRESH_CACHES=1: its own
#                                           vLLM, inductor and Triton caches, as a new pod's;
#                                           DIGEST=1: its weights' digests readable by `digest`)
#   bench/gpu/h200.sh restart NAME PORT [AS NEW NEWPORT]   stop NAME and start it again with the
#                                           same settings on its own caches (or NEW on a copy)
#   bench/gpu/h200.sh stop PORT...          stop those servers (their GPU memory back for the next step)
#   bench/gpu/h200.sh wait PORT...          wait for /health
#                                           (servers sharing the GPU: start the next only after
#                                           the last has sized its KV cache; one profiling while
#                                           another loads sizes it wrong, 0.20.0 and 0.26.0)
#   bench/gpu/h200.sh wait-kv PORT          wait until that server has allocated its KV cache
#   bench/gpu/h200.sh greedy NAME PORT TAG  greedy outputs (7 fixed requests) to NAME-greedy-TAG.json
#   bench/gpu/h200.sh digest NAME PORT [FIRST]   a DIGEST=1 server's weight digests to
#                                           NAME-digest.json (bench/param_digest.py), compared
#                                           with FIRST's when given
#   bench/gpu/h200.sh greedy-history NAME PORT   greedy outputs before and after the warm-up's
#                                           traffic, compared (does history change the numerics?)
#   bench/gpu/h200.sh greedy-servers NAME:PORT...   greedy-history on each (HISTORY=0: greedy
#                                           once), then every server's `before` against the
#                                           first's, its compile log lines and autotuning results
#   bench/gpu/h200.sh fast-probe            fast mode's kernels side by side (KERNELS="stock merged
#                                           merged-triton"): verify, bench (host and device token
#                                           counts), kernel profiles at 16 and 1 videos (7 files a
#                                           kernel choice: run it through
#                                           `packed` or `bg`)
#   bench/gpu/h200.sh fast-tune             fast mode's Triton kernels under other launches, attention
#                                           per SDPA backend, the served pass's timeline
#                                           (bench/fast_kernel_tune.py); the fastest launches
#                                           entered in this tree's fast_launch.json (returned),
#                                           then the bench, verify (fused norms) and profile
#                                           with them (8 files; ~12-14 min, more than a call:
#                                           `bg`, then `collect` in the next call)
#   bench/gpu/h200.sh fast-layouts          the bench CLI with float8 fast mode (with and without the
#                                           fused norms) on frames as a list and stacked as vLLM
#                                           hands them (exact-fused beside: bitwise through the
#                                           views too), then the replay/host split
#                                           (bench/fast_replay_split.py); 6 files
#   bench/gpu/h200.sh fast-epilogues        float8 fast mode with the Triton GEMMs whose epilogues
#                                           carry the q/k/v norms + rotary and GELU x up: their
#                                           check, the GEMM probe (launches entered in this tree's
#                                           fast_launch.json, returned), bench against the fused
#                                           norms alone (ABCABC with -gemms), verify, profile
#                                           (~13 min: `bg`, then `collect` in the next call)
#   bench/gpu/h200.sh host                  media benchmarks on this host's CPUs with its vLLM:
#                                           decode threads, one request's profile, the frame call,
#                                           the video cache key, the decode breakdown, the decode
#                                           overlap, OpenCV's pool (bench/cv2_pool.py), swscale's
#                                           yuv->rgb as tensor ops (cpu, cuda),
#                                           the processor's resize as integer ops on the GPU
#                                           (HOST_CHECKS=1: only the last two); 10 files: run it
#                                           through `packed`
#   bench/gpu/h200.sh cv2-pool              OpenCV's own pool at its default against one thread, idle
#                                           and with 8 spinning processes (bench/cv2_pool.py, ~70 s,
#                                           no server; thirty-first sitting)
#   bench/gpu/h200.sh nvdec-cpu             vLLM's NVDEC video backend (PyNvVideoCodec) against its
#                                           OpenCV decode, with and without the plugin, per video:
#                                           wall and CPU, CUDA's default and blocking-sync
#                                           scheduling (bench/nvdec_cpu.py; ~1 min, no server)
#   bench/gpu/h200.sh measure NAME PORT RATES DURATION   greedy outputs, TTFT gap + bursts,
#                                           SLO sweep (text, video) with a search past the last rate
#                                           (WORKLOADS=video|text: one sweep; SWEEP_ONLY=1: no
#                                           greedy outputs or TTFT gap, a short warm-up instead;
#                                           the halves alone: `probe NAME PORT`, `sweep NAME PORT
#                                           RATES DURATION`;
#                                           VIDEO_CODEC=h264: H.264 clips in the gap and sweep;
#                                           LOADTEST_ARGS: more slo-loadtest options, e.g.
#                                           --connection-per-request)
#   bench/gpu/h200.sh config NAME PORT RATES DURATION [ENV=VAL ...]   serve + wait + measure
#                                           (+ profile at $PROFILE_RATE) + stop, all files of it
#                                           in one $OUT/NAME.tgz: one configuration per call
#   bench/gpu/h200.sh pair NAME RATES DURATION A PORT_A [ENV=VAL ...] -- B PORT_B [ENV=VAL ...]
#                                           two configurations with one cold start: both served
#                                           at once on the GPU; both probed (greedy, gap,
#                                           bursts), then both swept, one at a time while the
#                                           other idles; logs, stop; all
#                                           in $OUT/NAME.tgz. Each EXTRA_ARGS needs a fixed KV
#                                           cache ($TOGETHER_ARGS or larger: vLLM's memory profile
#                                           counts the other server's memory); thirty-second sitting
#   bench/gpu/h200.sh chart-args            the chart's flags after the blog's (API servers, CUDA
#                                           graph profile), for EXTRA_ARGS="$($B chart-args) ..."
#   bench/gpu/h200.sh bg NAME STEP ARGS...  `packed NAME STEP ARGS` in the background (a GPU step
#                                           while the wheelhouse is still being staged)
#   bench/gpu/h200.sh collect NAME [LIMIT_S]   wait for that background step (at most LIMIT_S,
#                                           default 500); its NAME.tgz to $OUT, or what it has
#                                           so far as NAME-partial.tgz if it still runs
#   bench/gpu/h200.sh packed NAME STEP ARGS...   any step with its files packed into one
#                                           $OUT/NAME.tgz (the device returns 8 files a call;
#                                           a `measure` alone writes more); PACK_WITHIN_S=N stops
#                                           the step after N s and packs what it wrote (the device
#                                           kills the whole call at its limit, archive and all:
#                                           the thirty-first sitting's first config)
#   bench/gpu/h200.sh profile NAME PORT WORKLOAD RATE SECONDS   py-spy of the server's engine core
#                                           and first API server while a constant-rate load runs
#                                           (NAME-engine/-api.txt raw, -top.json: bench/pyspy_top.py),
#                                           CPU per process and thread + GPU busy (NAME-cpu.json:
#                                           bench/proc_cpu.py), metrics before and after
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SITE=/tmp/site
# WEIGHTS=random (default): seeded E4B weights written on the GPU (~16 GB, ~1 min), so logits are
# real: greedy outputs compare meaningfully and sampled tokens stream text (TTFT/ITL measurable).
# WEIGHTS=dummy: vLLM's --load-format dummy (uniform logits; timing only, as in the 2026-11 runs).
WEIGHTS="${WEIGHTS:-random}"
# vLLM 0.26.0 refused transformers 5.17's random E4B checkpoint at its 512-wide full-attention
# norms (2026-11-30 sitting), so random weights are built with head_dim 256 on every layer.
# (`|| true`: under set -e a failing substitution in an assignment ends the script, which made
# WEIGHTS=dummy exit silently before any step; 2026-11-30, sixth sitting.)
BUILD_ARGS="${BUILD_ARGS-$([[ $WEIGHTS == random ]] && echo --uniform-head-dim || true)}"
MODEL_DIR="/tmp/gemma4-e4b-$WEIGHTS"
# local/build_model.py's arguments, for prebuild (in the background) and install (its fallback)
MODEL_ARGS="--vision e4b --text e4b --weights $WEIGHTS --device cuda --out $MODEL_DIR $BUILD_ARGS"
SERVED="gemma-4-E4B-it-$WEIGHTS"
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
export PYTHONPATH="$SITE" PATH="$SITE/bin:$PATH" PYTHONUNBUFFERED=1
export VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1

log_of() { cut -d' ' -f2 "/tmp/port-$1"; }
# save_metrics PORT FILE: the server's gemma4_/vllm: sums and counts (no buckets), for
# bench/ttft_gap.py --between BEFORE AFTER.
save_metrics() {
  curl -s "http://127.0.0.1:$1/metrics" | grep -E "^(gemma4_|vllm:)" | grep -v _bucket >"$2" || true
}

# wait_for PORT WHAT LIMIT_S CHECK...: until CHECK succeeds; fail fast when the server's process
# has exited (no waiting on a dead server) or after LIMIT_S (WAIT_S overrides).
wait_for() {
  local port="$1" what="$2" limit="${WAIT_S:-$3}" pid log t0
  shift 3
  read -r pid log <"/tmp/port-$port"
  t0=$(date +%s)
  until "$@" >/dev/null 2>&1; do
    if ! kill -0 "$pid" 2>/dev/null || (($(date +%s) - t0 > limit)); then
      echo "server :$port not $what ($log):"
      grep -B2 -A4 Error "$log" | tail -n 20
      exit 1
    fi
    sleep 2
  done
  echo "server :$port $what after $(($(date +%s) - t0)) s of waiting"
}

# group_pid PORT PATTERN: the pid of the process titled PATTERN in that server's process group
# (serve starts each server with setsid; vLLM titles its processes VLLM::EngineCore and
# VLLM::APIServer_N).
group_pid() {
  local pgid
  pgid="$(cut -d' ' -f1 "/tmp/port-$1")"
  ps -e -o pid=,pgid=,args= | awk -v g="$pgid" -v t="$2" '$2 == g && $3 ~ t {print $1; exit}'
}

# stop_server PORT: stop that server's process group; returns once the port is free and the
# GPU memory is back (the next server may reuse both).
stop_server() {
  kill -- -"$(cut -d' ' -f1 "/tmp/port-$1")" 2>/dev/null || true
  for _ in $(seq 60); do
    curl -s "http://127.0.0.1:$1/health" >/dev/null 2>&1 || break
    sleep 1
  done
  sleep 5
}

# finish_server NAME PORT: its whole log into $OUT, then stop it (the next one may reuse the port).
# NAME's server log into $OUT as NAME-server$SUFFIX.log, as it is now.
save_server_log() {
  cp "/tmp/vllm-$1.log" "$OUT/$1-server${2:-}.log" 2>/dev/null || true
}

finish_server() {
  save_server_log "$1"
  stop_server "$2"
}

# The plugin's settings as the chart sets them (values.yaml server.pluginEnv).
CHART_ENV="GEMMA4_ENGINE_GPU_BATCHING=1 GEMMA4_MEDIA_UINT8=on GEMMA4_MEDIA_FRAME_THREADS=2"
# The chart's own flags after the blog's (server.apiServerCount and its FULL CUDA graph profile:
# maxNumBatchedTokens, attentionBackend, compilationConfig), as the entrypoint passes them;
# `h200.sh chart-args` prints them for EXTRA_ARGS (a test keeps them equal to the chart's).
CHART_ARGS="--api-server-count 8 --max-num-batched-tokens 2560 --attention-backend TRITON_ATTN -cc.cudagraph_mode=FULL -cc.max_cudagraph_capture_size=2560"

# Servers started together need fixed KV sizes (one profiling while another loads sizes it wrong).
TOGETHER_ARGS="--gpu-memory-utilization 0.1 --kv-cache-memory-bytes 4G"
# The v2-ranges steps' servers: no torch.compile (-cc.mode=0), so eager and FULL run the same
# kernels and differ by the graphs (and their padded batches). ATTN_ARGS: e.g.
# "--attention-backend TRITON_ATTN" (vLLM 0.33 on Hopper picks TRITON_FLASH_ATTN, which narrows
# FULL to FULL_DECODE_ONLY: twenty-seventh sitting).
V2_ARGS="$TOGETHER_ARGS -cc.mode=0${ATTN_ARGS:+ $ATTN_ARGS}"
V2_FULL_ARGS="$V2_ARGS -cc.cudagraph_mode=FULL -cc.max_cudagraph_capture_size=2560 --max-num-batched-tokens 2560"

cmd="${1:?step}"
shift
case "$cmd" in
stage)
  mkdir -p /tmp/parts
  find "$REPO/.whl" -name 'part-*' -exec cp {} /tmp/parts/ \;
  ls /tmp/parts | wc -l
  ;;
prebuild)
  # the model needs only the host's torch + transformers: build it while parts are staged. From a
  # copy: each later call replaces the tree under it (the thirty-fourth sitting's prebuild, run
  # from the tree, failed to import the plugin midway).
  rm -rf /tmp/prebuild && mkdir -p /tmp/prebuild
  cp "$REPO/local/build_model.py" /tmp/prebuild/ && cp -r "$REPO/plugin/src/gemma4_batched_encoder" /tmp/prebuild/
  (
    cd /tmp/prebuild
    export PYTHONPATH=/tmp/prebuild # the builder reads the plugin's presets; not installed yet
    setsid nohup bash -c "python3 build_model.py $MODEL_ARGS && touch /tmp/model-built" \
      >/tmp/model-build.log 2>&1 &
    echo $! >/tmp/model-build.pid
  )
  echo "building $MODEL_DIR in the background (/tmp/model-build.log)"
  ;;
install)
  # INSTALL_MODEL=0: the wheels only (CPU work, e.g. while a background GPU probe runs); a later
  # `install` then only builds the model.
  t0=$(date +%s)
  # An earlier sitting's compile caches, carried beside the last part: a server then loads
  # vLLM's AOT-compiled model and the plugin's compiled encoder instead of compiling them
  # (thirty-seventh sitting, one H100: healthy after 123 s warm against 211 s with empty caches)
  if [[ -f "$REPO/.cache/gpu/compile-caches.tgz" && ! -e /tmp/caches-restored ]]; then
    tar -xzf "$REPO/.cache/gpu/compile-caches.tgz" -C /
    touch /tmp/caches-restored
    echo "compile caches restored: $(du -sh "$HOME/.cache/vllm" "/tmp/torchinductor_$(whoami)" |
      tr '\n\t' '  ')"
  fi
  if [[ ! -e /tmp/site-installed ]]; then
    mkdir -p /tmp/wh
    cat /tmp/parts/part-* | tar -x -C /tmp/wh
    wheelhouse=(/tmp/wh/*) # one folder: the wheelhouse's name
    bash "$REPO/bench/gpu/install-wheelhouse.sh" "${wheelhouse[0]}" "$SITE" \
      $(find "$REPO/.whl" -type f -name '*.whl')
    touch /tmp/site-installed
  fi
  if [[ "${INSTALL_MODEL:-1}" == 0 ]]; then
    echo "wheels installed in $(($(date +%s) - t0)) s; the model is built by the next install"
    exit 0
  fi
  if [[ -e /tmp/model-build.pid ]]; then
    while kill -0 "$(cat /tmp/model-build.pid)" 2>/dev/null; do sleep 2; done
  fi
  if [[ -e /tmp/model-built ]]; then
    echo "model built in the background: $(tail -n 1 /tmp/model-build.log)"
  else
    # no prebuild, or it failed (its log's last lines say why): build now, with the site installed
    [[ -e /tmp/model-build.log ]] && echo "background build failed: $(tail -n 1 /tmp/model-build.log)"
    python3 "$REPO/local/build_model.py" $MODEL_ARGS
  fi
  du -sh "$MODEL_DIR"
  python3 -c 'import torch; print("torch", torch.__version__, "cuDNN", torch.backends.cudnn.version(),
    "NCCL", torch.cuda.nccl.version(), torch.cuda.get_device_name())'
  echo "install took $(($(date +%s) - t0)) s"
  nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
  # the API servers' media work is CPU-bound: hosts' CPUs differed 2x (twenty-third sitting)
  echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), $(nproc) cores"
  ;;
verify | encoder)
  cd "$REPO"
  for mode in exact fast; do
    python3 -m gemma4_batched_encoder.verify --preset e4b --device cuda --dtype bf16 --mode "$mode" \
      --videos 16 --frames 6 --images 4 >"$OUT/verify-$mode.json" || echo "verify $mode: exit $?"
    python3 -c "import json,sys; d=json.load(open('$OUT/verify-$mode.json')); print('$mode', {k: d[k] for k in ('bit_identical','max_abs_diff') if k in d})"
  done
  [[ "$cmd" == verify ]] && exit 0
  python3 -m gemma4_batched_encoder.bench --preset e4b --device cuda --dtype bf16 \
    --videos 1,2,4,8,16 --out "$OUT/encoder-bench.json"
  python3 bench/media_stages.py --processor-only --model "$MODEL_DIR" --out "$OUT/media-processor-only.json" ||
    echo "media stages: exit $?"
  ;;
stock-vs-plugin)
  # eager: compiled processes fall into per-process numerics classes, stock ones too (nineteenth
  # sitting), eager ones agree bit for bit
  B="$REPO/bench/gpu/h200.sh"
  E="$TOGETHER_ARGS --enforce-eager"
  bash "$B" serve stock 8001 VLLM_PLUGINS= EXTRA_ARGS="$E"
  bash "$B" serve plugin 8002 $CHART_ENV GEMMA4_ENCODER_VERIFY_EVERY=1 EXTRA_ARGS="$E"
  ;;
stock-vs-plugin-check)
  B="$REPO/bench/gpu/h200.sh"
  bash "$B" wait 8001 8002
  HISTORY=0 bash "$B" greedy-servers stock:8001 plugin:8002
  for spec in stock:8001 plugin:8002; do
    name="${spec%%:*}" port="${spec##*:}"
    save_metrics "$port" "$OUT/$name-metrics.txt"
    grep -m2 -o "LLM engine (v[0-9.]*)\|Using V[12] Model Runner" "$(log_of "$port")" || true
    gzip -c "$(log_of "$port")" >"$OUT/$name.log.gz"
  done
  grep -h "gemma4_batched_encoder" "$(log_of 8002)" | grep -v registered | cut -c1-300 | head -20 || true
  grep "gemma4_encoder_verify" "$OUT/plugin-metrics.txt" || echo "no shadow verifications counted"
  stop_server 8001
  stop_server 8002
  ;;
v2-ranges-serve)
  B="$REPO/bench/gpu/h200.sh"
  bash "$B" serve v2-eager 8001 VLLM_USE_V2_MODEL_RUNNER=1 EXTRA_ARGS="$V2_ARGS --enforce-eager"
  bash "$B" serve v2-full 8002 VLLM_USE_V2_MODEL_RUNNER=1 EXTRA_ARGS="$V2_FULL_ARGS"
  bash "$B" serve v2-full-off 8003 VLLM_USE_V2_MODEL_RUNNER=1 GEMMA4_ENGINE_GRAPH_RANGES=0 \
    EXTRA_ARGS="$V2_FULL_ARGS"
  ;;
v2-ranges)
  B="$REPO/bench/gpu/h200.sh"
  bash "$B" wait 8001 8002 8003
  logs=()
  for spec in v2-eager:8001 v2-full:8002 v2-full-off:8003; do
    name="${spec%%:*}" port="${spec##*:}"
    bash "$B" greedy "$name" "$port" v2 || echo "$name: greedy exit $?"
    save_metrics "$port" "$OUT/$name-metrics.txt"
    echo "$name: $(grep -m1 -o 'Using V[12] Model Runner\|V[12] model runner' "$(log_of "$port")" || true)"
    # (the last alternative: vLLM narrowing FULL for its attention backend, 0.33 on Hopper)
    grep -h "gemma4_batched_encoder: \(image ranges\|cudagraph_mode\|a step with\|vLLM runs\)\|is not supported with" \
      "$(log_of "$port")" | cut -c1-300 || true
    grep "full_graph_refusals_total" "$OUT/$name-metrics.txt" || true
    logs+=("$(log_of "$port")")
  done
  tar -czf "$OUT/v2-logs.tgz" -C /tmp "${logs[@]#/tmp/}" # (serve writes them under /tmp)
  for name in v2-full v2-full-off; do
    echo "$name vs v2-eager: $(python3 "$REPO/bench/greedy_outputs.py" --compare \
      "$OUT/v2-eager-greedy-v2.json" "$OUT/$name-greedy-v2.json" || true)"
  done
  mkdir -p /tmp/v2 && cp "$OUT"/v2-*-greedy-v2.json /tmp/v2/ # ($OUT is new each device call)
  ;;
v2-ranges-refusals)
  # (after v2-ranges; on an 80 GB card the fourth server fits only once the third has stopped)
  B="$REPO/bench/gpu/h200.sh"
  stop_server 8003
  bash "$B" serve v2-w2 8004 VLLM_USE_V2_MODEL_RUNNER=1 GEMMA4_ENGINE_GRAPH_RANGES=2 \
    EXTRA_ARGS="$V2_FULL_ARGS"
  bash "$B" wait 8004
  bash "$B" greedy v2-w2 8004 v2
  save_metrics 8004 "$OUT/v2-w2-metrics.txt"
  grep "full_graph_refusals_total" "$OUT/v2-w2-metrics.txt" || true
  grep -h "gemma4_batched_encoder: \(image ranges\|a step with\)" "$(log_of 8004)" | cut -c1-300 || true
  echo "v2-w2 vs v2-eager: $(python3 "$REPO/bench/greedy_outputs.py" --compare \
    /tmp/v2/v2-eager-greedy-v2.json "$OUT/v2-w2-greedy-v2.json" || true)"
  gzip -c "$(log_of 8004)" >"$OUT/v2-w2.log.gz"
  ;;
graph-ranges)
  cd "$REPO"
  python3 plugin/tests/graph_ranges_kernel_check.py --device cuda >"$OUT/graph-ranges-kernel.json" ||
    echo "graph-ranges check: exit $?"
  python3 -c "import json; d=json.load(open('$OUT/graph-ranges-kernel.json')); [print(k, v) for k, v in d.items()]" ||
    true # (a failed check left no JSON: its exit status is printed above)
  ;;
graphs)
  # The encoder's CUDA graphs under the host's transformers (5.17 builds an all-true mask while a
  # stream captures; eighth sitting): verify with fused layers (padded 480p frames, and unpadded
  # 21x30 frames with fused on and off: the unfused graphs get 5.17's capture-time mask), fast
  # mode, then exact-fused vs fast timings. Each run's failed captures are counted from its log.
  cd "$REPO"
  export PYTHONPATH="$REPO/plugin/src:$PYTHONPATH" # the tree's plugin, installed or not
  E="--preset e4b --device cuda --dtype bf16"
  logged() {
    local name="$1" rc=0
    shift
    "$@" >"$OUT/$name.json" 2>"/tmp/$name.log" || rc=$?
    echo "$name: exit $rc, $(grep -c 'capture failed' "/tmp/$name.log") failed captures," \
      "$(python3 -c "import json; d=json.load(open('$OUT/$name.json')); print({k: d.get(k) for k in ('bit_identical', 'max_abs_diff', 'cuda_graphs_captured')})" 2>/dev/null)"
  }
  GEMMA4_ENCODER_FUSED=on logged verify-fused python3 -m gemma4_batched_encoder.verify $E \
    --videos 1,16 --images 4
  for fused in on off; do
    GEMMA4_ENCODER_FUSED=$fused logged "verify-unpadded-fused-$fused" \
      python3 -m gemma4_batched_encoder.verify $E --frame-grid 21x30 --videos 1,16 --images 4
  done
  GEMMA4_ENCODER_FUSED=on logged verify-fast python3 -m gemma4_batched_encoder.verify $E \
    --mode fast --videos 1,16 --images 4
  # bench prints its table to stdout and writes JSON only with --out (tenth sitting: the table
  # went into encoder-bench.json)
  python3 -m gemma4_batched_encoder.bench $E --videos 1,16 --warmup 3 --repeats 10 \
    --methods exact-fused,fast --out "$OUT/encoder-bench.json" >"$OUT/encoder-bench-table.txt" \
    2>/tmp/encoder-bench.log || echo "encoder bench: exit $?"
  grep -h -A25 -m1 "capture failed" /tmp/verify-*.log /tmp/encoder-bench.log >"$OUT/capture-failures.txt" || true
  echo "encoder bench: $(grep -c 'capture failed' /tmp/encoder-bench.log) failed captures"
  cat "$OUT/encoder-bench-table.txt"
  ;;
fast-probe)
  # fast mode's kernel choices side by side (GEMMA4_ENCODER_FAST_KERNELS=${KERNELS:-stock merged
  # merged-triton}): deviation from exact (verify), time with CUDA graphs beside exact-fused
  # (bench), and where the GPU time goes at 16 videos (bench/encoder_kernel_profile.py)
  cd "$REPO"
  export PYTHONPATH="$REPO/plugin/src:$PYTHONPATH"
  E="--preset e4b --device cuda --dtype bf16"
  # the float8 GELU x up + quantize kernel against torch (on a GPU: no interpreter carries)
  python3 plugin/tests/fp8_kernel_check.py --device cuda >"$OUT/fp8-kernel-check.json" ||
    echo "fp8 kernel check: exit $?"
  for k in ${KERNELS:-stock merged merged-triton}; do
    export GEMMA4_ENCODER_FAST_KERNELS="$k"
    python3 -m gemma4_batched_encoder.verify $E --mode fast --videos 1,16 --images 4 --noise-floor \
      >"$OUT/fast-$k-verify.json" 2>"/tmp/fast-$k.log" || true # exits 1: fast is not bitwise
    python3 -c "import json; d=json.load(open('$OUT/fast-$k-verify.json')); print('$k verify', {x: d.get(x) for x in ('max_abs_diff', 'max_rel_diff', 'stock_vs_fp32', 'plugin_vs_fp32', 'cuda_graphs_captured')})" ||
      tail -n 5 "/tmp/fast-$k.log"
    python3 -m gemma4_batched_encoder.bench $E --videos 1,16 --warmup 3 --repeats 10 \
      --methods exact-fused,fast --out "$OUT/fast-$k-bench.json" >"$OUT/fast-$k-bench.txt" \
      2>>"/tmp/fast-$k.log" || echo "bench $k: exit $?"
    grep -E "^ *(1|16) " "$OUT/fast-$k-bench.txt" || tail -n 8 "$OUT/fast-$k-bench.txt"
    # the same call with the token counts read back from the device inside it, as the bench
    # timed before the eighteenth sitting (vLLM passes video frames' counts from the host)
    python3 -m gemma4_batched_encoder.bench $E --videos 1,16 --warmup 3 --repeats 10 \
      --methods fast --token-counts device --out "$OUT/fast-$k-bench-device-counts.json" \
      >"$OUT/fast-$k-bench-device-counts.txt" 2>>"/tmp/fast-$k.log" || echo "bench $k (device counts): exit $?"
    grep -E "^ *(1|16) " "$OUT/fast-$k-bench-device-counts.txt" | sed 's/^/device counts: /' || true
    for n in 16 1; do # 1 video: the launches that bound it (3.4 ms against the 3 ms target)
      python3 bench/encoder_kernel_profile.py --mode fast --videos "$n" \
        --out "$OUT/fast-$k-profile$([[ $n == 1 ]] && echo -1v).json" 2>>"/tmp/fast-$k.log" ||
        echo "profile $k ($n videos): exit $?"
    done
  done
  if [[ "${EXACT_PROFILE:-1}" == 1 ]]; then
    GEMMA4_ENCODER_FAST_KERNELS=stock GEMMA4_ENCODER_FUSED=on python3 bench/encoder_kernel_profile.py \
      --mode exact --videos 16 --out "$OUT/exact-fused-profile.json" 2>>/tmp/fast-exact.log ||
      echo "profile exact: exit $?"
  fi
  ;;
fast-tune)
  cd "$REPO"
  export PYTHONPATH="$REPO/plugin/src:$PYTHONPATH" GEMMA4_ENCODER_FAST_KERNELS=merged-triton-fp8
  table=plugin/src/gemma4_batched_encoder/fast_launch.json
  # every launch of the float8 kernel gives the same bytes, compiled (the interpreter's in make test)
  python3 plugin/tests/fp8_kernel_check.py --device cuda >"$OUT/fp8-kernel-check.json" ||
    echo "fp8 kernel check: exit $?"
  python3 bench/fast_kernel_tune.py --write "$table" --out "$OUT/fast-kernel-tune.json" ||
    echo "tune: exit $?"
  cp "$table" "$OUT/"
  # the bench CLI (issue 3's figures) and the kernel profile with the table just written
  python3 -m gemma4_batched_encoder.bench --preset e4b --device cuda --dtype bf16 --videos 1,16 \
    --warmup 3 --repeats 10 --methods exact-fused,fast --out "$OUT/fast-bench.json" \
    >"$OUT/fast-bench.txt" 2>/tmp/fast-tune-bench.log || echo "bench: exit $?"
  grep -E "^ *(1|16) " "$OUT/fast-bench.txt" || tail -n 8 /tmp/fast-tune-bench.log
  # the same with the residual add + norm + quantize kernel (opt-in)
  GEMMA4_ENCODER_FAST_KERNELS=merged-triton-fp8-norms python3 -m gemma4_batched_encoder.bench \
    --preset e4b --device cuda --dtype bf16 --videos 1,16 --warmup 3 --repeats 10 --methods fast \
    --out "$OUT/fast-bench-norms.json" >"$OUT/fast-bench-norms.txt" 2>>/tmp/fast-tune-bench.log ||
    echo "bench norms: exit $?"
  grep -E "^ *(1|16) " "$OUT/fast-bench-norms.txt" || tail -n 8 /tmp/fast-tune-bench.log
  # the deviation from exact with the table just written (a launch may change the row sums'
  # order; the q/k/v kernel's quarter loads do)
  GEMMA4_ENCODER_FAST_KERNELS=merged-triton-fp8-norms python3 -m gemma4_batched_encoder.verify \
    --preset e4b --device cuda --dtype bf16 --mode fast --videos 1,16 --images 4 --noise-floor \
    >"$OUT/fast-verify-norms.json" 2>>/tmp/fast-tune-bench.log || true # fast is never bitwise
  python3 -c "import json; d=json.load(open('$OUT/fast-verify-norms.json')); print('verify', {x: d.get(x) for x in ('max_abs_diff', 'stock_vs_fp32', 'plugin_vs_fp32')})" ||
    tail -n 5 /tmp/fast-tune-bench.log
  python3 bench/encoder_kernel_profile.py --mode fast --videos 16 --out "$OUT/fast-profile.json" ||
    echo "profile: exit $?"
  ;;
fast-layouts)
  cd "$REPO"
  export PYTHONPATH="$REPO/plugin/src:$PYTHONPATH"
  E="--preset e4b --device cuda --dtype bf16 --videos 1,16 --warmup 5 --repeats 30"
  for run in "norms-stacked merged-triton-fp8-norms stacked exact-fused,fast" \
    "norms-list merged-triton-fp8-norms list exact-fused,fast" \
    "fp8-stacked merged-triton-fp8 stacked fast" "fp8-list merged-triton-fp8 list fast"; do
    read -r name kernels layout methods <<<"$run"
    GEMMA4_ENCODER_FAST_KERNELS="$kernels" timeout 150 python3 -m gemma4_batched_encoder.bench $E \
      --layout "$layout" --methods "$methods" --out "$OUT/$name.json" >"/tmp/$name.txt" \
      2>"/tmp/$name.log" || tail -n 5 "/tmp/$name.log"
    grep -E "^ *(1|16) " "/tmp/$name.txt" | sed "s/^/$name: /" || true
  done
  GEMMA4_ENCODER_FAST_KERNELS=merged-triton-fp8-norms python3 bench/fast_replay_split.py \
    --out "$OUT/replay-split.json" || echo "replay split: exit $?"
  ;;
fast-epilogues)
  # float8 fast mode with and without the Triton GEMMs that carry the norms + rotary and GELU x up
  # in their epilogues (fp8_gemm.py; -gemms: the down GEMM quantizing its input too): the kernels
  # against torch compiled, the GEMM probe (its fastest launches entered in this tree's
  # fast_launch.json, returned), then the bench CLI side by side (ABCABC), the deviations, a
  # profile. ~13 min: `bg`, then `collect`.
  cd "$REPO"
  export PYTHONPATH="$REPO/plugin/src:$PYTHONPATH"
  table=plugin/src/gemma4_batched_encoder/fast_launch.json
  # Each part under its own time limit: the kernels have never run on a GPU, and the one attempt
  # so far lost the machine mid-run (twenty-third sitting, cause unknown); a hung kernel must not
  # take the others' time. A failed check stops the step: timings of wrong kernels mean nothing.
  rc=0
  timeout 240 python3 plugin/tests/fp8_gemm_check.py --device cuda >"$OUT/fp8-gemm-check.json" || rc=$?
  if ((rc != 0)); then
    echo "gemm check: exit $rc (124: time limit); the probe, bench, verify and profile are skipped"
    exit 1
  fi
  timeout 240 python3 bench/fp8_gemm_probe.py --epilogues-only --write "$table" \
    --out "$OUT/fp8-gemm-probe.json" || echo "probe: exit $?"
  cp "$table" "$OUT/"
  E="--preset e4b --device cuda --dtype bf16"
  for run in norms-1 epilogues-1 gemms-1 norms-2 epilogues-2 gemms-2; do
    kernels="merged-triton-fp8-${run%-*}"
    GEMMA4_ENCODER_FAST_KERNELS="$kernels" timeout 150 python3 -m gemma4_batched_encoder.bench $E \
      --videos 1,16 --warmup 5 --repeats 30 --layout stacked --methods fast \
      --out "$OUT/bench-$run.json" >"/tmp/bench-$run.txt" 2>"/tmp/bench-$run.log" ||
      tail -n 5 "/tmp/bench-$run.log"
    grep -E "^ *(1|16) " "/tmp/bench-$run.txt" | sed "s/^/$run: /" || true
  done
  for kind in epilogues gemms; do
    GEMMA4_ENCODER_FAST_KERNELS="merged-triton-fp8-$kind" timeout 150 python3 -m gemma4_batched_encoder.verify \
      $E --mode fast --videos 1,16 --images 4 --noise-floor >"$OUT/verify-$kind.json" \
      2>"/tmp/verify-$kind.log" || true # fast is never bitwise
    python3 -c "import json; d=json.load(open('$OUT/verify-$kind.json')); print('verify $kind', {x: d.get(x) for x in ('max_abs_diff', 'stock_vs_fp32', 'plugin_vs_fp32')})" ||
      tail -n 5 "/tmp/verify-$kind.log"
  done
  GEMMA4_ENCODER_FAST_KERNELS=merged-triton-fp8-gemms timeout 150 python3 bench/encoder_kernel_profile.py \
    --mode fast --videos 16 --out "$OUT/profile-gemms.json" >/dev/null 2>&1 ||
    echo "profile: exit $?"
  ;;
host)
  cd "$REPO"
  # HOST_CHECKS=1: only the exactness checks below (the timings above them were measured in
  # earlier sittings; the checks need no idle CPUs)
  if [[ "${HOST_CHECKS:-0}" != 1 ]]; then
    python3 bench/media_request_profile.py --model "$MODEL_DIR" --out "$OUT/media-request-profile.txt" ||
      echo "request profile: exit $?"
    python3 bench/media_source_key.py --out "$OUT/media-source-key.json" || echo "source key: exit $?"
    python3 bench/media_frame_call.py --model "$MODEL_DIR" --out "$OUT/media-frame-call.json" ||
      echo "frame call: exit $?"
    python3 bench/media_decode.py --reps 9 --out "$OUT/media-decode.json" || echo "decode: exit $?"
    # OpenCV's own pool at its default (one worker per core) against one thread, idle and with 8
    # spinning processes (GEMMA4_MEDIA_CV2_THREADS; thirtieth sitting: 17.6 ms of CPU, 7.8 of wall)
    python3 bench/cv2_pool.py --reps 30 --busy 8 --out "$OUT/cv2-pool.json" || echo "cv2 pool: exit $?"
    python3 bench/decode_breakdown.py --out "$OUT/decode-breakdown.json" || echo "breakdown: exit $?"
    python3 bench/media_overlap.py --model "$MODEL_DIR" --out "$OUT/media-overlap.json" ||
      echo "overlap: exit $?"
  fi
  # swscale's conversion reproduced with tensor ops, against this host's OpenCV, on the CPU and
  # the GPU (the step before a hardware decode can keep stock's pixels; bench/MEDIA.md)
  for dev in cpu cuda; do
    python3 bench/yuv_rgb_exact.py --device "$dev" --out "$OUT/yuv-rgb-exact-$dev.json" >/dev/null ||
      echo "yuv->rgb on $dev: exit $? (differences, or no PyAV in the wheelhouse)"
  done
  # the processor's antialiased bicubic resize as integer tensor ops on the GPU against
  # torchvision's CPU resize, and its time beside the CPU's (the next step of a GPU-side
  # preprocessing; NVDEC itself is settled: bench/nvdec_exact.py, nineteenth sitting)
  python3 bench/resize_exact.py --device cuda --out "$OUT/resize-exact-cuda.json" >/dev/null ||
    echo "resize on cuda: exit $?"
  ;;
cv2-pool)
  cd "$REPO"
  python3 bench/cv2_pool.py --reps 30 --busy 8 --out "$OUT/cv2-pool.json" | tee "$OUT/cv2-pool.txt" ||
    echo "cv2 pool: exit $?"
  ;;
nvdec-cpu)
  cd "$REPO"
  python3 bench/nvdec_cpu.py --out "$OUT/nvdec-cpu.json" | tee "$OUT/nvdec-cpu.txt" ||
    echo "nvdec-cpu: exit $?"
  ;;
serve)
  name="${1:?name}" port="${2:?port}"
  shift 2
  (
    for kv in "$@"; do export "${kv?}"; done
    export MODEL="$MODEL_DIR" HOST=127.0.0.1 PORT="$port"
    export VLLM_LAUNCHER="${VLLM_LAUNCHER:-python3 -m vllm.entrypoints.cli.main serve}"
    export PROMETHEUS_MULTIPROC_DIR="/tmp/prom-$name"
    export GEMMA4_WARMUP_DONE_FILE="/tmp/warmup-$port.done"
    rm -f "/tmp/warmup-$port.expected"
    if [[ "${FRESH_CACHES:-0}" == 1 ]]; then # compiles alone, shares no cached artifact
      export VLLM_CACHE_ROOT="/tmp/cache-$name/vllm" TORCHINDUCTOR_CACHE_DIR="/tmp/cache-$name/inductor" \
        TRITON_CACHE_DIR="/tmp/cache-$name/triton"
    fi
    if [[ "${GEMMA4_WARMUP:-0}" == 1 ]]; then touch "/tmp/warmup-$port.expected"; fi
    dig=""
    if [[ "${DIGEST:-0}" == 1 ]]; then # the weights' digests over vLLM's dev RPC (`digest` step)
      cp "$REPO/bench/param_digest.py" "$SITE/" # not the tree: the next call replaces it
      export VLLM_SERVER_DEV_MODE=1
      dig="--worker-extension-cls param_digest.ParamDigest"
    fi
    # dynamo names any recompile at serving time in the server log (a stall's other suspect)
    export TORCH_LOGS="${TORCH_LOGS:-recompiles}"
    load=""
    compgen -G "$MODEL_DIR/*.safetensors" >/dev/null || load="--load-format dummy"
    export VLLM_EXTRA_ARGS="$load --served-model-name $SERVED --max-model-len 8192 $dig ${EXTRA_ARGS:-}"
    setsid nohup "$REPO/images/entrypoint.sh" >"/tmp/vllm-$name.log" 2>&1 &
    echo "$! /tmp/vllm-$name.log" >"/tmp/port-$port"
  )
  printf '%s\n' "$@" >"/tmp/serve-args-$name" # for `restart`
  echo "started $name on :$port"
  ;;
restart)
  # Stop NAME's server and start it again with the same settings. With FRESH_CACHES=1 it then
  # loads its own compiled artifacts (vLLM's cache holds inductor's, autotuning results
  # included), as a restarted pod does from the chart's model volume. `restart NAME PORT AS
  # NEW NEWPORT` starts NEW on a copy of NAME's caches instead, as a second replica sharing them
  # would. Then: does the greedy-output class travel with the caches?
  name="${1:?name}" port="${2:?port}" new="${4:-$1}" newport="${5:-$2}"
  mapfile -t args <"/tmp/serve-args-$name"
  stop_server "$port"
  if [[ "$new" != "$name" ]]; then
    rm -rf "/tmp/cache-$new" && cp -a "/tmp/cache-$name" "/tmp/cache-$new"
  fi
  bash "$REPO/bench/gpu/h200.sh" serve "$new" "$newport" "${args[@]}"
  ;;
wait)
  for port in "$@"; do
    wait_for "$port" "healthy" 420 curl -sf "http://127.0.0.1:$port/health"
    # started with GEMMA4_WARMUP=1: also its warm-up, as the chart's startup probe does
    if [[ -e "/tmp/warmup-$port.expected" ]]; then
      wait_for "$port" "warmed up" 300 test -f "/tmp/warmup-$port.done"
    fi
  done
  ;;
stop)
  for port in "${@:?port}"; do stop_server "$port"; done
  nvidia-smi --query-gpu=memory.used --format=csv,noheader
  ;;
wait-kv)
  port="${1:?port}"
  wait_for "$port" "KV cache sized" 300 grep -q "GPU KV cache size" "$(log_of "$port")"
  grep -m1 -o "GPU KV cache size.*" "$(log_of "$port")"
  ;;
greedy)
  name="${1:?name}" port="${2:?port}" tag="${3:?tag}"
  cd "$REPO"
  python3 bench/greedy_outputs.py --target "http://127.0.0.1:$port" --model "$SERVED" \
    --out "$OUT/$name-greedy-$tag.json"
  ;;
digest)
  # the weights a DIGEST=1 server holds, digested on the GPU (bench/param_digest.py); with a
  # second name, compared: do two processes run the same model bit for bit?
  name="${1:?name}" port="${2:?port}"
  python3 "$REPO/bench/param_digest.py" --target "http://127.0.0.1:$port" --out "$OUT/$name-digest.json"
  if [[ -n "${3:-}" ]]; then
    python3 "$REPO/bench/param_digest.py" --compare "$OUT/$3-digest.json" "$OUT/$name-digest.json" || true
  fi
  ;;
greedy-history)
  # Do a server's greedy outputs depend on the traffic it served before? Greedy outputs, then the
  # chart's warm-up traffic (gemma4_batched_encoder.warmup: a client, so stock servers too), then
  # greedy outputs again, and the two compared (the sixteenth sitting's chart-configured plugin
  # server, measured after its warm-up, differed from stock in logprobs, text included).
  name="${1:?name}" port="${2:?port}"
  cd "$REPO"
  python3 bench/greedy_outputs.py --target "http://127.0.0.1:$port" --model "$SERVED" \
    --out "$OUT/$name-greedy-before.json"
  python3 -m gemma4_batched_encoder.warmup --target "http://127.0.0.1:$port" --model "$SERVED" \
    >"$OUT/$name-warmup.json" || echo "warm-up: exit $?"
  python3 bench/greedy_outputs.py --target "http://127.0.0.1:$port" --model "$SERVED" \
    --out "$OUT/$name-greedy-after.json"
  echo "$name, before vs after the warm-up's traffic:"
  python3 bench/greedy_outputs.py --compare "$OUT/$name-greedy-before.json" \
    "$OUT/$name-greedy-after.json" || true
  ;;
greedy-servers)
  # Which servers' greedy outputs agree, and does each one's history matter: greedy-history on
  # each, then each `before` against the first server's (FRESH_CACHES=1 servers started together:
  # no shared compile artifacts; their compile lines say what each compiled or loaded).
  first=""
  caches=()
  for spec in "$@"; do
    name="${spec%%:*}" port="${spec##*:}"
    if [[ "${HISTORY:-1}" == 1 ]]; then
      bash "$REPO/bench/gpu/h200.sh" greedy-history "$name" "$port" || echo "$name: exit $?"
    else # HISTORY=0: one set, no warm-up traffic (the seventeenth sitting ruled history out)
      bash "$REPO/bench/gpu/h200.sh" greedy "$name" "$port" before || echo "$name: exit $?"
    fi
    grep -E "compil|Directly load|cache" "/tmp/vllm-$name.log" | grep -v "^.*Capturing" |
      cut -c1-300 >"$OUT/$name-compile.txt" || true
    # Which numerics switches the server started with (the engine core inherits them). Read from
    # the process that exec'd vLLM: the engine core renames itself (setproctitle), which
    # overwrites its /proc environ (the nineteenth sitting's VLLM_BATCH_INVARIANT=1 servers showed
    # none there while their logs show the batch-invariant kernels registered).
    leader="$(cut -d' ' -f1 "/tmp/port-$port")"
    tr '\0' '\n' <"/proc/$leader/environ" | grep -E "^(TORCHINDUCTOR_|VLLM_BATCH_INVARIANT|CUBLAS)" |
      sed "s/^/$name: /" || echo "$name: none of the numerics switches"
    grep -m1 -o "batch_invariant.py:[0-9]*" "/tmp/vllm-$name.log" | sed "s/^/$name: kernels registered at /" || true
    if [[ -d "/tmp/cache-$name" ]]; then caches+=("$name=/tmp/cache-$name"); fi
    if [[ -z "$first" ]]; then
      first="$name"
    else
      echo "$first vs $name, before any media:"
      python3 "$REPO/bench/greedy_outputs.py" --compare "$OUT/$first-greedy-before.json" \
        "$OUT/$name-greedy-before.json" || true
    fi
  done
  # the launch-time autotuning choices of FRESH_CACHES=1 servers, pair by pair
  if ((${#caches[@]} > 1)); then
    python3 "$REPO/bench/inductor_configs.py" "${caches[@]}" --out "$OUT/inductor-configs.json" |
      grep -v "^    " || true
  fi
  ;;
measure)
  name="${1:?name}" port="${2:?port}" rates="${3:?rates}" duration="${4:?duration}"
  cd "$REPO"
  if [[ -z "${SWEEP_ONLY:-}" ]]; then
    bash "$REPO/bench/gpu/h200.sh" probe "$name" "$port"
  else
    # A fresh server captures its encoder CUDA graphs (one per batch bucket) on first use: warm
    # them before the sweep, as the TTFT-gap run does otherwise (the seventh sitting's uint8 run
    # went straight into 40 req/s and was confounded by it).
    python3 bench/ttft_gap.py --target "http://127.0.0.1:$port" --model "$SERVED" --n 3 \
      --burst 16 --out "/tmp/warmup-$name.json" >/dev/null || echo "warm-up: exit $?"
  fi
  bash "$REPO/bench/gpu/h200.sh" sweep "$name" "$port" "$rates" "$duration"
  ;;
probe)
  # greedy outputs, the single-request TTFT gap and bursts (measure's first half)
  name="${1:?name}" port="${2:?port}"
  cd "$REPO"
  python3 bench/greedy_outputs.py --target "http://127.0.0.1:$port" --model "$SERVED" \
    --out "$OUT/$name-greedy.json" || echo "greedy outputs: exit $?"
  # --multiproc-dir: which API-server process took each sequential request, and whether it was
  # that process's first (the thirty-seventh's slow requests were first-time work; whose?)
  gap=(python3 bench/ttft_gap.py --target "http://127.0.0.1:$port" --model "$SERVED" --n 20
    --video-codec "${VIDEO_CODEC:-mpeg4}" --multiproc-dir "/tmp/prom-$name")
  # --watch-dir: which kernels compile during each phase (the ~1 s burst stalls of the ninth
  # and tenth sittings; tenth sitting's NOTES, section 3)
  "${gap[@]}" --burst 8,16 --watch-dir "$HOME/.triton/cache" --watch-dir "/tmp/torchinductor_$(whoami)" \
    --watch-dir "$HOME/.cache/vllm" --out "$OUT/$name-ttft.json" || echo "ttft gap: exit $?"
  # The same sequence with each stream read to its end (each request on an idle engine), over
  # one reused connection and over a new one each time: with 8 API servers 1-5 of 20 single
  # requests ran 40-65 ms slow, with one none (thirty-fifth sitting's NOTES, item 7), and the
  # probe above opens a new connection per request. ~5 s each.
  "${gap[@]}" --drain --out "$OUT/$name-ttft-drain.json" || echo "ttft gap, drained: exit $?"
  "${gap[@]}" --drain --fresh-connections --out "$OUT/$name-ttft-drain-fresh.json" ||
    echo "ttft gap, drained over fresh connections: exit $?"
  # The first sequence again, as it was (a new connection each, not drained): slow requests that
  # do not come back here were first-time work, not the connections (thirty-seventh sitting).
  "${gap[@]}" --out "$OUT/$name-ttft-again.json" || echo "ttft gap, again: exit $?"
  ;;
sweep)
  # the SLO sweep with the metrics around it and the log excerpt (measure's second half)
  name="${1:?name}" port="${2:?port}" rates="${3:?rates}" duration="${4:?duration}"
  cd "$REPO"
  save_metrics "$port" "$OUT/$name-metrics-before.txt" # the sweep's own per-stage breakdown
  slo-loadtest run --target "http://127.0.0.1:$port" --model "$SERVED" --workloads "${WORKLOADS:-text,video}" \
    --rates "$rates" --duration "$duration" --warmup 2 --max-workers 8 --tokenizer "$MODEL_DIR" \
    --extra-body '{"skip_special_tokens": false}' --request-timeout 15 --report-samples 2 --search-beyond --search-max-rate "${SEARCH_MAX:-80}" --search-resolution 5 \
    --video-codec "${VIDEO_CODEC:-mpeg4}" --out "$OUT/sweep-$name" --data-dir "/tmp/data-$name" \
    --no-print-summary ${LOADTEST_ARGS:-} || echo "sweep exit $?"
  # The device tool returns a limited number of files and folder depth: guidellm's per-step
  # reports go back as one archive (the 2026-11-30 sitting lost a results.csv to the count).
  if [[ -d "$OUT/sweep-$name/steps" ]]; then
    tar -czf "$OUT/sweep-$name/steps.tgz" -C "$OUT/sweep-$name" steps && rm -rf "$OUT/sweep-$name/steps"
  fi
  # The plugin's own lines (the media hooks' included: which are on is the first thing to check;
  # the twenty-ninth sitting's count check was off on 0.33), vLLM's start-up milestones and any
  # error; a line every API server logs alike (registration, media hooks) once.
  grep -E "ERROR|Traceback|gemma4_batched_encoder|gemma4 media|exact mode|fast mode|fused|Graph capturing|KV cache size|init engine|CUDA graph" \
    "/tmp/vllm-$name.log" | grep -v "registered" | awk '{
      k = $0; sub(/^\([^)]*\) [A-Z]+ [0-9-]+ [0-9:]+ /, "", k); if (!seen[k]++) print
    }' | head -40 >"$OUT/$name-log-excerpt.txt" || true
  save_metrics "$port" "$OUT/$name-metrics.txt"
  ;;
profile)
  name="${1:?name}" port="${2:?port}" workload="${3:?workload}" rate="${4:?rate}" seconds="${5:?seconds}"
  cd "$REPO"
  pgid="$(cut -d' ' -f1 "/tmp/port-$port")" # serve started the server with setsid: its group
  # with one API server the group's leader (the entrypoint exec'd into vLLM) is the API server
  engine="$(group_pid "$port" '^VLLM::EngineCore')" api="$(group_pid "$port" '^VLLM::APIServer')"
  api="${api:-$pgid}"
  echo "engine core pid ${engine:-?}, API server pid ${api:-?}"
  slo-loadtest run --target "http://127.0.0.1:$port" --model "$SERVED" --workloads "$workload" \
    --rates "$rate" --duration $((seconds + 15)) --warmup 2 --max-workers 8 --tokenizer "$MODEL_DIR" \
    --extra-body '{"skip_special_tokens": false}' --request-timeout 15 --report-samples 2 \
    --out "/tmp/profile-$name" --data-dir "/tmp/data-$name" --no-print-summary ${LOADTEST_ARGS:-} \
    >"/tmp/profile-$name.log" 2>&1 &
  load=$!
  # Profile only once the load has reached the server: the sixth sitting slept a fixed 10 s, and
  # its profiles caught an idle engine (guidellm was still generating its data).
  t0=$(date +%s)
  until curl -s "http://127.0.0.1:$port/metrics" |
    awk '/^vllm:num_requests_running/ {n += $2} END {exit !(n > 0)}'; do
    (($(date +%s) - t0 < 180)) || { echo "no request reached the server in 180 s"; break; }
    sleep 1
  done
  sleep 5 # past the warm-up
  echo "load reached the server after $(($(date +%s) - t0)) s"
  save_metrics "$port" "$OUT/$name-metrics-before.txt"
  python3 bench/proc_cpu.py --pgid "$pgid" --pid "$load" --seconds "$seconds" --out "$OUT/$name-cpu.json" \
    >"/tmp/cpu-$name.txt" &
  for what in engine api; do
    pid="${!what}"
    [[ -n "$pid" ]] || continue
    # Blocking reads (the default): with --nonblocking py-spy may return torn or stale stacks.
    py-spy record --pid "$pid" --duration "$seconds" --rate 50 --idle --threads --format raw \
      --output "$OUT/$name-$what.txt" >/dev/null 2>&1 &
  done
  wait "$load" || true
  wait || true # the profilers
  save_metrics "$port" "$OUT/$name-metrics.txt"
  grep -E "PASS|FAIL" "/tmp/profile-$name.log" || tail -n 5 "/tmp/profile-$name.log"
  head -n 14 "/tmp/cpu-$name.txt"
  [[ -s "$OUT/$name-engine.txt" ]] && python3 bench/pyspy_top.py "$OUT/$name-engine.txt" \
    --thread MainThread --below "execute_model (vllm/v1/worker/gpu_model_runner" --depth 3 \
    --out "$OUT/$name-engine-main-step.json" >"/tmp/step-$name.txt" && head -n 12 "/tmp/step-$name.txt"
  for what in engine api; do
    [[ -s "$OUT/$name-$what.txt" ]] &&
      python3 bench/pyspy_top.py "$OUT/$name-$what.txt" --top 25 --out "$OUT/$name-$what-top.json" \
        >"/tmp/top-$name-$what.txt" && head -n 30 "/tmp/top-$name-$what.txt"
  done
  ;;
packed)
  # STEP's files as one archive; the step's exit status is printed, not passed on, so the
  # archive is always written.
  name="${1:?name}"
  shift
  final="$OUT"
  export OUT="/tmp/packed-$name"
  mkdir -p "$OUT"
  if [[ -n "${PACK_WITHIN_S:-}" ]]; then
    # servers the step started run on (setsid): `stop PORT` in the next call
    marker="/tmp/packed-$name.start"
    touch "$marker"
    rc=0
    timeout -k 10 "$PACK_WITHIN_S" bash "$REPO/bench/gpu/h200.sh" "$@" || rc=$?
    if ((rc)); then
      echo "$1: exit $rc (PACK_WITHIN_S=$PACK_WITHIN_S)"
      # A step cut before finish_server leaves its servers' logs behind: pack them as they are,
      # so a cut call still says how far the start got (the thirty-sixth sitting's first H200
      # came back empty after a 292 s cold start).
      find /tmp -maxdepth 1 -name 'vllm-*.log' -newer "$marker" | while read -r log; do
        server="$(basename "$log" .log)" && server="${server#vllm-}"
        [[ -e "$OUT/$server-server.log" ]] || save_server_log "$server" -cut
      done
    fi
  else
    bash "$REPO/bench/gpu/h200.sh" "$@" || echo "$1: exit $?"
  fi
  tar -czf "$final/$name.tgz" -C "$OUT" .
  ls -la "$final/$name.tgz"
  ;;
bg)
  # From a snapshot of the tree: every device call replaces the working tree it runs in, and a
  # job importing from it then fails (seventeenth sitting: ModuleNotFoundError mid-run).
  name="${1:?name}"
  snap="/tmp/bg-tree-$name"
  rm -rf "$snap" && mkdir -p "$snap" /tmp/bg-out
  tar -C "$REPO" --exclude=./.whl --exclude=./.wheelhouse --exclude=./.venv --exclude=./.tools \
    -cf - . | tar -C "$snap" -xf -
  OUT=/tmp/bg-out setsid nohup bash "$snap/bench/gpu/h200.sh" packed "$@" >"/tmp/bg-$name.log" 2>&1 &
  echo $! >"/tmp/bg-$name.pid"
  echo "$name in the background (/tmp/bg-$name.log)"
  ;;
collect)
  # Waits at most LIMIT_S (default 500, under a call's 600 s); a step still running then
  # returns what it has written so far as NAME-partial.tgz (with its log) and keeps running,
  # so a later `collect` gets the rest: a call that times out returns nothing.
  name="${1:?name}" limit="${2:-500}"
  deadline=$((SECONDS + limit))
  while kill -0 "$(cat "/tmp/bg-$name.pid")" 2>/dev/null && ((SECONDS < deadline)); do sleep 2; done
  cat "/tmp/bg-$name.log"
  if kill -0 "$(cat "/tmp/bg-$name.pid")" 2>/dev/null; then
    cp "/tmp/bg-$name.log" "/tmp/packed-$name/bg.log"
    tar -czf "$OUT/$name-partial.tgz" -C "/tmp/packed-$name" .
    echo "$name still running after ${limit} s: $OUT/$name-partial.tgz holds its files so far"
  else
    cp "/tmp/bg-out/$name.tgz" "$OUT/"
  fi
  ;;
config)
  # One server configuration in one device call (~8 min: cold start ~3.7, TTFT gap + sweep ~3,
  # profile ~1.3), every file of it packed into $OUT/NAME.tgz (the device returns 8 files a call)
  bash "$REPO/bench/gpu/h200.sh" packed "${1:?name}" config-steps "$@"
  ;;
config-steps)
  # config's steps, unpacked: serve, wait, measure, profile at $PROFILE_RATE (unset: none), stop
  name="${1:?name}" port="${2:?port}" rates="${3:?rates}" duration="${4:?duration}"
  shift 4
  self="$REPO/bench/gpu/h200.sh"
  bash "$self" serve "$name" "$port" "$@"
  if bash "$self" wait "$port"; then
    bash "$self" measure "$name" "$port" "$rates" "$duration" || echo "measure: exit $?"
    if [[ -n "${PROFILE_RATE:-}" ]]; then
      bash "$self" profile "$name$PROFILE_RATE" "$port" "${WORKLOADS:-video}" "$PROFILE_RATE" 20 ||
        echo "profile: exit $?"
    fi
  fi
  finish_server "$name" "$port"
  # How large the host's compile caches grew (vLLM's, inductor's, Triton's): whether carrying
  # them to the next sitting could fit (64 MiB a call) and spare its cold start (~200-290 s).
  du -sh "$HOME/.cache/vllm" "/tmp/torchinductor_$(whoami)" "$HOME/.triton/cache" 2>/dev/null |
    tee "$OUT/$name-cache-sizes.txt" || true
  ;;
save-caches)
  # paths relative to / so that `install` unpacks them where this host's processes look
  caches=()
  for d in "$HOME/.cache/vllm" "/tmp/torchinductor_$(whoami)" "$HOME/.triton/cache"; do
    [[ -d "$d" ]] && caches+=("${d#/}")
  done
  if ((${#caches[@]} == 0)); then
    echo "save-caches: no compile cache on this host yet (run a server first)" >&2
    exit 1
  fi
  tar -czf "$OUT/compile-caches.tgz" -C / "${caches[@]}"
  ls -la "$OUT/compile-caches.tgz"
  ;;
chart-args)
  echo "$CHART_ARGS"
  ;;
pair)
  bash "$REPO/bench/gpu/h200.sh" packed "${1:?name}" pair-steps "$@"
  ;;
pair-steps)
  # pair's steps, unpacked (measure takes WORKLOADS, SEARCH_MAX etc. from the environment)
  rates="${2:?rates}" duration="${3:?duration}"
  shift 3
  first=()
  while (($#)) && [[ "$1" != -- ]]; do
    first+=("$1")
    shift
  done
  if (($# < 3 || ${#first[@]} < 2)); then
    echo "pair: NAME RATES DURATION A PORT_A [ENV=VAL ...] -- B PORT_B [ENV=VAL ...]" >&2
    exit 2
  fi
  shift # the --
  second=("$@")
  names=("${first[0]}" "${second[0]}") ports=("${first[1]}" "${second[1]}")
  self="$REPO/bench/gpu/h200.sh"
  bash "$self" serve "${first[@]}"
  bash "$self" serve "${second[@]}"
  if bash "$self" wait "${ports[@]}"; then
    # Both servers' single requests and bursts first, then both sweeps: in the thirty-third
    # sitting the server probed after the other's sweep had the higher gap in both orders
    # (29 against 35-37 ms), whichever profile it ran.
    for i in 0 1; do
      bash "$self" probe "${names[i]}" "${ports[i]}" || echo "probe ${names[i]}: exit $?"
    done
    for i in 0 1; do
      bash "$self" sweep "${names[i]}" "${ports[i]}" "$rates" "$duration" ||
        echo "sweep ${names[i]}: exit $?"
    done
  fi
  for i in 0 1; do finish_server "${names[i]}" "${ports[i]}"; done
  ;;
*)
  echo "unknown step $cmd" >&2
  exit 2
  ;;
esac
