#!/usr/bin/env bash
# Leave the committed benchmark results out of what travels to the device machine, and put them
# back. Every device call carries the working tree (tracked and untracked-not-ignored files) plus
# one wheelhouse part within 64 MiB; bench/results/ is most of the tree (~27 MiB by the twelfth
# sitting, which left parts of 34 MiB: 26 calls to stage vLLM 0.20.0; slimmed: 15 of 60 MiB).
#
#   bench/gpu/slim-tree.sh on     # untrack bench/results/ in the index and ignore it (files stay)
#   bench/gpu/parts.sh .wheelhouse/vllm-0.20.0    # parts sized to the slim tree
#   ... the sitting ...
#   bench/gpu/slim-tree.sh off    # track it again (index entries back from HEAD), before any commit
#
# While "on", `git status` shows bench/results/ as deleted in the index: commit nothing then.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
EXCLUDE="$(git rev-parse --git-path info/exclude)"
LINE="/bench/results/"
case "${1:-}" in
on)
  if ! git diff --cached --quiet; then
    echo "slim-tree: the index has staged changes; commit or unstage them first" >&2
    exit 1
  fi
  git rm -r -q --cached bench/results
  grep -qxF "$LINE" "$EXCLUDE" 2>/dev/null || echo "$LINE" >>"$EXCLUDE"
  echo "slim-tree on: $(git ls-files -co --exclude-standard -z | xargs -0 du -cb | tail -n1 | cut -f1) bytes travel"
  ;;
off)
  git reset -q HEAD -- bench/results
  if [[ -f "$EXCLUDE" ]]; then
    grep -vxF "$LINE" "$EXCLUDE" >"$EXCLUDE.tmp" || true
    mv "$EXCLUDE.tmp" "$EXCLUDE"
  fi
  echo "slim-tree off: $(git ls-files bench/results | wc -l) result files tracked again"
  ;;
*)
  echo "usage: slim-tree.sh on|off" >&2
  exit 2
  ;;
esac
