#!/usr/bin/env bash
# Prepares what benches/gpu_session.sh needs on a lent GPU machine, which has no Rust toolchain,
# no registry and no ../shared: the extension (abi3, built here by `make setup`, its debug info
# stripped: 87 MB to 16 MB), the two knowledge-graph datasets and Planetoid (Cora and CiteSeer, which
# the GNN tests use), and PyG's sampler backend where benches/gpu_pyg_ext.sh built it, in
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
mkdir -p .devcarry/datasets
strip --strip-debug -o .devcarry/_native.abi3.so "$so"
cp -r ../shared/datasets/fb15k-237 ../shared/datasets/wn18rr ../shared/datasets/planetoid .devcarry/datasets/
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
