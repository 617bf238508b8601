#!/usr/bin/env bash
# Prepares what benches/gpu_session.sh needs on a lent GPU machine, which has no Rust toolchain,
# no registry and no ../shared: the extension (abi3, built here by `make setup`, its debug info
# stripped: 87 MB to 16 MB) and the two knowledge-graph datasets, in .devcarry/ (git-ignored).
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
for d in fb15k-237 wn18rr; do
    if [ ! -f "../shared/datasets/$d/train.txt" ]; then
        echo "gpu_prepare.sh: ../shared/datasets/$d/train.txt is missing" >&2
        exit 2
    fi
done
rm -rf .devcarry
mkdir -p .devcarry/datasets
strip --strip-debug -o .devcarry/_native.abi3.so "$so"
cp -r ../shared/datasets/fb15k-237 ../shared/datasets/wn18rr .devcarry/datasets/
du -sh .devcarry
