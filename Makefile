# Two commands on a fresh machine with Python 3.11+:
#   make run   set up .venv (once, again only when the dependencies change) and start the app
#              at http://localhost:8501; make run PORT=8502 serves it on another port
#   make test  the same setup plus the dev tools (pytest, pytest-xdist, ruff, playwright,
#              import-linter), then the whole test suite
#   make test-fast  the inner loop: the same, without the tests marked slow (real training
#              or processes) or browser (chromium)
# Both run one pytest-xdist worker per core; docs/development.md has their counts and times
# (scripts/test_report.py measures them).
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

# One pytest-xdist worker per core. A test file stays on one worker, so its module-scoped
# fixtures (most train a run) are built once; files go out in collection order, which
# tests/conftest.py starts with the slow files. scripts/test_report.py reads these two lines.
XDIST := -n auto --dist loadfile --no-loadscope-reorder
FAST := -m "not slow and not browser"

test: $(DEV)
	$(PY) -m pytest $(XDIST)

test-fast: $(DEV)
	$(PY) -m pytest $(XDIST) $(FAST)

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
