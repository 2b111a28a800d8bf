# trainhub: `make up` starts the platform, `make test` runs every test.
# Prerequisites: Python >= 3.11, Node.js >= 18 with npm, make. As root on Debian/Ubuntu, `make up` installs the
# missing system packages the platform needs (bubblewrap, util-linux, passwd) and `make test` those and the tests'
# (nodejs, npm, chromium) with apt.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
NODE_PREFIX := $(VENV)/node
PROXY  := $(NODE_PREFIX)/node_modules/.bin/configurable-http-proxy
# `trainhub up` finds the proxy on PATH or here (<venv>/node), no global install needed

UP_ARGS ?=
PYTEST_ARGS ?=

.PHONY: install test-deps platform-deps system-deps controlplane kube-node-images up test test-unit test-e2e test-kube-real test-kube-node lint-imports bench images clean

$(PY):
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "trainhub needs Python >= 3.11"'
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# the platform: virtualenv with trainhub installed (editable: code changes need no reinstall) and
# configurable-http-proxy. Installed again only when the package's metadata changes (stamp files), so
# `make up` starts at once the second time.
$(VENV)/.installed: pyproject.toml setup.py | $(PY)
	$(PIP) install -q -e .
	@touch $@

$(VENV)/.installed-test: pyproject.toml setup.py | $(PY)
	$(PIP) install -q -e ".[test]"
	@touch $@ $(VENV)/.installed

install: $(VENV)/.installed
	@if command -v configurable-http-proxy >/dev/null 2>&1; then \
	    echo "configurable-http-proxy: $$(command -v configurable-http-proxy)"; \
	elif [ ! -x $(PROXY) ]; then \
	    command -v npm >/dev/null 2>&1 || { echo "npm is missing: install Node.js >= 18 and npm (Debian: apt-get install nodejs npm)"; exit 1; }; \
	    npm install --no-audit --no-fund --prefix $(NODE_PREFIX) configurable-http-proxy@^5; \
	fi

# system packages the platform needs to keep users apart (docs/isolation.md): bubblewrap, the per-user sandbox; as
# root also util-linux (setpriv, nsenter) and passwd (useradd) for the per-user accounts. As root with apt they are
# installed; otherwise this says what is missing (as root without bubblewrap `trainhub up` refuses to serve several
# users unless c.Isolation.sandbox = "none" says accounts alone will do)
platform-deps:
	@missing=""; \
	command -v bwrap >/dev/null 2>&1 || missing="$$missing bubblewrap"; \
	if [ "$$(id -u)" = 0 ]; then \
	    { command -v setpriv && command -v nsenter; } >/dev/null 2>&1 || missing="$$missing util-linux"; \
	    command -v useradd >/dev/null 2>&1 || [ -x /usr/sbin/useradd ] || missing="$$missing passwd"; \
	fi; \
	if [ -n "$$missing" ]; then \
	    if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	    else \
	        echo "note: missing system packages:$$missing: install them with the system's package manager. Without"; \
	        echo "      bubblewrap nothing sandboxes users (docs/isolation.md); as root \`trainhub up\` then refuses to serve"; \
	        echo "      several users unless the platform config says c.Isolation.sandbox = 'none' (accounts only)"; \
	    fi; \
	fi

# and the browser tests' (chromium through Playwright, Node.js for the proxy); root + apt only, otherwise say
# what is missing
system-deps: platform-deps
	@missing=""; \
	command -v node >/dev/null 2>&1 && node -e 'process.exit(parseInt(process.versions.node) >= 18 ? 0 : 1)' || missing="$$missing nodejs npm"; \
	command -v npm >/dev/null 2>&1 || missing="$$missing npm"; \
	[ -x /usr/bin/chromium ] || missing="$$missing chromium chromium-driver"; \
	if [ -n "$$missing" ]; then \
	    if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	    else \
	        echo "note: missing system packages:$$missing (browser tests are skipped without chromium)"; \
	    fi; \
	fi

test-deps: system-deps $(VENV)/.installed-test install

up: platform-deps install
	$(VENV)/bin/trainhub up $(UP_ARGS)

