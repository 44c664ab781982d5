# llmgw: `make demo` runs a one-machine cluster, `make test` runs the whole suite.
# Both set up everything they need (Debian packages, the virtual environment) each run,
# idempotently, so they work on a fresh clone of a fresh machine.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# postgresql-15: the store tests start their own server from its binaries (initdb,
# pg_ctl, pg_basebackup), on a port of their own: a cluster Debian may start on 5432 is
# neither used nor in the way.
# etcd-server, patroni (etcd 3.4, Patroni 3.0; etcd-client for etcdctl): the HA tests
# run their own etcd and Patroni members on free ports (tests/support/patroni.py). The
# etcd service the package enables is stopped and disabled when `apt` installs it.
# keepalived, nftables: tests/e2e/test_vip.py runs keepalived in two network namespaces
# (the package's service starts only once /etc/keepalived/keepalived.conf exists).
# prometheus: promtool checks /metrics and the shipped rules; a test runs the server
# itself on a port of its own (the package's service is stopped and disabled).
# chromium: Playwright (the test extra) drives Debian's chromium for the admin pages'
# tests (tests/support/browser.py); no `playwright install` browser download.
# LDAP sign-in's tests run OpenLDAP's slapd on a port of their own (tests/support/slapd.py);
# ldap-utils (ldapsearch) to look at its directory by hand when one fails.
LDAP_PACKAGES := slapd ldap-utils
APT_PACKAGES := openssh-server openssh-client procps iproute2 cmake ninja-build g++ wrk tmux \
	postgresql-15 etcd-server etcd-client patroni keepalived nftables prometheus chromium \
	$(LDAP_PACKAGES)
# nodejs, npm: the OIDC sign-in tests run the npm package oidc-provider, a real identity
# provider (tests/support/oidcprovider.py installs it into ~/.cache/llmgw/npm). A nodejs
# from NodeSource carries its own npm and conflicts with Debian's: npm is installed only
# where no `npm` command is found.
APT_PACKAGES += nodejs npm
# Slurm beside llmgw: the tests start munged, slurmctld and slurmd on loopback
# (tests/e2e/test_slurm.py, tests/agent/test_slurmnode.py); the packages' own services
# are stopped and disabled where systemd runs, since the tests start their own.
SLURM_PACKAGES := slurmd slurmctld slurm-client munge
APT_PACKAGES += $(SLURM_PACKAGES)
# What building llama-server from source needs: the tests always, the demo only when the
# llama.cpp release it names cannot be fetched.
BUILD_PACKAGES := cmake ninja-build g++
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: all demo test check apt apt-build venv runtime zipapp release bench clean llama-server

all: test

# Every Debian package the tests use (APT_PACKAGES), or those named: make apt PACKAGES=...
PACKAGES ?= $(APT_PACKAGES)

apt-build:
	@$(MAKE) -s apt PACKAGES="$(BUILD_PACKAGES)"

apt:
	@missing=""; for p in $(PACKAGES); do \
	  if [ "$$p" = npm ] && command -v npm >/dev/null; then continue; fi; \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing >/dev/null || exit 1; \
	  case " $$missing " in *" etcd-server "*) [ ! -d /run/systemd/system ] || \
	    $(SUDO) systemctl disable --now etcd.service >/dev/null 2>&1 || true;; esac; \
	  case " $$missing " in *" prometheus "*) [ ! -d /run/systemd/system ] || \
	    $(SUDO) systemctl disable --now prometheus.service prometheus-node-exporter.service \
	    >/dev/null 2>&1 || true;; esac; \
	  case " $$missing " in *" slapd "*) [ ! -d /run/systemd/system ] || \
	    $(SUDO) systemctl disable --now slapd.service >/dev/null 2>&1 || true;; esac; \
	  case " $$missing " in *" slurmd "*) [ ! -d /run/systemd/system ] || \
	    $(SUDO) systemctl disable --now slurmd.service slurmctld.service munge.service \
	    >/dev/null 2>&1 || true;; esac; \
	fi

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# Reinstalled when pyproject.toml changes: llmgw and what it runs on (the demo's), and
# with the test extra (checks, tests, benchmarks).
$(VENV)/.runtime: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[test]'
	touch $(VENV)/.runtime $@

runtime: $(VENV)/.runtime
venv: $(VENV)/.installed

# llama.cpp's server, built once from the llama-cpp-python sdist and cached outside the
# clone (~/.cache/llmgw/llama-server-VERSION); prints its path last.
llama-server: apt venv
	@packaging/build-llama-server.sh $(BIN)/pip

# The suite on TEST_WORKERS processes (pytest-xdist): most end-to-end tests wait on the
# processes they start, so more workers than cores pays; tests that share one resource
# run in one worker (tests/conftest.py, GROUPS). The 15 slowest are listed at the end.
# Tests that assert how long something takes (marked timing) run after, alone, so the
# others' load is not what they measure.
TEST_WORKERS ?= 4

test: apt venv llama-server
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=15 -m "not timing"
	$(BIN)/python -m pytest -q -m timing

check: venv
	$(BIN)/ruff check llmgw llmgw.py tests bench packaging
	$(BIN)/ruff format --check llmgw llmgw.py tests bench packaging
	$(BIN)/mypy

# build/ goes too: setuptools reuses build/lib, so a module deleted from the tree would
# still ship in the zipapp. Build isolation fetches the setuptools pyproject.toml asks for.
# ZIPAPP=PATH builds elsewhere (the tests build their own copy).
ZIPAPP ?= dist/llmgw.pyz
zipapp: venv
	rm -rf build $(ZIPAPP)
	mkdir -p $(dir $(ZIPAPP))
	$(BIN)/shiv --quiet --compressed -p '/usr/bin/env python3' -e llmgw.cli:entry \
	  -o $(ZIPAPP) .
	@echo $(ZIPAPP)

# A signed release in GitHub's layout under dist/releases (packaging/release.py says what
# it checks and writes): make release VERSION=0.2.0 SIGNING_KEY=/path/outside/key.pem
release: venv
	@[ -n "$(VERSION)" ] && [ -n "$(SIGNING_KEY)" ] || \
	  { echo "usage: make release VERSION=X.Y.Z SIGNING_KEY=/path/key.pem" >&2; exit 2; }
	$(BIN)/python packaging/release.py --version "$(VERSION)" --signing-key "$(SIGNING_KEY)"

# Only what the demo runs: llmgw in the venv, and llama.cpp's release (the agent fetches
# it); the compiler and cmake come only if the release cannot be reached and the demo
# builds llama-server instead.
demo: runtime
	$(BIN)/python packaging/demo.py \
	  --build-command "make -s -C $(CURDIR) apt-build >&2 && packaging/build-llama-server.sh $(BIN)/pip"

LITELLM_VENV := $(HOME)/.cache/llmgw/bench-litellm

bench: apt venv llama-server
	[ -x $(LITELLM_VENV)/bin/litellm ] || ($(PYTHON) -m venv $(LITELLM_VENV) && \
		$(LITELLM_VENV)/bin/pip install -q 'litellm[proxy]' py-spy)
	$(BIN)/python bench/agents.py
	$(BIN)/python bench/scheduler.py
	$(BIN)/python bench/gateway.py

clean:
	rm -rf $(VENV) dist build .demo .pytest_cache .mypy_cache .ruff_cache
