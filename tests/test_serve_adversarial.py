"""``strata serve`` against a hostile client: every RPC that names a server path (stores,
embedding runs, model files) or sends data to be parsed (model bytes) gets out-of-root paths
(absolute, ``..``, a symlink leading out, /etc/passwd), special files (/dev/zero, a FIFO, a
directory), oversized and malformed files and compressed bombs. The server runs under a memory
cgroup of its ``--memory`` plus a fixed overhead, so one unbounded read or inflate kills it;
each call must get a clear status whose message names what was wrong, never the file's bytes,
and the server must keep answering.

The files are small (a bomb is a few hundred KB of deflated zeros; the oversized file is
sparse), so the module runs in seconds."""

from __future__ import annotations

import io
import json
import os
import re
import zipfile
from pathlib import Path

import pytest

from conftest import symmetric_sbm_store
from serve_process import Server, serving
from strata.serve.client import ServiceError
from test_serve import numpy_sage

#: The server's budget: small, so that any file read whole or any bomb inflated whole is far
#: over the cgroup's limit.
MEMORY = 64 << 20
#: What the process holds besides --memory (as in test_serve_memory.py): the interpreter with
#: NumPy and the extension (about 60 MB of code and data) and the allocator's slack.
OVERHEAD = 96 << 20
#: What every bomb inflates to: several times the whole cgroup limit.
BOMB_BYTES = 512 << 20
#: The first 8 bytes of /etc/passwd read as the little-endian header length of a safetensors
#: file: what the server used to echo.
PASSWD = b"root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A data root holding a store, a model and hostile files; a store and a model outside it."""
    d = tmp_path_factory.mktemp("adversarial")
    root, outside = d / "root", d / "outside"
    root.mkdir()
    outside.mkdir()
    store = symmetric_sbm_store(root, nodes=200, classes=3, dim=8, avg_degree=4)
    outer_store = symmetric_sbm_store(outside, nodes=200, classes=3, dim=8, avg_degree=4)
    numpy_sage(root / "good.npz", in_dim=8, out_dim=3)
    numpy_sage(outside / "secret.npz", in_dim=8, out_dim=3)
    (root / "link-out").symlink_to(outside)
    (root / "zero.safetensors").symlink_to("/dev/zero")
    os.mkfifo(root / "fifo.safetensors")
    (root / "dir.safetensors").mkdir()
    (root / "sub").mkdir()
    (root / "passwd").write_bytes(PASSWD)
    with open(root / "sparse.safetensors", "wb") as f:  # 4 GiB, no blocks on disk
        f.truncate(4 << 30)
    (root / "bomb.npz").write_bytes(npz_bomb())
    (root / "liar.npz").write_bytes(npz_bomb(declared=1000))
    return {"root": root, "outside": outside, "store": store, "outer_store": outer_store, "d": d}


@pytest.fixture(scope="module")
def server(files, limiter):
    """A server under a cgroup of --memory + OVERHEAD, rooted at the data root and at /dev (so
    that /dev/zero passes the root check and must be refused as a special file)."""
    args = ["--memory", MEMORY, "--data-root", files["root"], "--data-root", "/dev", "--fold-after", "3600"]
    s = Server(files["d"] / "state", *args, wrap=[limiter, MEMORY + OVERHEAD])
    yield s
    s.kill()


@pytest.fixture
def c(server):
    with server.client(timeout=60) as client:
        yield client
    # The server survived whatever the test sent, and still answers.
    assert server.proc.poll() is None, f"the server died:\n{server.stderr}"


