# The project's commands. Every target runs on a CPU laptop unless its name says otherwise.
VENV ?= .venv
PY := $(VENV)/bin/python
SCALE ?= tiny
SEED ?= 0
WORLD ?= runs/tinyworld/seed$(SEED)

.PHONY: install test lint format world bench

install:  ## venv + torch (CPU or CUDA, detected) + the project editable with its extras
	bash scripts/install.sh

test: lint  ## ruff, then the whole test suite (GPU tests skip without a GPU)
	$(PY) -m pytest -q

lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format:
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

world:  ## build the tiny world (corpus, questions, tokenizer, model) into $(WORLD)
	$(PY) -m common.tinyworld build --out $(WORLD) --seed $(SEED)

bench:  ## every benchmark; tables go to benchmarks/README.md
	$(PY) benchmarks/bench_retrieval.py
