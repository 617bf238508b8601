"""Prints the profiles a bench's JSON holds (``common.profiled``'s rows, wherever they sit in it)
as short tables, most time first: for a GPU session's log, which comes back as text.

    python benches/show_profile.py RESULT.json [--top 12]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def profiles(node, path: str = ""):
    """Every ``profile`` list in ``node`` with the path of keys to it."""
    if isinstance(node, dict):
        for key, value in node.items():
            where = f"{path}/{key}" if path else key
            if key == "profile" and isinstance(value, list):
                yield path, value
            else:
                yield from profiles(value, where)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("result", type=Path)
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    for path, rows in profiles(json.loads(args.result.read_text())):
        print(f"{path}: per unit, device µs / host µs / calls")
        for row in rows[: args.top]:
            print(f"  {row['device_us']:9.1f} {row['host_us']:9.1f} {row['calls']:6.1f}  {row['name'][:90]}")


if __name__ == "__main__":
    main()