def npy_header(shape: tuple[int, ...], descr: str = "<f4") -> bytes:
    """A version-1 ``.npy`` header for an array of ``shape``."""
    text = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape!r}, }}"
    text += " " * (63 - (10 + len(text)) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text.encode()


def npz_bomb(declared: int | None = None, total: int = BOMB_BYTES) -> bytes:
    """An npz whose one member (a float32 array of zeros, its header honest) inflates to
    ``total`` bytes from a few hundred KB. With ``declared``, the zip's size fields claim that
    many uncompressed bytes instead (a liar: the inflater must not trust them)."""
    buf = io.BytesIO()
    chunk = bytes(1 << 20)
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        with z.open("w.npy", "w", force_zip64=True) as m:
            header = npy_header(((total - 128) // 4,))
            m.write(header)
            left = total - len(header)
            while left > 0:
                m.write(chunk[: min(left, len(chunk))])
                left -= len(chunk)
    data = bytearray(buf.getvalue())
    if declared is not None:
        # The local header's zip64 extra field holds the uncompressed size as a u64 (its own
        # field says 0xFFFFFFFF); the central directory entry holds it at byte 24 as a u32.
        at = data.find(total.to_bytes(8, "little"))
        data[at : at + 8] = declared.to_bytes(8, "little")
        at = data.rfind(b"PK\x01\x02") + 24
        assert data[at : at + 4] == total.to_bytes(4, "little")
        data[at : at + 4] = declared.to_bytes(4, "little")
    return bytes(data)


def refused(fn, *args, **kw) -> ServiceError:
    with pytest.raises(ServiceError) as e:
        fn(*args, **kw)
    return e.value


def assert_no_bytes(e: ServiceError, *secrets: bytes) -> None:
    """``e``'s message holds none of ``secrets`` (file contents), as text or as the integer its
    first 8 bytes make."""
    for s in secrets:
        assert s[:8].decode(errors="replace") not in e.message, e
        assert str(int.from_bytes(s[:8], "little")) not in e.message, e


def out_of_root_paths(files) -> dict[str, Path | str]:
    root, outside = files["root"], files["outside"]
    return {
        "absolute": files["outer_store"],
        "dotdot": root / ".." / "outside" / "sbm.strata",
        "symlink": root / "link-out" / "sbm.strata",
        "passwd": "/etc/passwd",
        "missing": "/etc/no-such-file-here",
        "missing-outside": outside / "nothing",
        "relative": "../outside/sbm.strata",
    }


def same_refusal(errors: dict[str, tuple[ServiceError, str]]) -> None:
    """Every refusal is PERMISSION_DENIED and reads the same once the path the client sent is
    taken out, so it tells nothing of whether the path exists."""
    texts = set()
    for what, (e, sent) in errors.items():
        assert e.code == "PERMISSION_DENIED", (what, e)
        assert sent in e.message and "data root" in e.message, (what, e)
        texts.add(e.message.replace(sent, "PATH"))
    assert len(texts) == 1, texts


def test_graphs_are_registered_only_under_a_data_root(c, files):
    errors = {}
    for what, path in out_of_root_paths(files).items():
        errors[what] = (refused(c.register_graph, f"g-{what}", path), str(path))
    same_refusal(errors)
    assert_no_bytes(errors["passwd"][0], PASSWD)
    # A store under the root registers, named by a path with `..` that stays inside.
    info = c.register_graph("inside", files["root"] / "sub" / ".." / "sbm.strata", reorder=False)
    assert info["num_nodes"] == 200
    c.unregister_graph("inside")


def test_embedding_runs_are_registered_only_under_a_data_root(c, files):
    errors = {}
    for what, path in out_of_root_paths(files).items():
        errors[what] = (refused(c.register_embedding, f"e-{what}", path), str(path))
    same_refusal(errors)
    # Under the root, a directory that is not a run is named as such.
    e = refused(c.register_embedding, "e", files["store"])
    assert e.code == "NOT_FOUND" and "run.json" in e.message, e


def test_model_files_are_read_only_under_a_data_root(c, files):
    paths = out_of_root_paths(files)
    paths["secret"] = files["outside"] / "secret.npz"
    paths["symlink"] = files["root"] / "link-out" / "secret.npz"
    errors = {}
    for what, path in paths.items():
        errors[what] = (refused(c.register_model, f"m-{what}", path, upload=False, format="safetensors"), str(path))
    same_refusal(errors)
    assert_no_bytes(errors["passwd"][0], PASSWD)
    assert c.register_model("good", files["root"] / "good.npz", upload=False)["parameters"] > 0
    c.unregister_model("good")


@pytest.mark.parametrize("name", ["fifo.safetensors", "dir.safetensors", "zero.safetensors", "/dev/zero"])
def test_special_files_are_refused_before_any_read(c, files, name):
    # zero.safetensors links to /dev/zero, which is under the root /dev: it passes the root
    # check and must be refused as what it is.
    path = name if name.startswith("/") else files["root"] / name
    e = refused(c.register_model, "special", path, upload=False, format="safetensors")
    assert e.code == "INVALID_ARGUMENT" and f"{path} is not a regular file" in e.message, e


def test_an_oversized_model_file_is_refused_before_it_is_read(c, files):
    e = refused(c.register_model, "big", files["root"] / "sparse.safetensors", upload=False)
    assert e.code == "RESOURCE_EXHAUSTED", e
    assert str(4 << 30) in e.message and "--memory" in e.message, e


def test_a_file_that_is_not_a_model_is_refused_without_echoing_it(c, files):
    for fmt in ("safetensors", "npz"):
        e = refused(c.register_model, "passwd", files["root"] / "passwd", upload=False, format=fmt)
        assert e.code == "INVALID_ARGUMENT" and "passwd" in e.message, e
        assert_no_bytes(e, PASSWD)
        e = refused(c._call, "ModelRegister", name="passwd", data=PASSWD, format=fmt)
        assert e.code == "INVALID_ARGUMENT", e
        assert_no_bytes(e, PASSWD)


def safetensors(header: dict, data: bytes = b"") -> bytes:
    text = json.dumps(header).encode()
    return len(text).to_bytes(8, "little") + text + data


@pytest.mark.parametrize(
    "blob, code, words",
    [
        # A header length far past the end of the file.
        ((1 << 62).to_bytes(8, "little") + b"{}", "INVALID_ARGUMENT", "header length"),
        # A tensor whose shape is over the budget, its offsets honest about it.
        (safetensors({"w": {"dtype": "F16", "shape": [1 << 30], "data_offsets": [0, 2 << 30]}}),
         "INVALID_ARGUMENT", "tensor w"),
        # Header values that are not what a tensor entry holds: not echoed.
        (safetensors({"w": {"dtype": "root:x:0:0", "shape": [1], "data_offsets": [0, 4]}}, bytes(4)),
         "INVALID_ARGUMENT", "unsupported dtype"),
        (safetensors({"w": "root:x:0:0"}), "INVALID_ARGUMENT", "tensor w"),
        (b"PK\x03\x04" + bytes(100), "INVALID_ARGUMENT", "npz"),
        (npz_bomb(total=4 << 20)[:-40], "INVALID_ARGUMENT", "npz"),
    ],
    ids=["header-length", "huge-tensor", "bad-dtype", "bad-entry", "zip-junk", "zip-cut"],
)  # fmt: skip
def test_malformed_uploads_get_clear_statuses(c, blob, code, words):
    e = refused(c._call, "ModelRegister", name="bad", data=blob)
    assert e.code == code and words in e.message, e
    assert_no_bytes(e, b"root:x:0:0")
    assert str(1 << 62) not in e.message, e


@pytest.mark.parametrize("declared", [None, 1000], ids=["honest", "lying-sizes"])
def test_compressed_bombs_are_refused_within_the_budget(c, files, declared):
    path = files["root"] / ("bomb.npz" if declared is None else "liar.npz")
    bomb = path.read_bytes()
    assert len(bomb) < 2 << 20  # under the message limit: an upload the server must parse
    e = refused(c._call, "ModelRegister", name="bomb", data=bomb, format="npz")
    assert e.code == "RESOURCE_EXHAUSTED" and "w.npy" in e.message and "--memory" in e.message, e
    e = refused(c.register_model, "bomb", path, upload=False)
    assert e.code == "RESOURCE_EXHAUSTED" and str(path) in e.message, e


def test_without_data_roots_only_the_stores_given_at_start_are_readable(files, tmp_path):
    """The default: the stores (and runs) on the command line are the roots; with none, no
    client-named path is read at all."""
    with serving(tmp_path / "a", f"g={files['store']}") as server, server.client(timeout=60) as c:
        assert c.register_graph("again", files["store"], reorder=False)["num_nodes"] == 200
        for path in (files["outer_store"], files["root"], files["root"] / "good.npz"):
            assert refused(c.register_graph, "other", path).code == "PERMISSION_DENIED"
        e = refused(c.register_model, "m", files["root"] / "good.npz", upload=False)
        assert e.code == "PERMISSION_DENIED", e
        assert c.register_model("m", files["root"] / "good.npz")["parameters"] > 0  # uploads need no root
    with serving(tmp_path / "b") as server, server.client(timeout=60) as c:
        e = refused(c.register_graph, "g", files["store"])
        assert e.code == "PERMISSION_DENIED" and "--data-root DIR" in e.message, e


def test_the_server_is_still_whole_after_the_attacks(server, files):
    """Runs last: the server answers, serves a store and a model from the root, and its
    cgroup's peak stayed under the limit (memlimit reports it when the server stops)."""
    assert server.proc.poll() is None, f"the server died:\n{server.stderr}"
    with server.client(timeout=60) as c:
        c.register_graph("g", files["store"], reorder=False)
        c.register_model("m", files["root"] / "good.npz")
        assert len(c.get_features("g", [0, 1])) == 2
    assert server.stop() == 0
    peak = re.search(r"memlimit: peak (\S+) of limit", server.stderr)
    assert peak, server.stderr
    print(f"serve adversarial: {peak.group(0)} {MEMORY + OVERHEAD}")
