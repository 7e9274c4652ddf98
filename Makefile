# Two entry points that work on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.leyline-installed

.PHONY: demo test bench lint clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# CPU build of torch first, so the server extra does not pull a CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[server,dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/demo.py

test: $(STAMP)
	$(VENV)/bin/ruff check src policies tests benchmarks examples
	$(VENV)/bin/ruff format --check src policies tests benchmarks examples
	$(VENV)/bin/mypy src policies
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) benchmarks/bench_diff.py
	$(PY) benchmarks/bench_rotate.py
	$(PY) benchmarks/bench_engine.py

lint: $(STAMP)
	$(VENV)/bin/ruff check src policies tests benchmarks examples

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
