# The two commands a newcomer needs: `make demo` and `make test`. Both set everything up:
# a virtualenv in .venv, the Python dependencies, and the Rust extension (release build).

SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
export PYO3_PYTHON := $(abspath $(PY))
export CARGO_TERM_COLOR ?= never

RUST_SOURCES := Cargo.toml $(shell find crates -name '*.rs' -o -name Cargo.toml) $(shell find proto -name '*.proto')
DEPS_STAMP := $(VENV)/.deps-installed
EXT_STAMP := $(VENV)/.extension-built

.PHONY: setup demo test test-rust test-python lint fmt bench clean

$(PY):
	python3 -m venv $(VENV)

$(DEPS_STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "maturin>=1.7,<2" "numpy>=1.24" "pytest>=7.4" "ruff>=0.6" "matplotlib>=3.7" "tensorboard>=2.14" "networkx>=3.0" "scipy>=1.10" "grpcio>=1.60" "protobuf>=4.25" $(EXTRA_PIP)
	touch $@

$(EXT_STAMP): $(DEPS_STAMP) $(RUST_SOURCES) pyproject.toml
	VIRTUAL_ENV=$(abspath $(VENV)) $(VENV)/bin/maturin develop --release --quiet
	touch $@

setup: $(EXT_STAMP)

demo: setup
	$(VENV)/bin/strata demo

test: test-rust test-python

test-rust: setup
	cargo test --workspace --exclude strata-py --quiet

test-python: setup
	$(PY) -m pytest -q

lint: setup
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	$(VENV)/bin/ruff check python tests benches
	$(VENV)/bin/ruff format --check python tests benches

fmt: setup
	cargo fmt --all
	$(VENV)/bin/ruff format python tests benches
	$(VENV)/bin/ruff check --fix python tests benches

bench: setup
	$(PY) benches/run.py

clean:
	rm -rf $(VENV) target python/strata/*.so
