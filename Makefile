# kvbook: two commands do everything on a fresh machine with Python 3.10-3.12 and make.
#   make book   - create .venv if missing, install the pins, execute every notebook, build _build/html
#                 (English) and _build/html/ja (the Japanese edition, from the same executed notebooks)
#   make test   - install the same way, then run every test (unit + hygiene, nbval, book build, browser)
# The HTML serves its own MathJax and widget scripts: `make assets` (run by book/test) fetches the
# npm packages pinned in package-lock.json into node_modules/ (with Python; no node needed).
# Other targets: make lint (ruff, also the first step of make test), make unit-fast (the unit tests
# without the slow ones, under a minute), make robust (the notebooks under adverse conditions),
# make lab (open the notebooks in JupyterLab), make bench, make clean, make triton-interpreted
# (the GPU's Triton kernel checked in Triton's CPU interpreter), make translations (update
# the Japanese catalogues after an English change), make book-ja (the Japanese edition alone).

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.kvbook-installed
ASSETS := node_modules/.kvbook-installed
# Notebooks listed in _toc.yml, in book order.
NOTEBOOKS = $$($(PY) -m tests.toc)
BUILD_FLAGS = -W -n --keep-going

.PHONY: book test lint unit unit-fast nbval build-check pages browser assets lab bench execute clean robust fuzz weights \
	book-ja translations triton-interpreted

$(STAMP): requirements.txt pyproject.toml
	@$(PYTHON) -c 'import sys; v = sys.version_info[:2]; sys.exit(0 if (3, 10) <= v <= (3, 12) else "kvbook needs Python 3.10-3.12, but $(PYTHON) is %d.%d (set PYTHON=python3.11)" % v)'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -e .
	@touch $(STAMP)

# Downloads the three npm tarballs that package-lock.json pins and checks their sha512 hashes
# (no node or npm needed; `npm ci` gives the same node_modules/ for those who have it).
$(ASSETS): package.json package-lock.json $(STAMP)
	$(PY) -m kvbook_sphinx.assets
	@touch $(ASSETS)

assets: $(ASSETS)

book: $(STAMP) $(ASSETS)
	$(VENV)/bin/jupyter-book build . $(BUILD_FLAGS)
	@$(MAKE) --no-print-directory book-ja
	@echo "The book is at $(CURDIR)/_build/html/index.html (日本語版: $(CURDIR)/_build/html/ja/index.html)"

# lint runs first (seconds) so that a formatting slip fails before the long steps. Then nbval and
# the pages run at once (make -j2): the build renders the committed outputs, so it need not wait for
# nbval, and the browser tests read the HTML it writes. Beside nbval's two lanes this is a third busy
# process on two cores, the load that `make robust` proves the notebooks' claims against (a busy loop
# beside both lanes); it saves about three minutes of the fifteen that make test may take.
test: lint unit
	@$(MAKE) --no-print-directory -j2 nbval pages

pages: build-check
	@$(MAKE) --no-print-directory browser

# ruff (pinned in requirements.txt; its settings are in pyproject.toml): the code is formatted, and
# passes the linter, in kvlib/, tests/ and kvbook_sphinx/.
LINTED = kvlib tests kvbook_sphinx
lint: $(STAMP)
	$(VENV)/bin/ruff format --check $(LINTED)
	$(VENV)/bin/ruff check $(LINTED)

# (tests/test_pipeline.py builds small books, which load kvbook_sphinx and so need the assets too)
# The unit tests time nothing, so they run on UNIT_WORKERS processes (pytest-xdist; 0 for one).
UNIT_WORKERS ?= 2
unit: $(STAMP) $(ASSETS)
	$(PY) -m pytest tests -q --ignore=tests/browser -n $(UNIT_WORKERS)

# The unit tests without the seconds-long ones (marked slow: book builds, nbval runs, benches,
# calibration): under a minute, for the edit-test loop.
unit-fast: $(STAMP) $(ASSETS)
	$(PY) -m pytest tests -q --ignore=tests/browser -m "not slow" -n $(UNIT_WORKERS)

# The property tests of tests/fuzz/ with thousands of hostile inputs per test (about a minute on
# 2 cores); make unit runs the same tests with a few cases each.
fuzz: $(STAMP)
	HYPOTHESIS_PROFILE=fuzz $(PY) -m pytest tests/fuzz -q -n $(UNIT_WORKERS)

# Strict nbval over every notebook of _toc.yml, in two lanes at once (tests/nbval_lanes.py says
# which notebooks share the machine with which, and why the claims hold so).
nbval: $(STAMP)
	$(PY) -m tests.nbval_lanes

# nbval (just before) has executed every notebook afresh and compared its checked outputs with the
# committed ones, so this build renders the committed outputs instead of executing them again
# (kvbook_sphinx reads KVBOOK_NB_EXECUTION); `make book` executes them. -W still fails on a warning.
build-check: $(STAMP) $(ASSETS)
	KVBOOK_NB_EXECUTION=off $(VENV)/bin/jupyter-book build . $(BUILD_FLAGS)
	@$(MAKE) --no-print-directory book-ja

