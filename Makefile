# trajlake developer commands. `make help` lists them.
VENV := $(shell scripts/venv.sh 2>/dev/null)
PY := $(VENV)/bin/python

.PHONY: help dev lint format test unit bench demo typecheck docs

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

dev:  ## create/refresh the cached virtualenv with every extra (prints its path)
	@scripts/venv.sh

lint:  ## ruff check + format check, mypy on the light packages
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy common schemas store ingest/codec.py ingest/sink.py ingest/recorder.py rollout/loadgen.py trainer dashboards

format:  ## apply ruff's fixes and formatting
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

test:  ## the README's test command: services + the whole suite
	scripts/test.sh

# Bytecode caches stay on for the unit tests even where PYTHONDONTWRITEBYTECODE is set: without
# them the controller and every xdist worker compile each trajlake and test module again
# (about 9 of a run's 99 CPU-seconds on 2 cores).
unit:  ## the unit tests alone (no servers), a worker per core: a bare pytest (pyproject's addopts)
	PYTHONDONTWRITEBYTECODE= $(VENV)/bin/pytest

# bench/harness.py and bench/plots.py are no benchmarks; token_entropy.py reads a lake you name (--lake)
bench:  ## every benchmark in quick mode, figures under bench/results/; each with a baseline is checked against it
	@mkdir -p bench/results
	@for b in $$(ls bench/*.py | grep -v -e harness -e plots -e token_entropy); do n=$$(basename $$b .py); echo "== $$b"; \
	  $(PY) $$b --quick --json bench/results/$$n.json $$([ -f bench/baselines/$$n.json ] && echo --check) || exit 1; done

docs:  ## regenerate the reference pages from the code, then build the site (mkdocs serve: read it live)
	$(PY) scripts/docs_reference.py
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

demo:  ## the main job on the embedded default
	$(VENV)/bin/trajlake demo
