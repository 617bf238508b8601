#!/usr/bin/env bash
# Prepares what benches/gpu_session.sh needs on a lent GPU machine, which has no Rust toolchain,
# no registry and no ../shared: the extension (abi3, built here by `make setup`, its debug info
# stripped: 87 MB to 16 MB), the two knowledge-graph datasets and Planetoid (Cora and CiteSeer, which
# the GNN tests use), in .devcarry/ (git-ignored).
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
du -sh .devcarry