# The Japanese edition (日本語版), the Sphinx way (kvbook_sphinx/i18n.py): the gettext builder
# extracts every page's messages into _build/i18n/_build/gettext/<page>.pot (one catalogue per
# page), sphinx-intl (pinned) merges them into locales/ja/LC_MESSAGES/<page>.po, and translators
# fill in their msgstr lines. Run `make translations` after changing the English text: it updates
# the catalogues and prints, per catalogue, the messages still untranslated or fuzzy.
# PAGES="book/04_serving book/glossary" updates only those pages' catalogues (translators working on
# different pages at once; give each its own I18N_OUT too).
I18N_OUT ?= _build/i18n
POT_DIR = $(I18N_OUT)/_build/gettext
PAGES ?=
translations: $(STAMP)
	rm -rf $(POT_DIR)
	KVBOOK_NB_EXECUTION=off $(VENV)/bin/jupyter-book build . --builder custom --custom-builder gettext \
	  --path-output $(I18N_OUT) $(BUILD_FLAGS)
	$(PY) -m kvbook_sphinx.i18n pot $(POT_DIR)
	$(if $(strip $(PAGES)),$(PY) -m kvbook_sphinx.i18n only $(POT_DIR) $(PAGES))
	$(VENV)/bin/sphinx-intl update --pot-dir $(POT_DIR) --locale-dir locales --language ja --no-obsolete
	@$(PY) -m kvbook_sphinx.i18n status ja

# The Japanese edition at _build/html/ja/ (book and build-check run it after the English build).
# Its configuration is _config.yml with language: ja (written under _build/, Sphinx must know the
# language before it starts); it executes no notebook but renders each one as the English build
# has just left it in _build/jupyter_execute/ (executed by make book, as committed in make test).
JA_BUILD := _build/ja
book-ja: $(STAMP) $(ASSETS)
	$(PY) -m kvbook_sphinx.i18n config ja $(JA_BUILD)/_config.yml
	KVBOOK_NB_EXECUTION=off KVBOOK_NB_OUTPUTS=$(CURDIR)/_build/jupyter_execute \
	  $(VENV)/bin/jupyter-book build . --config $(JA_BUILD)/_config.yml --toc $(JA_BUILD)/_toc.yml \
	  --path-output $(JA_BUILD) $(BUILD_FLAGS)
	rm -rf _build/html/ja
	cp -R $(JA_BUILD)/_build/html _build/html/ja

# The notebooks' claims must hold on any machine, so `make robust` runs strict nbval three more
# times: as if the last-level cache were 512 MiB (every size chosen from it grows: DRAM buffers
# of 2 GiB), with torch on one thread, and while a busy loop burns one core. Not part of
# `make test` (about 24 minutes); run it before changing a measurement or its assertion.
ROBUST_LLC ?= 512MiB
UNDER_LOAD ?= tests/under_load.sh
robust: $(STAMP)
	@echo "robust 1/3: KVBOOK_LLC_BYTES=$(ROBUST_LLC)"
	KVBOOK_LLC_BYTES=$(ROBUST_LLC) $(MAKE) --no-print-directory nbval
	@echo "robust 2/3: torch on one thread (OMP_NUM_THREADS=1)"
	OMP_NUM_THREADS=1 $(MAKE) --no-print-directory nbval
	@echo "robust 3/3: under load (a busy loop on one core)"
	$(UNDER_LOAD) $(MAKE) --no-print-directory nbval

# The Triton kernel (the GPU's) in Triton's interpreter, on the CPU: for machines without a GPU.
# Triton is not a pin (CPU PyTorch wheels lack it; CUDA ones bring their own), so this installs
# the version below into .triton-cpu/ and puts it on the path of this one test (about 2 minutes).
TRITON_CPU_PIN := triton==3.9.0
triton-interpreted: $(STAMP)
	@test -d .triton-cpu || $(PY) -m pip install --quiet --no-deps --target .triton-cpu $(TRITON_CPU_PIN)
	PYTHONPATH=$(CURDIR)/.triton-cpu $(PY) -m pytest -q -rs tests/kernels/test_triton_interpreted.py

# Every page of _build/html (or KVBOOK_HTML) in headless Chromium; KVBOOK_SKIP_BROWSER=1 skips.
browser: $(STAMP)
	$(PY) -m pytest tests/browser -q -rs

# JupyterLab on book/, where readers run the notebooks. jupyterlab-myst (pinned in requirements.txt)
# renders their markdown as MyST, as the book does: a :::{dropdown} (More hints, Worked solution) is
# folded until clicked, admonitions and notes are boxed, math is typeset; the proof cells are there but
# the answers are not imported (they sit in kvlib's checks). Not rendered in JupyterLab: the Worked
# solution's literalinclude of the code (the HTML book shows it).
# tests/browser/test_jupyterlab.py opens a notebook this way in headless Chromium.
lab: $(STAMP)
	$(VENV)/bin/jupyter lab book/

bench: $(STAMP)
	$(PY) -m kvlib bench

# Re-execute notebooks in place after changing them or kvlib (they are committed executed):
#   make execute NB="book/01_no_cache.ipynb"     (default: every notebook in _toc.yml)
execute: $(STAMP)
	$(PY) -m tests.nbtools execute $(or $(NB),$(NOTEBOOKS))

# Retrain chapter 7's shipped models (about 20 minutes on 2 cores; the files are committed):
# the multi-head model from its seed, then GQA-4, GQA-2 and MQA by mean-pooling or keeping one head
# per group, each uptrained for 5% of the steps.
WEIGHTS := kvlib/train/weights
weights: $(STAMP)
	$(PY) -m kvlib train --out $(WEIGHTS)/mha.safetensors
	for g in 4 2 1; do \
	  $(PY) -m kvlib train --uptrain $(WEIGHTS)/mha.safetensors --num-kv-heads $$g --out $(WEIGHTS)/kv$$g.safetensors || exit 1; \
	  $(PY) -m kvlib train --uptrain $(WEIGHTS)/mha.safetensors --num-kv-heads $$g --pool keep \
	    --out $(WEIGHTS)/kv$${g}_kept.safetensors || exit 1; \
	done

clean:
	rm -rf _build test-artifacts
