#!/usr/bin/env bash
# Builds PyG's sampler backend for the lent GPU machine, so that the `pyg` figures of
# benches/bench_gnn_device.py can run PyG's NeighborLoader there. PyG 2.8 samples through pyg-lib
# or torch-sparse; the machine's image has neither, and no registry serves a wheel of either for
# its torch (2.11.0). torch-sparse and torch-scatter build from their PyPI sources against that
# torch, CPU only (NeighborLoader samples on the CPU), in about 20 minutes on 2 cores.
#
#     bash benches/gpu_pyg_ext.sh        (wheels in target/pyg-ext/wheels; once)
#     bash benches/gpu_prepare.sh        (unpacks them into .devcarry/pyg, with their debug info stripped)
#
# Their compiled ops are plain shared libraries that torch.ops.load_library opens (no Python
# module init; files named `_NAME_cpu.so`, which any CPython's import machinery finds), so a
# build made here with CPython 3.11 for torch 2.11.0 is meant to load under the machine's 3.12
# and the same torch; gpu_session.sh's `pyg` figure records the import error if it does not.
set -eu
cd "$(dirname "$0")/.."
TORCH=${TORCH:-2.11.0}
BUILD=${BUILD:-target/pyg-ext}
mkdir -p "$BUILD"
if [ ! -x "$BUILD/venv/bin/python" ]; then
    python3 -m venv "$BUILD/venv"
fi
# torch's CUDA wheel (PyPI's) imports only with its CUDA libraries beside it: a few GB, here only.
"$BUILD/venv/bin/pip" install -q "torch==$TORCH" numpy setuptools wheel ninja
FORCE_ONLY_CPU=1 MAX_JOBS=${MAX_JOBS:-2} "$BUILD/venv/bin/pip" wheel -q --no-deps --no-build-isolation \
    torch-scatter==2.1.2 torch-sparse==0.6.18 -w "$BUILD/wheels"
ls -la "$BUILD/wheels"
