#!/usr/bin/env bash
# Build the container images from the repository root with docker (BuildKit) or buildah.
#
#   images/build.sh [serving|loadtest|all]      (default: all; `make image` calls this)
#
# Environment:
#   IMAGE_REPO     registry/prefix for the tags (default: none -> gemma4-serving:TAG)
#   IMAGE_TAG      tag (default: the chart's appVersion)
#   VLLM_IMAGE     base of the serving image (default in images/Dockerfile; pin a digest:
#                  vllm/vllm-openai:v0.33.0@sha256:...)
#   PYTHON_IMAGE   base of the wheel stage and the load-test image
#   TORCH_INDEX_URL  index with CPU-only torch wheels for the load-test image (optional)
#   BUILDER        force docker or buildah
#   PUSH=1         push the tags after building
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

what="${1:-all}"
case "$what" in
  serving | loadtest | all) ;;
  *)
    echo "usage: images/build.sh [serving|loadtest|all]" >&2
    exit 2
    ;;
esac

app_version="$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/gemma4-serving/Chart.yaml)"
tag="${IMAGE_TAG:-$app_version}"
prefix="${IMAGE_REPO:+${IMAGE_REPO%/}/}"

builder="${BUILDER:-}"
if [[ -z "$builder" ]]; then
  if command -v docker >/dev/null 2>&1 && docker info >/dev/null 2>&1; then
    builder=docker
  elif command -v buildah >/dev/null 2>&1; then
    builder=buildah
  else
    echo "images/build.sh: no image builder found: install Docker (with a running daemon) or" \
      "buildah (apt-get install buildah), or set BUILDER" >&2
    exit 1
  fi
fi

build_args=()
for var in VLLM_IMAGE PYTHON_IMAGE TORCH_INDEX_URL; do
  if [[ -n "${!var:-}" ]]; then
    build_args+=(--build-arg "$var=${!var}")
  fi
done

build() { # build DOCKERFILE IMAGE
  local file="$1" image="$2"
  echo "images/build.sh: $builder: $file -> $image" >&2
  case "$builder" in
    docker) DOCKER_BUILDKIT=1 docker build -f "$file" "${build_args[@]}" -t "$image" . ;;
    buildah) buildah build --layers -f "$file" "${build_args[@]}" -t "$image" . ;;
    *)
      echo "images/build.sh: unknown BUILDER=$builder (docker or buildah)" >&2
      exit 2
      ;;
  esac
  if [[ "${PUSH:-0}" == 1 ]]; then
    "$builder" push "$image"
  fi
}

if [[ "$what" == serving || "$what" == all ]]; then
  build images/Dockerfile "${prefix}gemma4-serving:${tag}"
fi
if [[ "$what" == loadtest || "$what" == all ]]; then
  build images/Dockerfile.loadtest "${prefix}gemma4-loadtest:${tag}"
fi
