# Two commands on a fresh machine with Python 3.11+:
#   make run   set up .venv (once, again only when the dependencies change) and start the app
#              at http://localhost:8501; make run PORT=8502 serves it on another port
#   make test  the same setup plus the dev tools (pytest, ruff, playwright, import-linter),
#              then the whole test suite
#   make test-fast  the inner loop: the same, without the tests marked slow (real training
#              or processes) or browser (chromium), in two pytest processes, one per core:
#              the page and dashboard tests beside the rest (about 1.5 min on 2 cores)
# The package is installed editable with its runtime dependencies from pyproject.toml;
# requirements.txt pins torch to the build this project is tested with.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet --disable-pip-version-check
RUNTIME := $(VENV)/.runtime-installed
DEV := $(VENV)/.dev-installed
# The app's port (its address stays .streamlit/config.toml's localhost).
PORT ?= 8501

.PHONY: run test test-fast lint format clean

$(PY):
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "blockviz needs Python 3.11 or newer; set PYTHON=python3.11 (or newer) and retry")'
	$(PYTHON) -m venv $(VENV)

$(RUNTIME): requirements.txt pyproject.toml | $(PY)
	$(PIP) -r requirements.txt -e .
	@touch $@

$(DEV): requirements.txt pyproject.toml | $(PY)
	$(PIP) -r requirements.txt -e '.[dev]'
	@touch $(RUNTIME) $@

run: $(RUNTIME)
	@$(PY) -m blockviz.dashboard.port $(PORT)
	$(PY) -m streamlit run app.py --server.port $(PORT)

test: $(DEV)
	$(PY) -m pytest

FAST := -m "not slow and not browser" -p no:cacheprovider
FAST_LOG := .test-fast-pages.log

test-fast: $(DEV)
	@$(PY) -m pytest $(FAST) -q tests/pages tests/dashboard > $(FAST_LOG) 2>&1 & pages=$$!; \
	$(PY) -m pytest $(FAST) tests --ignore=tests/pages --ignore=tests/dashboard; rest=$$?; \
	wait $$pages; pages_rc=$$?; \
	echo "--- tests/pages and tests/dashboard (the other process):"; cat $(FAST_LOG); \
	rm -f $(FAST_LOG); test $$rest -eq 0 && test $$pages_rc -eq 0

lint: $(DEV)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

format: $(DEV)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

.PHONY: docs
docs: $(DEV) ; $(PY) -m blockviz.cli.docs

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info
