# The README's commands. Everything they need, they install.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run test test-postgres bench soak lint format sysdeps sysdeps-test sysdeps-bench screenshots clean

$(BIN)/.installed: requirements.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) || { \
	  echo "python3 -m venv failed: on Debian, apt-get install python3-venv"; exit 1; }
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements.txt
	@touch $@

sysdeps:
	@scripts/system-packages

sysdeps-test:
	@scripts/system-packages --with-browser

sysdeps-bench:
	@scripts/system-packages --with-browser

run: $(BIN)/.installed sysdeps
	$(BIN)/python -m devstack

test: $(BIN)/.installed sysdeps-test
	$(BIN)/python -m pytest

# The suite again on PostgreSQL, as CI runs it (.ci/run): the machine's cluster on 127.0.0.1:5432,
# started if it is installed but down; each run creates and drops its own test database.
# The browser tests are left to `make test`: they test the pages, not the database.
POSTGRES_URL ?= postgres://postgres@127.0.0.1:5432/llmgw_ci
test-postgres: $(BIN)/.installed sysdeps-test
	@scripts/postgres-up
	DATABASE_URL=$(POSTGRES_URL) $(BIN)/python -m pytest -m "not browser"

# Every module in bench/ but the soak, each run as `python -m bench.NAME` from the repository root
# (bench.heartbeat and bench.scaleout need PostgreSQL at BENCH_POSTGRES, default 127.0.0.1:5432).
BENCHES = $(filter-out __init__ soak,$(basename $(notdir $(wildcard bench/*.py))))
bench: $(BIN)/.installed sysdeps-bench
	@for b in $(BENCHES); do echo "## bench.$$b"; $(BIN)/python -m bench.$$b || exit 1; done

# 20 minutes, 2,000 simulated nodes, every fault; not part of `make bench` or `make test`
# (tests/test_soak_short.py is). MINUTES=5 NODES=500 make soak for a shorter one.
MINUTES ?= 20
NODES ?= 2000
soak: $(BIN)/.installed sysdeps-test
	$(BIN)/python -m bench.soak --minutes $(MINUTES) --nodes $(NODES)

# lint-imports holds the layers in pyproject.toml: web app > domain > live state > wire protocol > lib;
# mypy checks the types (pyproject.toml [tool.mypy]).
lint: $(BIN)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy

format: $(BIN)/.installed
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf var .pytest_cache

# Photographs the pages of a demo stack it starts on free ports (or of a running
# stack: make screenshots ARGS="--url http://127.0.0.1:8000").
screenshots: $(BIN)/.installed sysdeps-test
	$(BIN)/python -m scripts.screenshots $(ARGS)
