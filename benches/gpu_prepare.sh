#!/usr/bin/env bash
# Prepares what benches/gpu_session.sh needs on a lent GPU machine, which has no Rust toolchain,
# no registry and no ../shared: the extension (abi3, built here by `make setup`, its debug info
# stripped: 87 MB to 16 MB), the two knowledge-graph datasets and Planetoid (Cora and CiteSeer, which
# the GNN tests use) in one archive, kvikio, and PyG's sampler backend where benches/gpu_pyg_ext.sh built it, in
# .devcarry/ (git-ignored).
# The machine's working tree travels with a 64 MiB limit; this prints what .devcarry/ adds.
#
#     bash benches/gpu_prepare.sh
#     then, through the device tool: run(command="bash benches/gpu_session.sh env tests ...",
#                                       carry=[".devcarry"])
set -eu
cd "$(dirname "$0")/.."
so=python/strata/_native.abi3.so
if [ ! -f "$so" ]; then
    echo "gpu_prepare.sh: $so is missing; run \`make setup\` first" >&2
    exit 2
fi
for d in fb15k-237/train.txt wn18rr/train.txt planetoid/ind.cora.x; do
    if [ ! -f "../shared/datasets/$d" ]; then
        echo "gpu_prepare.sh: ../shared/datasets/$d is missing" >&2
        exit 2
    fi
done
rm -rf .devcarry
mkdir -p .devcarry
strip --strip-debug -o .devcarry/_native.abi3.so "$so"
# Compressed: 28 MB of text to 5 (the carry's limit holds the working tree too).
tar -czf .devcarry/datasets.tgz -C ../shared/datasets fb15k-237 wn18rr planetoid
# PyG's sampler backend, where benches/gpu_pyg_ext.sh built it: unpacked for PYTHONPATH.
wheels=${PYG_WHEELS:-target/pyg-ext/wheels}
if ls "$wheels"/torch_s*.whl > /dev/null 2>&1; then
    for w in "$wheels"/torch_s*.whl; do
        python3 -m zipfile -e "$w" .devcarry/pyg
    done
    find .devcarry/pyg -name '*.so' -exec strip --strip-debug {} \;
else
    echo "gpu_prepare.sh: no PyG sampler backend in $wheels (bash benches/gpu_pyg_ext.sh builds it); PyG's figures will be skipped"
fi
# kvikio (GPUDirect Storage through cuFile) for the machine's Python 3.12 and CUDA 13, with the
# two wheels it needs that the machine's image lacks (its cupy and cuFile library are there):
# downloaded once into KVIKIO_WHEELS (default target/kvikio-wheels), unpacked for PYTHONPATH.
# The env step says whether cuFile reads there or kvikio falls back to its compatibility mode.
kv=${KVIKIO_WHEELS:-target/kvikio-wheels}
if ! ls "$kv"/kvikio_cu13-*.whl > /dev/null 2>&1; then
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
        --platform manylinux_2_17_x86_64 -d "$kv" "kvikio-cu13==26.10.*" "libkvikio-cu13==26.10.*" "rapids-logger==0.3.*" ||
        echo "gpu_prepare.sh: kvikio's wheels could not be downloaded; the GPU runs will say kvikio does not import"
fi
if ls "$kv"/kvikio_cu13-*.whl > /dev/null 2>&1; then
    for w in "$kv"/*.whl; do
        python3 -m zipfile -e "$w" .devcarry/kvikio
    done
fi
# PyTorch-BigGraph's GitHub main (PBG_SRC, default target/pbg-src: `git clone
# https://github.com/facebookresearch/PyTorch-BigGraph target/pbg-src`), for its GPU trainer, and
# the pkg_resources it imports (setuptools 81 dropped it; the peers' older one, with its vendored
# packages).
pbg=${PBG_SRC:-target/pbg-src}
if [ -f "$pbg/torchbiggraph/train_gpu.py" ]; then
    mkdir -p .devcarry/pbg .devcarry/pbg-deps/setuptools
    cp -r "$pbg/torchbiggraph" "$pbg/setup.py" "$pbg/setup.cfg" .devcarry/pbg/
    cp -r .venv/peers/pkg_resources .devcarry/pbg-deps/
    cp -r .venv/peers/setuptools/_vendor .devcarry/pbg-deps/setuptools/
else
    echo "gpu_prepare.sh: no PyTorch-BigGraph source in $pbg (PBG_SRC); the embed-pbg step will fail"
fi
du -sh .devcarry
