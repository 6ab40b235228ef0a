# Developer and CI entry points. Every target is idempotent: a second `make setup`
# changes nothing and returns in seconds.
#
#   make setup    .venv with svledger and its test tools, the Kafka broker jars, and
#                 Debian's chromium (the timeline page's screenshot test), curl and jq
#                 (commands in docs/, which tests/integration/test_docs.py runs) and
#                 openssl (the secured test broker's certificates)
#   make kube     setup, plus etcd, kube-apiserver, kube-controller-manager and kubectl of both
#                 releases the tests use, built from the Go module proxy (cached)
#   make test     setup and kube, then ruff, mypy and the whole pytest suite (real Kafka,
#                 PostgreSQL and Kubernetes)
#   make quick    setup, then ruff, mypy and the tests neither slow nor on real Kubernetes
#   make demo     setup, then the demo against a real local broker
#   make demo-real  setup and kube, then a real rolling upgrade of three kube-apiservers
#   make broker   a local Kafka broker in the foreground; prints its bootstrap address

PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: setup kube test quick demo demo-real broker

KUBE_VERSIONS := v1.37.2 v1.36.3

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
	@$(PY) deploy/kube/build.py fetch $(addprefix --kubernetes ,$(KUBE_VERSIONS)) >/dev/null

test: setup kube
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(PY) -m pytest

quick: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(PY) -m pytest -m "not slow and not kubernetes"

demo: setup
	bash deploy/demo.sh

demo-real: setup kube
	$(PY) -m deploy.kube.rolling_upgrade

broker: setup
	@$(PY) deploy/kafka/broker.py run
