"""Question: does this machine read files straight into GPU memory by GPUDirect Storage, and how
fast? The GNN device path reads its cache misses through kvikio only where kvikio reads through
cuFile (not its compatibility mode, which goes through host memory); this says which, and why.

    python benches/gds_probe.py --dir DIR [--size-mib 1024] [--request-mib 16]

Prints one JSON object: whether the nvidia-fs kernel module is loaded (cuFile's GPUDirect path
needs it), kvikio's version or why it does not import, the reason kvikio would read a file in
DIR in its compatibility mode (None: through cuFile), and, on a GPU with kvikio, a file of
``--size-mib`` read cold (its pages dropped from the page cache) into device memory in requests
of ``--request-mib``, all in flight at once: GB/s, and whether the bytes landed intact.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

MIB = 1 << 20


def cold_file(path: Path, size: int) -> bytes:
    """Writes ``size`` pseudo-random bytes to ``path``, synced and dropped from the page cache
    (a clean page is dropped by ``POSIX_FADV_DONTNEED``), so a read reaches the disk; returns
    its first MiB to check a read against."""
    block = os.urandom(MIB)
    with path.open("wb") as f:
        for _ in range(size // MIB):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    return block


def read_cold(kvikio, torch, path: Path, size: int, request: int, block: bytes) -> dict:
    """``path`` read into device memory by kvikio, ``request`` bytes a ``pread``, all in
    flight at once: seconds, GB/s and whether every MiB equals ``block``."""
    buf = torch.empty(size, dtype=torch.uint8, device="cuda")
    handle = kvikio.CuFile(str(path), "r")
    try:
        start = time.perf_counter()
        futures = [handle.pread(buf[at : at + request], request, at) for at in range(0, size, request)]
        for f in futures:
            f.get()
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    finally:
        handle.close()
    expected = torch.frombuffer(bytearray(block), dtype=torch.uint8).to("cuda")
    intact = bool((buf.view(-1, MIB) == expected).all())
    return {"seconds": seconds, "gb_per_second": size / seconds / 1e9, "intact": intact}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", type=Path, required=True, help="a folder on the disk the runs read")
    p.add_argument("--size-mib", type=int, default=1024, help="the file read cold, MiB")
    p.add_argument("--request-mib", type=int, default=16, help="bytes a pread, MiB")
    args = p.parse_args()
    out: dict = {"nvidia_fs": os.path.exists("/proc/driver/nvidia-fs")}
    try:
        import kvikio
    except ImportError as e:
        out["kvikio"] = f"does not import ({e})"
        print(json.dumps(out))
        return 0
    out["kvikio"] = getattr(kvikio, "__version__", "unknown version")
    import torch

    from strata.device.gds import compat_mode_reason

    args.dir.mkdir(parents=True, exist_ok=True)
    path = args.dir / "gds-probe.bin"
    size, request = args.size_mib * MIB, args.request_mib * MIB
    try:
        block = cold_file(path, size)
        handle = kvikio.CuFile(str(path), "r")
        out["compat_mode"] = compat_mode_reason(kvikio, handle)
        handle.close()
        if torch.cuda.is_available():
            out["read"] = read_cold(kvikio, torch, path, size, request, block)
    except Exception as e:  # the probe reports; a session's next step still runs
        out["error"] = f"{type(e).__name__}: {e}"
    finally:
        path.unlink(missing_ok=True)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
