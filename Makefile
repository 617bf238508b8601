# The two commands a newcomer needs: `make demo` and `make test`. Both set everything up:
# a virtualenv in .venv, the Python dependencies, and the Rust extension (release build).

SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
export PYO3_PYTHON := $(abspath $(PY))
export CARGO_TERM_COLOR ?= never

RUST_SOURCES := Cargo.toml $(shell find crates -name '*.rs' -o -name Cargo.toml) $(shell find proto -name '*.proto')
# What each target installs is named in pyproject.toml, and only there: the project's own
# dependencies plus the extras listed here. A stamp is named after its extras and depends on
# pyproject.toml, so a changed list, or a target that needs more extras, installs again.
SETUP_EXTRAS := dev
TEST_EXTRAS := dev+torch+pyg+parquet+ann+hdf5+search
SETUP_STAMP := $(VENV)/.deps-$(SETUP_EXTRAS)
TEST_STAMP := $(VENV)/.deps-$(TEST_EXTRAS)
EXT_STAMP := $(VENV)/.extension-built

.PHONY: setup setup-test demo test test-rust test-rust-logged test-python lint fmt bench wheel clean

$(PY):
	python3 -m venv $(VENV)

$(VENV)/.deps-%: pyproject.toml | $(PY)
	$(PY) -m pip install -q --upgrade pip
	$(PY) tools/requirements.py $* > $@.txt
	$(PY) -m pip install -q -r $@.txt
	touch $@

# The package's bytecode is compiled once here: where PYTHONDONTWRITEBYTECODE is set, every
# `strata` process (the tests start hundreds) would otherwise compile it again, about 0.07 CPU s each.
$(EXT_STAMP): $(SETUP_STAMP) $(RUST_SOURCES) pyproject.toml
	VIRTUAL_ENV=$(abspath $(VENV)) $(VENV)/bin/maturin develop --release --quiet
	$(PY) -m compileall -q python/strata
	touch $@

setup: $(EXT_STAMP)

# The tests need every optional dependency (torch and torch_geometric for the GNN and PyG
# tests): a few GB on a first run, installed once.
# Peers the tests check Strata's interchange against, installed apart from the venv's packages
# (PyTorch-BigGraph pins an old torch; its checkpoint code runs with ours; it imports pkg_resources,
# which setuptools 81 dropped): tests add the folder.
PEERS := $(VENV)/peers
PEERS_STAMP := $(PEERS)/.installed
$(PEERS_STAMP): $(TEST_STAMP)
	$(PY) -m pip install -q --no-deps --target $(PEERS) torchbiggraph==1.0.0 "setuptools<81"
	touch $@

setup-test: $(EXT_STAMP) $(TEST_STAMP) $(PEERS_STAMP)

demo: setup
	$(VENV)/bin/strata demo

# The two halves run side by side (`make -j2 -k`: each half runs to its end whatever the other
# does): pytest on two workers, and the Rust tests at the idle CPU priority (test-rust), so they take
# the cycles pytest leaves idle (a worker waiting on a rendezvous or a timeout, the last worker's
# tail) and the whole machine once pytest is done, without slowing pytest's torchrun groups. The
# Rust half needs no Python package: it compiles while the test extras install. pytest's output
# streams; the Rust tests' is kept in RUST_TEST_LOG and printed after it. The measurement
# docs/benchmarks.md ("Test suite") asks for, on a fresh clone after `make demo`: `time make test`
# (and the halves one after another: `time make test-rust test-python`).
RUST_TEST_LOG := target/test-rust.log
test:
	@mkdir -p target
	@echo "The Rust tests run beside pytest; their output ($(RUST_TEST_LOG)) follows pytest's."
	@$(MAKE) --no-print-directory -j2 -k test-rust-logged test-python; status=$$?; \
	cat $(RUST_TEST_LOG); exit $$status

test-rust-logged:
	@$(MAKE) --no-print-directory test-rust > $(RUST_TEST_LOG) 2>&1

# One installer at a time into the virtualenv, whatever -j make runs with (`make test` runs two).
$(TEST_STAMP): | $(EXT_STAMP)

# The Rust tests compile the workspace a second time, in the test profile (the release build's
# rlibs hold LTO bitcode only, nothing a test binary can link; `cargo test --release` would reuse
# most of its dependencies, but compiles the tests at opt-level 3 and links every test binary and
# example with thin LTO: docs/benchmarks.md, "Test suite", did not adopt it): Cargo.toml's [profile.test]
# compiles the dependencies unoptimised without debug info, and each crate's integration tests
# are one binary. Not incremental: a fresh clone compiles each crate once, and incremental
# state (more, smaller codegen units and their caches) would only cost. MAKEFLAGS is emptied:
# under `make test` this half gets no jobserver descriptors, and build scripts that find
# MAKEFLAGS naming them warn that the build environment is misconfigured.
# The unit and integration tests only (`--lib --tests`): no examples, which `make lint`'s clippy
# --all-targets compiles, and no doc tests, which would build every library a second time
# outside the test harness (about 170 CPU s) for the crate docs' one example, whose calls
# strata-farmem's round-trip tests run.
# SCHED_IDLE (chrt --idle): the Rust half takes only the cycles pytest leaves idle; nice 10 still
# took about a tenth of each busy core from pytest's workers and ranks. tools/rust_tests.py runs
# the test binaries side by side once they are built (`cargo test` runs them one at a time, and
# each ends with its slowest test): 49 s instead of 69 s for all of them.
RUST_TESTS := --workspace --exclude strata-py
IDLE := $(shell chrt --idle 0 true 2>/dev/null && echo chrt --idle 0 || echo nice -n 19)
test-rust:
	MAKEFLAGS= CARGO_INCREMENTAL=0 $(IDLE) python3 tools/rust_tests.py $(RUST_TESTS) --lib --tests --quiet

# pytest-xdist workers, one a core; tests/conftest.py puts the heavy tests into two groups, each
# run one test after another on one worker: torchrun groups and namespaces in one, memory limits
# and the wheel in the other. A test joins a group by what it runs, not by its file alone.
PYTEST_WORKERS ?= 2
test-python: setup-test
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup

lint: setup
	$(PY) tools/check_layers.py
	$(PY) tools/check_cycles.py
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	$(VENV)/bin/ruff check python tests benches tools examples
	$(VENV)/bin/ruff format --check python tests benches tools examples

fmt: setup
	cargo fmt --all
	$(VENV)/bin/ruff format python tests benches tools examples
	$(VENV)/bin/ruff check --fix python tests benches tools examples

# One abi3 wheel (CPython 3.11+) in .whl/, the file `pip install` takes; tests/test_wheel.py
# installs it into a fresh virtualenv and runs it outside the source tree.
wheel: setup
	rm -rf .whl
	VIRTUAL_ENV=$(abspath $(VENV)) $(VENV)/bin/maturin build --release --quiet --out .whl

bench: setup
	$(PY) benches/run.py

clean:
	rm -rf $(VENV) target .whl python/strata/*.so
