# leasejobs: make demo | test | test-fast | lint | stop-db | clean
#
#   PYTHON       interpreter for a new venv (default: the newest python3.14,
#                python3.13 or python3.12 on PATH or under pyenv)
#   VENV         the venv to use or make (default .venv)
#   DJANGO       an extra pip requirement, e.g. DJANGO='django>=5.2,<6'
#   DEMO_ARGS    passed to manage.py demo, e.g. DEMO_ARGS=--fast
#   PYTEST_ARGS  passed to pytest, e.g. PYTEST_ARGS='-x tests/integration/test_localdb.py'
#   TEST_WORKERS parallel pytest processes of make test's first phase (default 4;
#                0 runs that phase in one process, e.g. for --pdb). More would
#                overrun PostgreSQL's default max_connections of 100: the tests
#                of a process open up to ~13 connections at once; those marked
#                many_connections(n) up to 50, each when the others leave room
#                (tests/connection_budget.py).
#
# make test runs every test; make test-fast only the unit tests (no worker
# process, no server, no committed transaction, no chaos), in seconds.
# make test runs pytest twice (tests/conftest.py, --phase): first the tests
# that can share the machine, in TEST_WORKERS processes (pytest-xdist), each
# with a test database of its own (test_leasejobs_gw0, _gw1, ...), the chaos
# storms among them; then, alone and in one process, the rest of the chaos
# suite, which restarts PostgreSQL and cuts the network, and the tests marked
# alone. PYTEST_ARGS go to both; a phase they
# leave without tests is skipped by pytest (exit status 5) and counts as
# passed if the other phase ran tests.
#
# Which PostgreSQL: DATABASE_URL if set, else localhost:5432, else an embedded
# one in .leasejobs/ (see localdb.py).

VENV ?= .venv
DJANGO ?=
DEMO_ARGS ?=
PYTEST_ARGS ?=
TEST_WORKERS ?= 4
# Which tests: empty is all; test-fast sets it (markers from tests/conftest.py).
PYTEST_SELECT :=

PY := $(VENV)/bin/python
# What is installed: the demo extra (make demo), or the test extra (test, lint),
# which holds the demo's and the tools'.
DEMO_STAMP := $(VENV)/.leasejobs-demo-installed
STAMP := $(VENV)/.leasejobs-installed
DJANGO_REQ := $(VENV)/.leasejobs-django-requirement
LOCALDB := $(PY) -m localdb

