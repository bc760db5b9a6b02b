# Every target sets itself up: a fresh clone needs only `make run` or `make test`.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)
BENCH_STAMP := $(VENV)/.bench-$(shell cksum pyproject.toml | cut -d' ' -f1)

.PHONY: install run demo test test-fast lint bench clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11) and "tether needs Python >= 3.11")'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,dev]'
	@rm -f $(VENV)/.installed-*
	@touch $(STAMP)

install: $(STAMP)

# The main job on the embedded default (SQLite under ./.tether): the help desk demo.
run: $(STAMP)
	$(BIN)/tether demo

demo: run

# The whole suite. Postgres contract tests start a throwaway cluster when
# PostgreSQL's binaries are installed (.ci/setup-postgres.sh installs them).
# The OAuth tests run a real OpenID provider (npm oidc-provider, pinned by tests/idp/package-lock.json).
IDP := tests/idp/node_modules/.installed

$(IDP): tests/idp/package.json tests/idp/package-lock.json
	cd tests/idp && npm ci --no-audit --no-fund
	@touch $(IDP)

# The MCP project's reference server, an upstream for the gateway tests (pinned by tests/everything/package-lock.json).
EVERYTHING := tests/everything/node_modules/.installed

$(EVERYTHING): tests/everything/package.json tests/everything/package-lock.json
	cd tests/everything && npm ci --no-audit --no-fund
	@touch $(EVERYTHING)

# The official TypeScript MCP client drives the server in tests/server/test_ts_client.py
# (npm @modelcontextprotocol/sdk, pinned by tests/tsclient/package-lock.json).
TSCLIENT := tests/tsclient/node_modules/.installed

$(TSCLIENT): tests/tsclient/package.json tests/tsclient/package-lock.json
	cd tests/tsclient && npm ci --no-audit --no-fund
	@touch $(TSCLIENT)

test: $(STAMP) $(IDP) $(EVERYTHING) $(TSCLIENT)
	$(BIN)/python -m pytest -q

# Without the tests that spawn processes or wait on real time.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

# The gates CI runs before the suite: lint rules and imports (ruff), types (mypy). Config in pyproject.toml.
lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/mypy

# The benchmarks' contenders (FastMCP Code Mode) come from the bench extra, installed on first use.
# BFCL's API classes come from bfcl-eval without its dependencies (an evaluation pipeline of model clients,
# torch, vllm...): bench/bfcl_bench.py imports only the classes, which need mpmath. AgentDojo (the `agentdojo`
# extra) comes with the model clients it imports and never calls.
$(BENCH_STAMP): $(STAMP)
	$(BIN)/pip install -q -e '.[bench,agentdojo]'
	$(BIN)/pip install -q --no-deps bfcl-eval==2026.3.23 mpmath==1.3.0
	@rm -f $(VENV)/.bench-*
	@touch $(BENCH_STAMP)

# Every benchmark; `make bench BENCH_ARGS=--quick` is the smoke pass CI runs after the tests.
bench: $(BENCH_STAMP)
	$(BIN)/python bench/run_all.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .tether .pytest_cache
