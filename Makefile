# tokentrail — the two quick-start commands are `make demo` and `make test`.
# Prerequisites: Python 3.11+, Java 17+, Maven. Everything else is fetched from PyPI and Maven Central.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
JARS   := deploy/kafka/lib/.fetched
UV_VERSION := 0.13.9

.PHONY: setup demo test lint bench clean-var setup-vllm

setup: $(STAMP) $(JARS)

# uv installs from one cache that it hard-links into the venv (no second copy of torch, as pip's
# wheel cache keeps) and that .venv-vllm shares; deploy/constraints.txt pins the torch both use.
$(STAMP): pyproject.toml deploy/constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check --no-cache-dir 'uv==$(UV_VERSION)'
	UV_SYSTEM_CERTS=1 $(BIN)/uv pip install --python $(BIN)/python -c deploy/constraints.txt -e '.[torch,dev]'
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

# Sets everything up, then runs the main job: Kafka, embedded ClickHouse, gateway on the embedded
# engine, processors, sink and trainer, with an agent workload trained online; ends with the audit.
demo: setup
	$(BIN)/tokentrail demo

test: setup
	$(BIN)/pytest

lint: setup
	$(BIN)/ruff check .

bench: setup
	for b in codec gateway tokenize processors sink trainer; do $(BIN)/python -m bench.$$b || exit 1; done

clean-var:
	-$(BIN)/tokentrail kafka stop
	rm -rf var
