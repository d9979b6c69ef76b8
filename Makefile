# Two commands do everything on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.tidemark-installed
RUN_STAMP := $(VENV)/.tidemark-run-installed
# Tested pins of every dependency (pyproject.toml has ranges); `make lock` regenerates it.
LOCK := requirements.lock
PROTO_DIR := proto
PROTO_SRC := $(wildcard $(PROTO_DIR)/tidemark/v1/*.proto) $(wildcard $(PROTO_DIR)/tidemark/rmq5/v2/*.proto)
PROTO_STAMP := $(PROTO_DIR)/tidemark/v1/.generated
# The install is editable in setuptools' strict mode: a tree of links to every file of the package
# (build/__editable__.*), on the venv's path by a plain .pth entry, so that editors and type checkers
# resolve `tidemark.broker.x` to broker/x.py as Python does. The tree is made again when a file is
# added, removed or renamed, which changes the list in $(FILES).
STRICT := --config-settings editable_mode=strict
FILES := $(VENV)/.tidemark-files
# (A temporary file of its own per make: `make test` runs two makes at once.)
$(shell mkdir -p $(VENV) && t=$(FILES).new.$$$$ && find common broker client spark_connector proto -type f \
	! -path '*/__pycache__/*' ! -path '*.egg-info/*' ! -name '*_pb2*' ! -name .generated | LC_ALL=C sort > $$t; \
	cmp -s $$t $(FILES) || mv $$t $(FILES); rm -f $$t)
DATA_DIR ?= ./data
PORT ?= 10911
# The suite runs on pytest-xdist workers; tests/conftest.py keeps tests that share a heavy resource
# (container engine, SparkSession, browser, benchmarks, fault scenarios) on one worker each.
# Four on 2 cores: the suite waits on processes, brokers and Spark more than it computes (about 12.5
# CPU-minutes in 8-10 minutes of wall time), so a fourth worker fills the waits (584 s -> 481 s here).
PYTEST_WORKERS ?= 4
PYTEST_ARGS ?= --durations=30 -n $(PYTEST_WORKERS) --dist loadscope

.PHONY: setup gen run test test-tools torture lint lock bench bench-client bench-rmq5 demo images docs clean

setup: $(STAMP) $(PROTO_STAMP)

# The broker's own dependencies and the code generator: all that `make run` needs (no Spark, no
# test or bench packages).
$(RUN_STAMP): pyproject.toml setup.py $(LOCK) $(FILES)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c $(LOCK) $(STRICT) -e '.[broker,build]'
	touch $@

# Everything: the Spark connector, tests, benchmarks.
$(STAMP): $(RUN_STAMP)
	$(PY) -m pip install --quiet -c $(LOCK) $(STRICT) -e '.[broker,build,spark,dev,compat]'
	touch $@

# A fresh resolve of pyproject.toml's ranges into $(LOCK) (then review the diff and run make test).
lock:
	rm -rf build/lock-venv && $(PYTHON) -m venv build/lock-venv
	build/lock-venv/bin/python -m pip install --quiet --upgrade pip
	build/lock-venv/bin/python -m pip install --quiet '.[broker,build,spark,dev,compat]'
	{ sed -n '/^#/p' $(LOCK); build/lock-venv/bin/python -m pip freeze --exclude tidemark; } > $(LOCK).new
	mv $(LOCK).new $(LOCK) && rm -rf build/lock-venv

gen: $(PROTO_STAMP)

$(PROTO_STAMP): $(PROTO_SRC) $(RUN_STAMP)
	$(PY) -m grpc_tools.protoc -I $(PROTO_DIR) \
		--python_out=$(PROTO_DIR) --pyi_out=$(PROTO_DIR) --grpc_python_out=$(PROTO_DIR) \
		$(PROTO_SRC)
	touch $@

run: $(RUN_STAMP) $(PROTO_STAMP)
	$(VENV)/bin/tidemark broker --data-dir $(DATA_DIR) --port $(PORT)

# tests/containers/ need a container engine, the alert-rule test Debian's promtool (package prometheus) and
# tests/browser/ Debian's chromium: installed here when run as root (CI), else those tests skip saying why.
# A Debian package a test needs, installed when its command is missing and this runs as root (a fresh CI
# machine); otherwise the tests that need it skip and say why. $(1): command, $(2): package, $(3): who skips.
define apt_install
	@command -v $(1) >/dev/null || [ "$$(id -u)" != 0 ] || \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $(2) >/dev/null || \
		{ apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive \
		  apt-get install -y -q --no-install-recommends $(2) >/dev/null; } || \
		echo "$(2) could not be installed: $(3) will skip"
endef

# The virtualenv and the system packages are set up side by side (pip and apt-get download and unpack
# at once on a fresh machine; `setup` itself stays in order), then the suite runs.
# The package and the tests' helpers are compiled first: these machines set PYTHONDONTWRITEBYTECODE and an
# editable install compiles nothing, so every broker, client and CLI process the suite starts compiled the
# modules again (importing the broker and the CLI: 0.45-0.7 s uncompiled, 0.31-0.33 s compiled, here).
# For the same reason each pytest worker rewrote the asserts of every test module (tools/rewrite_cache.py
# writes pytest's cache of them once: a worker's collection 8.4 s -> about 3 s).
# The brokers the tests start (about 550) and their CLI runs (about 270) are forked from one process per
# worker that imported the broker and the CLI once (tests/forkserver.py): 0.1 s of CPU a broker instead of
# 0.5, 0.03 s a CLI run instead of 0.26-0.33; TIDEMARK_TEST_EXEC=1 exec's them.
test:
	@$(MAKE) --no-print-directory test-tools & tools=$$!; $(MAKE) --no-print-directory setup; \
		setup=$$?; wait $$tools && [ $$setup = 0 ]
	$(PY) -m compileall -q -j 0 build/__editable__.*/tidemark tests >/dev/null
	$(PY) tools/rewrite_cache.py tests
	$(PY) -m pytest $(PYTEST_ARGS)

# System packages only tests use (the standard library's Python runs the engine's installer: the venv
# may not exist yet).
test-tools:
	$(PYTHON) tools/container_engine.py install
	$(call apt_install,promtool,prometheus,the alert-rule test)
	$(call apt_install,chromium,chromium,the console's browser tests)
	$(call apt_install,iptables,iptables,the partition fault run)

# Seeded fault runs (tests/faults/, docs/guarantees.md): make torture SCENARIOS=kill,failover RUNS=20 SEED=100
# MODE=flush=sync DURATION=30. Prints each run, the command that repeats a failing one, and a table.
RUNS ?= 5
SEED ?= 1
DURATION ?= 30
torture: setup
	$(call apt_install,iptables,iptables,the partition scenario)
	$(PY) -m tests.faults.torture --runs $(RUNS) --seed $(SEED) --duration $(DURATION) \
		$(if $(SCENARIOS),--scenarios $(SCENARIOS)) $(if $(MODE),--mode $(MODE))

demo: setup
	$(PY) examples/streaming_pipeline.py --start-broker

bench: setup
	$(PY) -m bench
	$(PY) -m bench.spark

bench-client: setup
	$(PY) -m bench.client_e2e
	$(PY) -m bench.rebalance

# The official RocketMQ 5 Python client against Tidemark, beside Tidemark's own client.
bench-rmq5: setup
	$(PY) -m bench.rmq5_client

# The broker and Spark images (Dockerfile), from a wheelhouse built here; see tools/images.py.
images: $(RUN_STAMP) $(PROTO_STAMP)
	$(PY) tools/images.py $(IMAGES_ARGS)

lint: setup
	$(VENV)/bin/ruff check .

# The API reference of the client library and the Spark connector, from the docstrings (pdoc), in
# build/api/ (open build/api/index.html). Admin's subject modules (client/admin_*.py) and the consumers'
# shared base (client/consumer/blocking.py) are documented too: a page links each method its class
# inherits from them to its entry there.
docs: setup
	rm -rf build/api
	$(PY) -m pdoc -o build/api tidemark.client \
		$(patsubst client/%.py,tidemark.client.%,$(sort $(wildcard client/admin_*.py))) \
		tidemark.client.consumer.blocking tidemark.spark_connector

clean:
	rm -rf $(VENV) $(PROTO_DIR)/tidemark/v1/*_pb2*.py* $(PROTO_DIR)/tidemark/rmq5/v2/*_pb2*.py* $(PROTO_STAMP)
