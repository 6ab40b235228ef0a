# Developer and CI entry points. Every target is idempotent: a second `make setup`
# changes nothing and returns in seconds.
#
#   make setup    .venv with svledger and its test tools, plus the Kafka broker jars
#   make test     setup, then ruff, mypy and the whole pytest suite (real Kafka + PostgreSQL)
#   make quick    setup, then ruff, mypy and the tests not marked slow (the inner loop)
#   make demo     setup, then the demo against a real local broker
#   make broker   a local Kafka broker in the foreground; prints its bootstrap address

PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: setup test quick demo broker

setup: $(VENV)/.installed
	@$(PY) deploy/kafka/broker.py fetch

# Reinstalled whenever pyproject.toml changes.
$(VENV)/.installed: pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install --quiet --disable-pip-version-check --no-input -e '.[test]'
	@touch $@

test: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(PY) -m pytest

quick: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy
	$(PY) -m pytest -m "not slow"

demo: setup
	bash deploy/demo.sh

broker: setup
	@$(PY) deploy/kafka/broker.py run
