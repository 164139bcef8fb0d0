PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test soak fuzz bench failover clean

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --progress-bar off --upgrade pip
	$(BIN)/pip install --progress-bar off -e '.[test]'  # not -q: a first install takes a minute, shown line by line
	touch $@

demo: $(VENV)/.installed
	$(BIN)/mooncake-columnar demo

# The second run executes the kernel tests as plain Python (NUMBA_DISABLE_JIT=1), so the kernels
# stay debuggable and coverable without the JIT; their uint64 hashes wrap on purpose, hence the
# silenced NumPy overflow warnings.
test: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/python -m pytest
	# the kernel tests again as plain Python: the kernels' logic, not only their compiled form
	NUMBA_DISABLE_JIT=1 $(BIN)/python -m pytest -m kernels -W "ignore:overflow encountered:RuntimeWarning"

soak: $(VENV)/.installed  # the default run soaks for 20 s; this one for 10 minutes
	MOONCAKE_SOAK_SECONDS=600 $(BIN)/python -m pytest tests/core/test_soak.py

fuzz: $(VENV)/.installed  # the default run fuzzes 200 cases per format; this one 1000 (prints the table)
	MOONCAKE_FUZZ_CASES=$${MOONCAKE_FUZZ_CASES:-1000} $(BIN)/python -m pytest -s -rxX tests/snapshots/test_fuzz_formats.py

bench: $(VENV)/.installed
	$(BIN)/asv machine --yes
	$(BIN)/asv run --python=same --quick --show-stderr

clean:
	rm -rf $(VENV) .hypothesis .pytest_cache

failover: $(VENV)/.installed  # N kill -9 and SIGTERM failovers of serve beside the wheel's master in HA mode
	$(BIN)/mooncake-columnar bench failover --objects 200 --trials $${TRIALS:-5} --json
