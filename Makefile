# The project's commands. SCALE=tiny (the default) runs on a laptop CPU, offline.
VENV ?= .venv
PY := $(VENV)/bin/python
SEED ?= 0

.PHONY: install test test-fast lint format world warmstart train-grpo demo bench bench-trl

install:  ## venv + torch (CPU or CUDA, detected) + the project editable with its extras
	bash scripts/install.sh

test: lint  ## ruff, then the whole test suite (GPU tests skip without a GPU)
	$(PY) -m pytest -q

test-fast: lint  ## without the tests that start engines or subprocesses
	$(PY) -m pytest -q -m "not slow"

lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format:
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

world:  ## the tiny world (corpus, questions, tokenizer, model) in runs/tinyworld/seed$(SEED)
	$(PY) -m common.tinyworld build --out runs/tinyworld/seed$(SEED) --seed $(SEED)

warmstart: world  ## supervised warm start of the tiny agent on gold search paths
	$(PY) -m common.warmstart --config common/configs/warmstart_tiny.yaml \
		world=runs/tinyworld/seed$(SEED) seed=$(SEED)

train-grpo: warmstart  ## the reference GRPO loop on the tiny world
	$(PY) -m common.search_grpo --config common/configs/grpo_tiny.yaml \
		world=runs/tinyworld/seed$(SEED) seed=$(SEED)

demo:  ## everything end to end on the tiny setup, from nothing, on CPU
	$(PY) -m common.demo --out runs/demo --seed $(SEED)

bench:  ## the benchmarks; each prints a table (copied into benchmarks/README.md)
	$(PY) benchmarks/bench_retrieval.py
	$(PY) benchmarks/bench_cer_scoring.py
	$(PY) benchmarks/bench_rollout.py
	$(PY) benchmarks/bench_grpo_breakdown.py

bench-trl:  ## our GRPO step against TRL's GRPOTrainer (installs the optional trl extra)
	$(PY) -m pip install -q -e ".[bench]"
	$(PY) benchmarks/bench_grpo_step.py
