# tailroute — the two commands a newcomer needs are `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: venv demo test proto check-proto lint typecheck bench simulate clean

# Shared install step: creates or refreshes the virtualenv when pyproject.toml changes.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(PY) -m sidecar.cli demo

test: $(STAMP)
	$(PY) -m pytest -q

proto: $(STAMP)
	$(PY) tools/gen_proto.py

check-proto: $(STAMP)
	$(PY) tools/gen_proto.py --check

lint: $(STAMP)
	$(VENV)/bin/ruff check sidecar tests tools bench
	$(VENV)/bin/mypy

typecheck: lint

bench: $(STAMP)
	$(PY) -m sidecar.cli bench overhead

simulate: $(STAMP)
	$(PY) -m sidecar.cli simulate --suite sidecar/sim/scenarios

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info
