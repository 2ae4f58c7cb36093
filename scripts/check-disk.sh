#!/usr/bin/env bash
# Fail early and clearly when the disk cannot hold the environment, instead of pip's
# "[Errno 28] No space left on device" half-way through a multi-GB install.
# Usage: scripts/check-disk.sh NEED_GB [DIR]
set -euo pipefail
need_gb=${1:?usage: check-disk.sh NEED_GB [DIR]}
dir=${2:-.}
tmp=${TMPDIR:-/tmp}
for d in "$dir" "$tmp"; do
  free_kb=$(df -Pk "$d" | awk 'NR == 2 {print $4}')
  free_gb=$((free_kb / 1024 / 1024))
  # pip downloads into TMPDIR and installs into the venv; both must fit when they share a disk.
  if ((free_gb < need_gb)); then
    echo "error: $(realpath "$d") has ${free_gb} GiB free; the CPU environment needs about ${need_gb} GiB" >&2
    echo "       (free some space or set TMPDIR to a larger disk; make NEED_GB=0 ... skips this check)" >&2
    exit 1
  fi
done