# the real Kubernetes pieces the tests run: kube-apiserver, controller-manager and scheduler v1.20.2 built from
# Debian's source package, and for the real node the kubelet, a device plugin of simulated GPUs and the pause binary
# (cold about 14 + 5 min, then cached in ~/.cache/trainhub/kube-1.20.2 by recipe) plus Debian's etcd, containerd,
# runc and CNI plugins; as root it installs the apt packages it needs.
# TRAINHUB_SKIP_CONTROLPLANE=1 skips it and the tests that need it (on purpose only).
controlplane:
	@if [ "$${TRAINHUB_SKIP_CONTROLPLANE:-}" = 1 ]; then \
	    echo "TRAINHUB_SKIP_CONTROLPLANE=1: the real control plane and its tests are skipped"; \
	else \
	    bash tests/kubernetes/controlplane/build.sh; \
	fi

# the real node's images (hub, notebook, trainhub, proxy) from debootstrap and the lists in helm/images/, no
# registry or container engine; layers cached in ~/.cache/trainhub/images by recipe (cold about 5 min, warm seconds)
kube-node-images: test-deps
	$(PY) tests/kubernetes/node/images.py build

# the Helm chart on a real one-node cluster (tests/kubernetes/node; root): the real control plane, kubelet, containerd,
# runc, the chart's default values. TRAINHUB_SKIP_KUBE_NODE=1 (or TRAINHUB_SKIP_CONTROLPLANE=1) skips it on purpose.
test-kube-node: test-deps controlplane
	@if [ "$${TRAINHUB_SKIP_KUBE_NODE:-}" = 1 ] || [ "$${TRAINHUB_SKIP_CONTROLPLANE:-}" = 1 ]; then \
	    echo "TRAINHUB_SKIP_KUBE_NODE/TRAINHUB_SKIP_CONTROLPLANE: the real node's tests are skipped"; \
	elif [ "$$(id -u)" != 0 ]; then \
	    echo "the real node needs root (containerd, mounts, cgroups, a bridge): its tests are skipped (not run) here"; \
	else \
	    $(PY) tests/kubernetes/node/images.py build && \
	    $(PY) -m pytest -q tests/kubernetes/node --kube-node $(PYTEST_ARGS); \
	fi

# every test; then tests/kubernetes again against the real control plane (--kube=real; the tests
# marked controlplane use it in the first run already); then the chart on a real node (test-kube-node)
test: test-deps controlplane
	$(PY) -m pytest -q $(PYTEST_ARGS)
	@if [ "$${TRAINHUB_SKIP_CONTROLPLANE:-}" != 1 ]; then \
	    echo "== tests/kubernetes against the real v1.20 control plane"; \
	    $(PY) -m pytest -q tests/kubernetes --kube=real -m "not controlplane" $(PYTEST_ARGS); \
	fi
	@echo "== the Helm chart on a real node"
	@$(MAKE) --no-print-directory test-kube-node

test-kube-real: test-deps controlplane
	$(PY) -m pytest -q tests/kubernetes --kube=real $(PYTEST_ARGS)

# tiers are markers (tests/README.md): unit, e2e (a real `trainhub up`), browser (chromium), kube
test-unit: test-deps
	$(PY) -m pytest -q -m unit $(PYTEST_ARGS)

test-e2e: test-deps
	$(PY) -m pytest -q -m "e2e or browser" $(PYTEST_ARGS)

# the import contracts of docs/architecture.md (also run by `make test`: tests/architecture/test_import_layers.py)
lint-imports: test-deps
	$(PY) tests/architecture/test_import_layers.py

# the benchmarks also need the loaders they compare with (the `bench` extra)
bench: test-deps
	$(PIP) install -q -e ".[test,bench]"
	@set -e; for b in benchmarks/*_bench.py; do echo "== $$b"; $(PY) $$b; done

clean:
	rm -rf test-artifacts .pytest_cache

# the hub, notebook and services/job images the Helm chart points at (helm/images/*/Dockerfile), tagged with
# the chart's appVersion; needs podman or docker and registry access (neither exists on the test machines)
IMAGE_TOOL ?= podman
IMAGE_TAG  ?= $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}/\1/p' helm/trainhub/Chart.yaml)
images:
	$(IMAGE_TOOL) build -f helm/images/trainhub/Dockerfile -t ghcr.io/trainhub/trainhub:$(IMAGE_TAG) .
	$(IMAGE_TOOL) build -f helm/images/hub/Dockerfile -t ghcr.io/trainhub/trainhub-hub:$(IMAGE_TAG) .
	$(IMAGE_TOOL) build -f helm/images/notebook/Dockerfile -t ghcr.io/trainhub/trainhub-notebook:$(IMAGE_TAG) .
