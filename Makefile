# tailroute — the two commands a newcomer needs are `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
PREFIX ?= $(HOME)/.local
BINDIR ?= $(PREFIX)/bin

.DEFAULT_GOAL := venv
.PHONY: venv demo test test-tools pytest proto check-proto lint typecheck install uninstall bench \
        simulate clean compiled

# Shared install step: creates or refreshes the virtualenv when pyproject.toml changes.
$(STAMP): pyproject.toml
	@echo "installing tailroute and its dev extras into $(VENV) (first time: about 2 minutes)"
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PY) -m pip install --quiet --quiet --disable-pip-version-check --upgrade pip
	@$(PY) -m pip install --quiet --quiet --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	@$(PY) -m sidecar.cli demo

# The whole gate: lint and types, generated code up to date, then every test.
test: test-tools lint check-proto pytest

# Debian packages some tests need (chromium, promtool): installed when missing and
# root may; otherwise named, and those tests skip saying so.
test-tools:
	@bash .ci/install-test-tools

pytest: $(STAMP)
	$(PY) -m pytest -q

proto: $(STAMP)
	$(PY) tools/gen_proto.py

check-proto: $(STAMP)
	$(PY) tools/gen_proto.py --check

lint: $(STAMP)
	$(VENV)/bin/ruff check --quiet sidecar tests tools bench
	$(VENV)/bin/mypy

typecheck: lint

# The policy lab compiled with mypyc into build/compiled/ (about two minutes; the same
# results, about twice as fast). `tailroute simulate --compiled` builds it on first use.
compiled: $(STAMP)
	$(PY) -c "from sidecar.devtools.compiled import ensure; print(ensure())"

# Puts `tailroute` on PATH: a small wrapper in $(BINDIR) that runs this checkout's venv.
install: $(STAMP)
	@mkdir -p $(BINDIR)
	@printf '#!/bin/sh\nexec "%s/$(VENV)/bin/tailroute" "$$@"\n' "$(CURDIR)" > $(BINDIR)/tailroute
	@chmod +x $(BINDIR)/tailroute
	@echo "installed $(BINDIR)/tailroute (runs $(CURDIR)/$(VENV)/bin/tailroute)"
	@case ":$$PATH:" in *":$(BINDIR):"*) ;; \
	  *) echo "note: $(BINDIR) is not on your PATH; add: export PATH=\"$(BINDIR):\$$PATH\"";; esac

uninstall:
	rm -f $(BINDIR)/tailroute

bench: $(STAMP)
	$(PY) -m sidecar.cli bench overhead

simulate: $(STAMP)
	$(PY) -m sidecar.cli simulate --suite sidecar/sim/scenarios

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache build *.egg-info
