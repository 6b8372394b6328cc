# `make demo` and `make test` each create the virtual environment if it is missing.
# torch is pinned in the install step (a CPU wheel of 2.13.0 is available offline on our
# machines); the package itself accepts torch>=2.1.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.gpscale-installed
TORCH_PIN ?= torch==2.13.0
export GPSCALE_DATA ?= $(abspath ../shared/data)

.PHONY: demo test test-all lint bench-peers clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet "$(TORCH_PIN)"
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/gpscale demo --out runs/demo

# pytest's exit status is also written to .pytest-exit so that .ci/run can tell
# "no tests collected" (5) apart from a failure (make itself turns every non-zero into 2).
test: $(STAMP)
	$(PY) -m pytest -m "not slow and not gpu" -q; rc=$$?; echo $$rc > .pytest-exit; exit $$rc

test-all: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests

bench-peers: $(STAMP)
	$(VENV)/bin/gpscale bench peers --out runs/bench-peers

clean:
	rm -rf $(VENV) runs .pytest_cache
