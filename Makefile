# `make demo`, `make test` and `make docs` each create the virtual environment if it is missing.
# torch is pinned in the install step (a CPU wheel of 2.13.0 is available offline on our
# machines); the package itself accepts torch>=2.1.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.gpscale-installed
TORCH_PIN ?= torch==2.13.0
export GPSCALE_DATA ?= $(abspath ../shared/data)

.PHONY: demo test test-slow test-all lint docs bench-peers clean

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet "$(TORCH_PIN)"
	$(PY) -m pip install --quiet -e ".[dev,docs]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/gpscale demo --out runs/demo

# pytest's exit status is also written to .pytest-exit (.pytest-slow-exit) so that .ci/run can
# tell "no tests collected" (5) apart from a failure (make itself turns every non-zero into 2).
test: $(STAMP)
	$(PY) -m pytest -m "not slow and not long and not gpu" -q; rc=$$?; echo $$rc > .pytest-exit; \
	exit $$rc

# The slow tests `make test` leaves out (several processes, compiled kernels, every key's
# estimator checks); `long` ones (defaults trained to their budgets) run in `make test-all` only.
test-slow: $(STAMP)
	$(PY) -m pytest -m "slow and not long and not gpu" -q; rc=$$?; \
	echo $$rc > .pytest-slow-exit; exit $$rc

test-all: $(STAMP)
	$(PY) -m pytest -q

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests

# The documentation site (Sphinx: docs/conf.py says why). Warnings are errors, as in CI;
# --keep-going lists all of them before failing. Open docs/_build/html/index.html.
docs: $(STAMP)
	$(PY) -m sphinx -W --keep-going -b html docs docs/_build/html

bench-peers: $(STAMP)
	$(VENV)/bin/gpscale bench peers --out runs/bench-peers

clean:
	rm -rf $(VENV) runs .pytest_cache docs/_build
