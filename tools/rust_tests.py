"""Compiles the workspace's Rust tests and runs their binaries side by side.

    python3 tools/rust_tests.py [CARGO TEST ARGUMENTS]

`cargo test` runs its test binaries one after another, and a binary ends with its slowest
test: strata-grid's tests spend most of their time in the kernel (threads handing small
passes to each other), strata-embed's on one or two long trainings, and the cores idle in
between. Here every binary starts at once, each in its package's directory as cargo would run
it; each output is printed whole once its binary ends, in the order cargo built them. Standard library only: this
half of `make test` needs no virtualenv.

Exit status: cargo's if the build fails, else 1 if any binary failed, else 0.
"""

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple


class TestBinary(NamedTuple):
    name: str
    executable: str
    package_dir: Path


def build(cargo_args: list[str]) -> tuple[int, list[TestBinary]]:
    """Runs `cargo test ARGS --no-run`; returns its exit status and the test binaries it built.

    Compiler diagnostics go to stderr as cargo renders them; the JSON messages only name the
    artifacts.
    """
    cmd = ["cargo", "test", *cargo_args, "--no-run", "--message-format=json-render-diagnostics"]
    binaries = []
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) as cargo:
        for line in cargo.stdout:
            msg = json.loads(line)
            if msg.get("reason") == "compiler-artifact" and msg.get("executable") and msg["profile"]["test"]:
                target = msg["target"]
                name = f"{target['name']} ({'/'.join(target['kind'])})"
                binaries.append(TestBinary(name, msg["executable"], Path(msg["manifest_path"]).parent))
    return cargo.returncode, binaries


def run_all(binaries: list[TestBinary], harness_args: list[str]) -> list[str]:
    """Starts every binary at once, then prints each one's output whole, in `binaries` order.

    Each output goes to a file of its own (a pipe would stall a binary that prints more than
    the pipe holds while an earlier one is still being waited for). Returns the names of the
    binaries that failed.
    """
    outputs = [tempfile.TemporaryFile("w+") for _ in binaries]
    running = [
        subprocess.Popen([b.executable, *harness_args], cwd=b.package_dir, stdout=out, stderr=subprocess.STDOUT)
        for b, out in zip(binaries, outputs, strict=True)
    ]
    failed = []
    for binary, proc, out in zip(binaries, running, outputs, strict=True):
        proc.wait()
        out.seek(0)
        print(f"     Running {binary.name}: {binary.executable}", flush=True)
        print(out.read(), end="", flush=True)
        out.close()
        if proc.returncode != 0:
            failed.append(binary.name)
    return failed


def main(argv: list[str]) -> int:
    status, binaries = build(argv)
    if status != 0:
        return status
    quiet = ["--quiet"] if "--quiet" in argv or "-q" in argv else []
    failed = run_all(binaries, quiet)
    if failed:
        print(f"error: {len(failed)} test binaries failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    print(f"{len(binaries)} test binaries passed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