# Recursively expanded, so the search runs only when a venv has to be made.
# A pyenv shim exists for versions that are not selected and then fails, so
# each candidate must actually run.
PYTHON ?= $(shell \
	root=$$(pyenv root 2>/dev/null || echo "$${PYENV_ROOT:-$$HOME/.pyenv}"); \
	for v in 3.14 3.13 3.12; do \
	  for p in $$(command -v python$$v) $$root/versions/*/bin/python$$v; do \
	    if [ -x "$$p" ] && "$$p" -c 'import sys; sys.exit(sys.version_info < (3, 12))' >/dev/null 2>&1; \
	    then echo "$$p"; exit 0; fi; \
	  done; \
	done)

# Shell snippet: resolve the database and export it to the commands after it.
RESOLVE_DB = echo "==> finding a PostgreSQL: python -m localdb url"; \
	DATABASE_URL="$$($(LOCALDB) url)"; export DATABASE_URL

.PHONY: demo test test-fast lint stop-db clean

demo: $(DEMO_STAMP)
	@set -e; $(RESOLVE_DB); \
	echo "==> python manage.py migrate --noinput"; \
	$(PY) manage.py migrate --noinput; \
	echo "==> python manage.py demo $(DEMO_ARGS)"; \
	$(PY) manage.py demo $(DEMO_ARGS); \
	if $(LOCALDB) status >/dev/null 2>&1; then \
	  echo "==> the embedded PostgreSQL keeps running; 'make stop-db' stops it"; \
	fi

# The embedded server is stopped afterwards if this run started it, also on
# Ctrl-C. make's exit status is the first failing phase's, 0 if both passed
# (or one had no tests), 5 if neither had any.
test: $(STAMP)
	@set -e; \
	if $(LOCALDB) status >/dev/null 2>&1; then was_running=1; else was_running=0; fi; \
	cleanup() { \
	  if [ $$was_running = 0 ] && $(LOCALDB) status >/dev/null 2>&1; then \
	    echo "==> stopping the embedded PostgreSQL this run started"; \
	    $(LOCALDB) stop; \
	  fi; \
	}; \
	trap cleanup EXIT; trap 'exit 130' INT TERM; \
	$(RESOLVE_DB); \
	echo "==> phase 1 of 2, in $(TEST_WORKERS) processes:" \
	  "python -m pytest --phase=parallel -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_SELECT) $(PYTEST_ARGS)"; \
	parallel=0; \
	$(PY) -m pytest --phase=parallel -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_SELECT) $(PYTEST_ARGS) \
	  || parallel=$$?; \
	echo "==> phase 2 of 2, alone (the chaos suite but its storms, and the tests marked alone):" \
	  "python -m pytest --phase=serial -p no:xdist $(PYTEST_SELECT) $(PYTEST_ARGS)"; \
	serial=0; $(PY) -m pytest --phase=serial -p no:xdist $(PYTEST_SELECT) $(PYTEST_ARGS) || serial=$$?; \
	echo "==> pytest exit status: phase 1 $$parallel, phase 2 $$serial (5: no tests selected)"; \
	if [ $$parallel != 0 ] && [ $$parallel != 5 ]; then exit $$parallel; fi; \
	if [ $$serial != 0 ] && [ $$serial != 5 ]; then exit $$serial; fi; \
	if [ $$parallel = 5 ] && [ $$serial = 5 ]; then exit 5; fi; \
	exit 0

test-fast: PYTEST_SELECT := -m 'not integration and not chaos'
test-fast: test

# Style and types; configured in pyproject.toml ([tool.ruff], [tool.mypy]).
# Needs no database: mypy's Django plugin reads tests/typecheck_settings.py.
lint: $(STAMP)
	@echo "==> ruff check ."
	@$(PY) -m ruff check .
	@echo "==> ruff format --check ."
	@$(PY) -m ruff format --check .
	@echo "==> mypy (strict, over leasejobs/, bench/ and localworkers.py)"
	@$(PY) -m mypy

# Works without the venv too: stopping needs neither psycopg nor the wheel.
stop-db:
	@echo "==> stopping the embedded PostgreSQL, if it runs"
	@$(if $(wildcard $(PY)),$(PY),python3) -m localdb stop

clean: stop-db
	@echo "==> removing $(VENV), .leasejobs/ (the embedded database) and caches"
	@rm -rf $(VENV) .leasejobs .pytest_cache .ruff_cache build dist *.egg-info
	@find . -path ./.git -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

# Set-up shared by demo, test and lint: make the venv if missing, then install
# the project with the extra the target needs (demo: the demo's; test and lint:
# the tests' and the tools'). The stamps make re-runs instant and are redone
# when pyproject.toml or DJANGO changes.
MAKE_VENV = if [ ! -x $(PY) ]; then \
	  python='$(PYTHON)'; \
	  if [ -z "$$python" ]; then \
	    echo "make: no Python >= 3.12 found (python3.14, python3.13, python3.12 on PATH or under pyenv); pass PYTHON=/path/to/python" >&2; \
	    exit 1; \
	  fi; \
	  echo "==> creating $(VENV) with $$python ($$("$$python" -V 2>&1))"; \
	  "$$python" -m venv $(VENV); \
	fi

$(STAMP): pyproject.toml $(DJANGO_REQ)
	@$(MAKE_VENV)
	@echo "==> pip install -e '.[test]' $(if $(DJANGO),'$(DJANGO)' )into $(VENV)"
	@$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]' $(if $(DJANGO),'$(DJANGO)')
	@touch $@

$(DEMO_STAMP): pyproject.toml $(DJANGO_REQ)
	@$(MAKE_VENV)
	@echo "==> pip install -e '.[demo]' $(if $(DJANGO),'$(DJANGO)' )into $(VENV)"
	@$(PY) -m pip install --quiet --disable-pip-version-check -e '.[demo]' $(if $(DJANGO),'$(DJANGO)')
	@touch $@

# Rewritten only when DJANGO changes, so that such a change re-runs the install.
$(DJANGO_REQ): FORCE
	@mkdir -p $(VENV)
	@echo '$(DJANGO)' | cmp -s - $@ || echo '$(DJANGO)' > $@

.PHONY: FORCE
FORCE:
