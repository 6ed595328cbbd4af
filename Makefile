# tokentrail — the two quick-start commands are `make demo` and `make test`.
# Prerequisites: Python 3.11+, Java 17+, Maven. Everything else is fetched from PyPI and Maven Central.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
JARS   := deploy/kafka/lib/.fetched

.PHONY: setup demo test lint bench clean-var setup-vllm

setup: $(STAMP) $(JARS)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --progress-bar off -e '.[torch,dev]'
	touch $(STAMP)

$(JARS): deploy/kafka/pom.xml
	rm -rf deploy/kafka/lib  # never mix jar versions from an older pom
	mvn -q -B -f deploy/kafka/pom.xml dependency:copy-dependencies
	touch $(JARS)

# vLLM (CPU build) in its own environment .venv-vllm, for the live vLLM tests (tests/vllm_live);
# about 2 minutes (uv) and 6 GB on a fresh machine, a no-op once installed.
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
	for b in codec gateway processors sink trainer; do $(BIN)/python -m bench.$$b || exit 1; done

clean-var:
	-$(BIN)/tokentrail kafka stop
	rm -rf var
