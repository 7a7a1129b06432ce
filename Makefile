# Two commands set up everything on a fresh machine:
#   make demo   builds .venv if missing with the core package only (torch, the package, its required
#               dependencies), writes a small real-text dataset, runs the demo
#   make test   builds .venv if missing, installs every extra the tests use, runs the tests
#   make lint   the linter, the formatter's check and the type checker on the package (CI runs it)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test lint venv bench clean

venv: $(VENV)/.installed

# The core: what the demo (and a user's training loop) needs, nothing optional.
$(VENV)/.core: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	# torch is pinned to the CPU wheel on local disk; install it first so nothing pulls another build.
	$(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.installed: $(VENV)/.core
	# The tests start a local Ray cluster (the remote runner) and a local S3 server (object storage)
	# and write Hugging Face datasets: those optional extras are part of the test setup, with
	# the pinned linter and type checker.
	$(PY) -m pip install -q -e ".[test,fast,ray,s3,compat,hf,progress,formats,lance,vortex,lint]"
	# Other loaders' writers, for the tests that read their formats: without their declared
	# dependencies (mosaicml-streaming pins numpy below ours and wants torchvision; its writer
	# needs neither); what they import is in the formats extra.
	$(PY) -m pip install -q --no-deps "mosaicml-streaming==0.13.0" "litdata==0.2.76"
	# Zephon 0.2.0's source distribution (its test suite), for compat/ and its CI selection.
	$(PY) compat/zephon_suite.py fetch
	touch $@

demo: $(VENV)/.core
	$(PY) examples/demo.py

test: venv
	ZC_REQUIRE_EXTRAS=1 $(PY) -m pytest -p no:cacheprovider --doctest-modules zephon_columnar tests

lint: venv
	$(VENV)/bin/ruff check zephon_columnar
	$(VENV)/bin/ruff format --check zephon_columnar
	$(VENV)/bin/mypy

bench: venv  # needs the one-time setup of benchmarks/README.md
	PYTHONPATH=. $(PY) benchmarks/prepacked.py --corpus benchmarks/data/small --rounds 5

clean:
	rm -rf $(VENV) .demo_data
