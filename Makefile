# kvstore: `make serve` runs the service on embedded defaults, `make test` runs every test.
# Both create .venv on first use. Python 3.11+ is the only thing the machine must have.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: venv serve test lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch's CPU build first, so that nothing below pulls a CUDA build.
	$(PIP) install -q "torch==2.13.0"
	$(PIP) install -q -e ".[dev]"
	touch $(STAMP)

venv: $(STAMP)

serve: $(STAMP)
	$(VENV)/bin/kvstore serve $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check .

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest $(PYTEST_ARGS)

bench: $(STAMP)
	for b in bench/bench_*.py; do $(PY) $$b --quick || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
