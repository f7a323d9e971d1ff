# kvbook: two commands do everything on a fresh machine with Python 3.10-3.12 and make.
#   make book   - create .venv if missing, install the pins, execute every notebook, build _build/html
#   make test   - install the same way, then run every test (unit + hygiene, nbval, book build)
# Other targets: make lab (open the notebooks in JupyterLab), make bench, make clean.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.kvbook-installed
# Notebooks listed in _toc.yml, in book order.
NOTEBOOKS = $$($(PY) -m tests.toc)
BUILD_FLAGS = -W -n --keep-going

.PHONY: book test unit nbval build-check lab bench execute clean

$(STAMP): requirements.txt pyproject.toml
	@$(PYTHON) -c 'import sys; v = sys.version_info[:2]; sys.exit(0 if (3, 10) <= v <= (3, 12) else "kvbook needs Python 3.10-3.12, but $(PYTHON) is %d.%d (set PYTHON=python3.11)" % v)'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -e .
	@touch $(STAMP)

book: $(STAMP)
	$(VENV)/bin/jupyter-book build . $(BUILD_FLAGS)
	@echo "The book is at $(CURDIR)/_build/html/index.html"

test: unit nbval build-check

unit: $(STAMP)
	$(PY) -m pytest tests -q --ignore=tests/browser

nbval: $(STAMP)
	$(PY) -m pytest -q --nbval --nbval-current-env \
	  --nbval-sanitize-with tests/nbval_sanitize.cfg $(NOTEBOOKS)

build-check: $(STAMP)
	$(VENV)/bin/jupyter-book build . $(BUILD_FLAGS)

lab: $(STAMP)
	$(VENV)/bin/jupyter lab book/

bench: $(STAMP)
	$(PY) -m kvlib bench

# Re-execute notebooks in place after changing them or kvlib (they are committed executed):
#   make execute NB="book/01_no_cache.ipynb"     (default: every notebook in _toc.yml)
execute: $(STAMP)
	$(PY) -m tests.nbtools execute $(or $(NB),$(NOTEBOOKS))

clean:
	rm -rf _build
