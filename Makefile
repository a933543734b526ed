# polyml: `make demo` and `make test` set everything up on a fresh machine (scripts/install.sh).
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_WORKERS ?= 2

.PHONY: setup demo test test-fast test-emulator lint bench lock dist docker clean

setup:
	@scripts/install.sh $(VENV)

demo: setup
	@$(PY) scripts/demo.py

test: setup
	$(PY) -m pytest -n $(PYTEST_WORKERS) --durations=15 tests

test-fast: setup
	$(PY) -m pytest -n $(PYTEST_WORKERS) -m "not slow and not nodesuite" tests

# CUDA builds on the emulator beyond CI: the eight other light CNNs and the ONNX node suite (docs/GPU.md)
test-emulator: setup
	POLYML_EMULATOR_FULL=1 $(PY) -m pytest -n $(PYTEST_WORKERS) --durations=15 -m emulator_full tests/test_gpu_emulator.py tests/test_gpu_emulator_nodesuite.py

lint: setup
	$(VENV)/bin/ruff check polyml scripts tests
	$(VENV)/bin/lint-imports --no-logo

bench: setup
	$(PY) scripts/bench_cnns.py

# requirements/*.txt from pyproject.toml's ranges (uv); UPGRADE=1 takes the newest versions
lock:
	@UPGRADE=$(UPGRADE) scripts/lock.sh

# the sdist and the wheel built from it, into dist/
dist: setup
	@scripts/dist.sh dist

# the image of docker/Dockerfile, built and smoke-tested (docker/README.md)
docker: setup
	@docker/build.sh

clean:
	rm -rf build dist *.egg-info .pytest_cache
