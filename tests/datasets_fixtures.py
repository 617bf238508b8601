"""Helpers of tests/test_datasets.py: a local HTTP file server and small datasets in the real layouts."""

from __future__ import annotations

import gzip
import io
import re
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

import numpy as np


class FileServer:
    """Serves the files under ``root`` on 127.0.0.1 (``GET /N/F`` -> ``root/N/F``), with ``Range:
    bytes=N-`` support. Records every request; can drop the first transfer of a path after some
    bytes (``cut``) or ignore ranges for a path (``no_range``)."""

    def __init__(self, root: Path):
        self.root = root
        self.requests: list[tuple[str, str | None]] = []
        self.cut: dict[str, int] = {}
        self.no_range: set[str] = set()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.files = self
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def ranges(self, path: str) -> list[str | None]:
        """The Range headers of the requests for ``path``, in order (None for plain GETs)."""
        return [r for p, r in self.requests if p == path]

    def __enter__(self) -> FileServer:
        self.thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join()


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *_args) -> None:
        pass

    def do_GET(self) -> None:
        files: FileServer = self.server.files
        asked = self.headers.get("Range")
        files.requests.append((self.path, asked))
        path = files.root / unquote(self.path.lstrip("/"))
        if not path.is_file():
            self.send_error(404, "Not Found")
            return
        data = path.read_bytes()
        start = 0
        m = re.fullmatch(r"bytes=(\d+)-", asked or "")
        if m and self.path not in files.no_range:
            start = int(m.group(1))
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        body = data[start:]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        cut = files.cut.pop(self.path, None)
        self.wfile.write(body if cut is None else body[:cut])
        self.close_connection = True


def write_zip(path: Path, members: dict[str, bytes]) -> Path:
    """A zip archive of ``members`` (name -> content)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def gz(data: bytes) -> bytes:
    return gzip.compress(data, mtime=0)


def kg_zip(src: Path, folder: str, path: Path) -> Path:
    """The DGL-KE archive layout: ``folder/{train,valid,test}.txt`` plus ``entities.dict`` and
    ``relations.dict`` (``id<TAB>name``), built from ``src/{train,valid,test}.txt``."""
    splits = {s: (src / f"{s}.txt").read_bytes() for s in ("train", "valid", "test")}
    entities: dict[bytes, None] = {}
    relations: dict[bytes, None] = {}
    for data in splits.values():
        for line in data.splitlines():
            h, r, t = line.split(b"\t")
            entities.update({h: None, t: None})
            relations[r] = None
    members = {f"{folder}/{s}.txt": data for s, data in splits.items()}
    for name, table in (("entities.dict", entities), ("relations.dict", relations)):
        members[f"{folder}/{name}"] = b"".join(b"%d\t%s\n" % (i, n) for i, n in enumerate(table))
    return write_zip(path, members)


def csv_lines(rows) -> bytes:
    return b"".join((",".join(map(str, row)) + "\n").encode() for row in rows)


def ogb_arrays(num_nodes: int = 40, num_edges: int = 150, dim: int = 5, classes: int = 4, seed: int = 0) -> dict:
    """A tiny node-classification graph: edges (E, 2), float32 features, labels, disjoint splits."""
    rng = np.random.default_rng(seed)
    perm = rng.permutation(num_nodes)
    return {
        "num_nodes": num_nodes,
        "edges": rng.integers(0, num_nodes, size=(num_edges, 2)),
        "features": rng.standard_normal((num_nodes, dim)).astype(np.float32),
        "labels": rng.integers(0, classes, size=num_nodes),
        "train": np.sort(perm[: num_nodes // 2]),
        "valid": np.sort(perm[num_nodes // 2 : 3 * num_nodes // 4]),
        "test": np.sort(perm[3 * num_nodes // 4 :]),
    }


def ogb_csv_zip(path: Path, folder: str, split: str, a: dict) -> Path:
    """An OGB CSV zip (ogbn-arxiv / ogbn-products layout) holding the arrays ``a``."""
    members = {
        f"{folder}/raw/edge.csv.gz": gz(csv_lines(a["edges"])),
        # repr of a float32 parses back to the same float32.
        f"{folder}/raw/node-feat.csv.gz": gz(csv_lines([[repr(float(v)) for v in row] for row in a["features"]])),
        f"{folder}/raw/node-label.csv.gz": gz(csv_lines([[v] for v in a["labels"]])),
        f"{folder}/raw/num-node-list.csv.gz": gz(b"%d\n" % a["num_nodes"]),
        f"{folder}/raw/num-edge-list.csv.gz": gz(b"%d\n" % len(a["edges"])),
        f"{folder}/RELEASE_v1.txt": b"",
        f"{folder}/mapping/README.md": b"mapping\n",
    }
    for s in ("train", "valid", "test"):
        members[f"{folder}/split/{split}/{s}.csv.gz"] = gz(csv_lines([[v] for v in a[s]]))
    return write_zip(path, members)


def npz_bytes(compressed: bool, **arrays) -> bytes:
    buf = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buf, **arrays)
    return buf.getvalue()


def ogb_npz_zip(path: Path, folder: str, a: dict, label_values: np.ndarray, compressed: bool) -> Path:
    """An OGB binary zip (ogbn-papers100M layout): ``raw/data.npz``, ``raw/node-label.npz``, splits."""
    data = npz_bytes(
        compressed,
        edge_index=a["edges"].T.copy(),
        node_feat=a["features"],
        node_year=np.full((a["num_nodes"], 1), 2020),
        num_nodes_list=np.array([a["num_nodes"]]),
        num_edges_list=np.array([len(a["edges"])]),
    )
    members = {
        f"{folder}/raw/data.npz": data,
        f"{folder}/raw/node-label.npz": npz_bytes(compressed, node_label=label_values.reshape(-1, 1)),
    }
    for s in ("train", "valid", "test"):
        members[f"{folder}/split/time/{s}.csv.gz"] = gz(csv_lines([[v] for v in a[s]]))
    return write_zip(path, members)
