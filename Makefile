# Two commands on a fresh machine with only python3:
#   make run   - make a virtualenv, install politeproxy, print the env lines, run the proxy
#   make test  - the same virtualenv plus the test tools, then every test and the docs build (--strict)
#   make docs  - the manual (docs/) as a site in build/site, built by mkdocs with --strict
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
ARGS ?=

.PHONY: run test docs docs-screenshot test-repeat lint typecheck bench bench-squid bench-squid-setup clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed-run: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@ $(VENV)/.installed-run

# ARGS go to both commands: `env` takes run's flags (--global-rate, -v, ...) and ignores those it does
# not need, so --listen and --data-dir print the lines of the proxy that starts.
run: $(VENV)/.installed-run
	@$(BIN)/politeproxy env $(ARGS)
	@echo '# paste the lines above into your shell (or: eval "$$($(abspath $(BIN))/politeproxy env $(ARGS))"); Ctrl-C stops the proxy'
	@echo '# the politeproxy command is $(abspath $(BIN))/politeproxy; to put it on PATH: source $(abspath $(BIN))/activate'
	exec $(BIN)/politeproxy run $(ARGS)

# duckdb 1.5 and its offline httpfs package, beside the venv's 1.4.4 (one duckdb per environment): the
# duckdb 1.5 tests (tests/e2e/test_duckdb15.py) run it with PYTHONPATH set here. --no-deps: duckdb needs
# nothing else, and pip would only warn that the venv's duckdb-ext-httpfs wants 1.4.4.
DUCKDB15 := 1.5.5
$(VENV)/duckdb15/.installed: | $(BIN)/python
	rm -rf $(VENV)/duckdb15
	$(BIN)/python -m pip install -q --no-deps --target $(VENV)/duckdb15 'duckdb==$(DUCKDB15)' 'duckdb-extension-httpfs==$(DUCKDB15)'
	touch $@

# undici 6 for the Node recipe of docs/tools.md (tests/e2e/test_recipes.py, which skips without it): npm
# where it is installed; a machine without npm, or without the registry, only skips that test.
$(VENV)/node/.installed: | $(BIN)/python
	mkdir -p $(VENV)/node
	if command -v npm >/dev/null 2>&1; then npm install --silent --no-audit --no-fund --prefix $(VENV)/node undici@6 || echo "undici not installed: the Node recipe test skips"; fi
	touch $@

# ruff and the import contracts first (seconds: a slip fails at once); then the suite, with mypy --strict
# and the manual's build beside it at the lowest CPU priority (nice 19): from a clean clone they take ~40 s
# of CPU, which they find while the suite's end-to-end tests wait on sockets and timers, never taking it
# from a timing test. Their output follows the suite's; either failing fails make test.
test: $(VENV)/.installed-test $(VENV)/duckdb15/.installed $(VENV)/node/.installed
	$(BIN)/ruff check politeproxy tests bench
	$(BIN)/lint-imports
	@log=$$(mktemp); \
	nice -n 19 sh -c '$(BIN)/mypy --config-file pyproject.toml && $(BIN)/mkdocs build --strict --quiet' \
		>$$log 2>&1 & checks=$$!; \
	$(BIN)/python -m pytest -q -p no:cacheprovider -n 4; tests=$$?; \
	wait $$checks; ok=$$?; echo "--- mypy --strict and the docs build (run beside the suite):"; cat $$log; \
	rm -f $$log; [ $$ok -eq 0 ] || echo "make test: mypy or the docs build failed (above)"; \
	[ $$tests -eq 0 ] && [ $$ok -eq 0 ]

# The manual: a broken link, anchor or nav entry fails the build (--strict; mkdocs.yml says why mkdocs).
docs: $(VENV)/.installed-test
	$(BIN)/mkdocs build --strict --quiet

# docs/img/status.png again: the status page of a live proxy with two pipelines queued, in headless chromium.
docs-screenshot: $(VENV)/.installed-test
	POLITEPROXY_DOCS_SCREENSHOT=1 $(BIN)/python -m pytest -q -p no:cacheprovider -n 0 tests/slow/test_status_screenshot.py

# The flake finder: the suite N times in a row beside one CPU burner; prints each test that ever failed.
N ?= 5
test-repeat: $(VENV)/.installed-test
	$(BIN)/python -m tests.support.repeat -n $(N)

lint: $(VENV)/.installed-test
	$(BIN)/ruff check politeproxy tests bench
	$(BIN)/ruff format --check politeproxy tests bench
	$(BIN)/mypy --config-file pyproject.toml

# mypy with [tool.mypy] in pyproject.toml: --strict on the whole package (issue 44).
typecheck: $(VENV)/.installed-test
	$(BIN)/mypy --config-file pyproject.toml

bench: $(VENV)/.installed-test bench-squid-setup
	$(BIN)/python bench/run_all.py

# Squid 5 with ssl-bump, the peer bench/beside_squid.py measures politeproxy beside: Debian's squid-openssl
# from apt, unless a Squid built with ssl-crtd is installed already. Only the benchmark needs it (not the
# tests, not CI). Where systemd runs, the package also starts its own service on port 3128; the benchmark
# starts a Squid of its own and leaves that one alone.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
bench-squid-setup:
	@squid -v 2>/dev/null | grep -q -- --enable-ssl-crtd || \
		{ $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q squid-openssl; }

bench-squid: $(VENV)/.installed-test bench-squid-setup
	$(BIN)/python bench/beside_squid.py $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache
