# Developer and CI entry points. Every target is idempotent: a second `make setup`
# changes nothing and returns in seconds.
#
#   make setup    .venv with svledger and its test tools, the Kafka broker jars, and
#                 Debian's chromium (the timeline page's screenshot test), curl and jq
#                 (commands in docs/, which tests/integration/test_docs.py runs) and
#                 openssl (the secured test broker's certificates)
#   make kube     setup, plus etcd, kube-apiserver, kube-controller-manager and kubectl of
#                 v1.37.2 and etcd and kube-apiserver of v1.36.3 (the rolling upgrade's old
#                 release), built from the Go module proxy (cached)
#   make test     setup and kube, then ruff, mypy and the whole pytest suite (real Kafka,
#                 PostgreSQL and Kubernetes)
#   make quick    setup, then ruff, mypy and the unit tests (pure, no I/O; under 3 minutes)
#   make demo     setup, then the demo against a real local broker
#   make demo-real  setup and kube, then a real rolling upgrade of three kube-apiservers
#   make broker   a local Kafka broker in the foreground; prints its bootstrap address

PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: setup kube test quick demo demo-real broker

setup: $(VENV)/.installed
	@$(PY) deploy/kafka/broker.py fetch
	@missing=$$(for tool in chromium curl jq openssl; do command -v $$tool >/dev/null || echo $$tool; done); \
	  [ -z "$$missing" ] || { echo "installing" $$missing "(Debian packages) ..." >&2; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ca-certificates $$missing >/dev/null; }

# Reinstalled whenever pyproject.toml changes.
$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install --quiet --disable-pip-version-check --no-input -e '.[test]'
	@touch $@

kube: setup
	@$(PY) deploy/kube/build.py fetch --kubernetes v1.37.2 >/dev/null
	@$(PY) deploy/kube/build.py fetch --kubernetes v1.36.3 --binary kube-apiserver --binary etcd >/dev/null

# The suite runs in $(TEST_WORKERS) workers (pytest-xdist): most tests wait on a broker, a
# database or an apiserver, so three keep two cores busy (four were no faster). Modules are dealt whole, the
# longest first (tests/conftest.py), and the slowest tests are listed at the end.
TEST_WORKERS ?= 3
PYTEST_PARALLEL := -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=40

test: setup kube
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(PY) -m pytest $(PYTEST_PARALLEL)

quick: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(PY) -m pytest tests/unit

demo: setup
	bash deploy/demo.sh

demo-real: setup kube
	$(PY) -m deploy.kube.rolling_upgrade

broker: setup
	@$(PY) deploy/kafka/broker.py run
