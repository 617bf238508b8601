"""`make bench`: runs every benchmark in this folder with its default (full) size."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

if __name__ == "__main__":
    scripts = sorted(HERE.glob("bench_*.py"))
    for script in scripts:
        print(f"== {script.name}", flush=True)
        subprocess.run([sys.executable, str(script), *sys.argv[1:]], check=True)
