"""Shared fixtures: the real datasets beside the checkout, and a CLI runner."""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import inspect
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_DATASETS = REPO.parent / "shared" / "datasets"

# One OpenMP thread per process (torch's intra-op pool, OpenBLAS) unless the caller chose: the
# suite keeps both cores busy with two xdist workers, and a CLI run or rank that starts a thread
# a core beside them only contends for the cores. Tests that pass `--torch-threads` still choose.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# `make test-python` runs the suite on two pytest-xdist workers (`-n 2 --dist loadgroup`). Tests
# that each keep several processes busy for long, or that measure memory, are heavy: they join
# one of two xdist groups, and a group's tests run one after another on one worker.
# - "heavy-ranks": groups of processes: torchrun groups of 2-3 ranks, ranks started by hand, and
#   network namespaces. Two of them side by side on two cores would starve each other's
#   heartbeats and timeouts, so they never overlap. A test is one when it reaches a group
#   launch: the string "torch.distributed.run" (a torchrun command line), or the helpers that
#   start or wait on several processes (`run_session`, `wait_all` from tests/torchrun_env.py,
#   `veth_pair` from tests/netns.py), or, in a file whose name matches RANK_FILES (ranks under
#   torchrun, network namespaces, injected faults), `Popen` (processes started side by side),
#   and elsewhere `Popen` together with `rank_env` (ranks started by hand).
#   "Reaches" follows the test's function, its fixtures and the functions and classes of the
#   test files they call. One process at a time is light, even a lone rank with `rank_env`'s
#   environment waiting for a peer that never comes, or a CLI run on a fixture's store: it
#   takes one core like any other light test, so the rank groups' worker is not kept busy by it.
# - "heavy-memory": one process measured or bounded at a time. A test is one when its file's name
#   matches MEMORY_FILES (the memory bounds, the adversarial server under a cgroup, the wheel's
#   install and run), or it uses the `limiter` fixture (a memory cgroup).
# The two groups share nothing by name: ports come from tests/torchrun_env.py:free_port (a lock
# file each), namespaces and cgroups are named after the process that makes them. xdist hands
# out the largest groups first, so each worker starts on one of them and the light tests fill in
# around both: neither worker waits on the other at the end. New tests that follow the naming
# rules in these files are grouped without an edit.
RANK_FILES = ("test_*dist*.py", "test_*netns*.py", "test_*faults*.py")
#: What launches a group of processes anywhere: names a test's code uses, and the module torchrun runs.
RANK_HELPERS = frozenset({"run_session", "wait_all", "veth_pair", "torch.distributed.run"})
#: In a RANK_FILES file, processes started by hand are ranks (or a namespace's peers) too.
LAUNCHERS = RANK_HELPERS | {"Popen"}
#: Elsewhere, processes started by hand with a rank's environment are ranks started side by side.
HAND_STARTED_RANKS = frozenset({"Popen", "rank_env"})
MEMORY_FILES = ("test_serve_adversarial.py", "test_memory_bound.py", "test_wheel.py")
TESTS = Path(__file__).resolve().parent


def _names(code: types.CodeType):
    """Every global and attribute name and every string constant ``code`` and the functions
    nested in it use."""
    yield from code.co_names
    yield from _strings(code.co_consts)


def _strings(consts):
    """The strings among ``consts``, in nested code and in the tuples the compiler folds
    constant list items into."""
    for const in consts:
        if isinstance(const, types.CodeType):
            yield from _names(const)
        elif isinstance(const, tuple | frozenset):
            yield from _strings(const)
        elif isinstance(const, str):
            yield const


def reached(functions) -> set[str]:
    """The names and string constants that ``functions``, and the functions and classes of the
    test files they name (followed transitively), use."""
    todo, seen, names = list(functions), set(), set()
    while todo:
        f = inspect.unwrap(todo.pop())
        code = getattr(f, "__code__", None)
        if code is None or code in seen or not code.co_filename.startswith(str(TESTS)):
            continue
        seen.add(code)
        for name in _names(code):
            names.add(name)
            target = f.__globals__.get(name)
            if inspect.isclass(target):
                todo.extend(v for v in vars(target).values() if inspect.isfunction(v))
            elif inspect.isfunction(target):
                todo.append(target)
    return names


def _functions(item: pytest.Item) -> list:
    """``item``'s test function and the functions of every fixture it uses."""
    functions = [getattr(item, "function", None)]
    name2defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    for name in getattr(item, "fixturenames", ()):
        functions += [d.func for d in name2defs.get(name, ())]
    return [f for f in functions if f is not None]


def heavy_group(item: pytest.Item) -> str | None:
    """The xdist group ``item`` runs in ("heavy-ranks" or "heavy-memory", the rules above), or
    None for a light test."""
    name = item.path.name
    functions = _functions(item)
    rank_file = any(fnmatch.fnmatch(name, pattern) for pattern in RANK_FILES)
    names = reached(functions)
    if names & (LAUNCHERS if rank_file else RANK_HELPERS) or HAND_STARTED_RANKS <= names:
        return "heavy-ranks"
    if any(fnmatch.fnmatch(name, pattern) for pattern in MEMORY_FILES) or "limiter" in getattr(
        item, "fixturenames", ()
    ):
        return "heavy-memory"
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    # tryfirst: xdist reads the xdist_group marks in its own hook, which must come after this one.
    for item in items:
        group = heavy_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    # Under --dist loadgroup a worker names a grouped test "NODEID@GROUP"; where a pytest and
    # pytest-xdist pair does not, the heavy tests would run side by side without a word. The
    # tests of MEMORY_FILES are heavy by their file's name alone, so they show it.
    if node.config.getvalue("dist") != "loadgroup":
        return
    lost = [i for i in ids if any(fnmatch.fnmatch(i.split("::")[0].rsplit("/")[-1], p) for p in MEMORY_FILES)]
    lost = [i for i in lost if "@heavy-" not in i]
    if lost:
        pytest.exit(
            f"pytest-xdist did not group {lost[0]} (and {len(lost) - 1} more heavy tests) under pytest "
            f"{pytest.__version__}: install the versions pyproject.toml's dev extra names (make test does)",
            returncode=pytest.ExitCode.USAGE_ERROR,
        )


@pytest.fixture(scope="module")
def cora(tmp_path_factory) -> Path:
    """Cora (Planetoid, from ``../shared/datasets``) converted to a store, once per module."""
    if not SHARED_DATASETS.is_dir():
        pytest.skip(f"{SHARED_DATASETS} is absent (CI always has it)")
    out = tmp_path_factory.mktemp("cora") / "cora.strata"
    run_strata("convert", SHARED_DATASETS / "planetoid", "--name", "cora", "--out", out, "-q")
    return out


@pytest.fixture
def shared_datasets() -> Path:
    """``../shared/datasets`` (FB15k-237, WN18RR, Planetoid); tests skip when it is absent."""
    if not SHARED_DATASETS.is_dir():
        pytest.skip(f"{SHARED_DATASETS} is absent (CI always has it)")
    return SHARED_DATASETS


def needs(module: str):
    """Imports optional dependency ``module``, or skips the test saying how to install it."""
    return pytest.importorskip(
        module, reason=f"{module} is not installed: `make test` installs it (or pip install {module})"
    )


def gpu_devices(cpu_name: str) -> list[str]:
    """The devices a device-parity test runs on: ``cpu_name`` (the CPU twin's name, ``"cpu"`` or
    ``"torch-cpu"``), and ``"cuda"`` too when torch imports and sees a GPU. Parametrizing over it
    runs the same assertions on a GPU where there is one; elsewhere (CI) the test runs exactly as
    on its CPU twin alone, with no skip: an absent device is simply not in the list. Torch is
    imported here, not when this file is (its import is slow)."""
    return [cpu_name, *(["cuda"] if _cuda_available() else [])]


@functools.cache
def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@contextlib.contextmanager
def triton_kernels(monkeypatch, device: str):
    """Within: Triton kernels compiled on ``cuda``, and run by Triton's interpreter over CPU
    tensors on the CPU (``TRITON_INTERPRET``). Every kernel is dropped on entry and exit
    (``kernels.clear_builders``), as a kernel and the helpers it calls are built on first use
    with the interpreter setting of then."""
    needs("triton")
    from strata.device import kernels

    if device == "cuda":
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    kernels.clear_builders()
    try:
        yield
    finally:
        kernels.clear_builders()


def without(monkeypatch, module: str) -> None:
    """Makes every import of ``module`` (and its submodules) fail for the rest of the test, as if
    the optional dependency were not installed."""
    import builtins

    real = builtins.__import__

    def refuse(name, *args, **kwargs):
        if name == module or name.startswith(f"{module}."):
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", refuse)


@pytest.fixture
def one_thread():
    """Torch on one thread for a test training a tiny model: 10-40x faster than torch's default
    on a machine whose cores are busy with other work."""
    torch = needs("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def run_strata(*args: str | os.PathLike, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    """Runs ``python -m strata ARGS`` and returns the completed process (text output)."""
    proc = subprocess.run([sys.executable, "-m", "strata", *map(str, args)], capture_output=True, text=True, **kwargs)
    if check and proc.returncode != 0:
        raise AssertionError(f"strata {' '.join(map(str, args))} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


def typed_text_inputs(d: Path, edges: str, node_types: str, edge_types: str) -> list:
    """Writes a typed text graph into ``d`` (``edges.csv``, ``node_types.tsv``,
    ``edge_types.tsv``) and returns the converter's ``--node-types``/``--edge-types`` flags."""
    (d / "node_types.tsv").write_text(node_types)
    (d / "edge_types.tsv").write_text(edge_types)
    (d / "edges.csv").write_text(edges)
    return ["--node-types", d / "node_types.tsv", "--edge-types", d / "edge_types.tsv"]


def save_aligned(path: Path, arr: np.ndarray) -> None:
    """``np.save`` with the data at byte 4096, where a store's arrays keep it (docs/formats.md)."""
    d = f"{{'descr': {np.lib.format.dtype_to_descr(arr.dtype)!r}, 'fortran_order': False, 'shape': {arr.shape}, }}"
    header = b"\x93NUMPY\x01\x00" + (4096 - 10).to_bytes(2, "little") + d.encode().ljust(4096 - 11) + b"\n"
    path.write_bytes(header + np.ascontiguousarray(arr).tobytes())


def symmetric_sbm_store(directory: Path, *, nodes, classes, dim, avg_degree) -> Path:
    """Generates a labelled SBM (``nodes``, ``classes``, ``dim`` float32 features) in ``directory``
    and converts it with both directions of every edge; returns the store's path."""
    run_strata("generate", "sbm", "--out", directory / "raw", "--nodes", nodes, "--classes", classes,
               "--feature-dim", dim, "--avg-degree", avg_degree, "-q")  # fmt: skip
    run_strata("convert", directory / "raw", "--symmetrize", "--out", directory / "sbm.strata", "-q")
    return directory / "sbm.strata"


def memlimit() -> Path | None:
    """``$STRATA_MEMLIMIT``, else ``shared/tools/memlimit`` beside the checkout (or beside the
    folder of worktrees), else ``memlimit`` on PATH."""
    env = os.environ.get("STRATA_MEMLIMIT")
    candidates = [Path(env)] if env else []
    candidates += [p / "shared" / "tools" / "memlimit" for p in (REPO.parent, REPO.parent.parent)]
    which = shutil.which("memlimit")
    candidates += [Path(which)] if which else []
    return next((c for c in candidates if c.is_file()), None)


@pytest.fixture(scope="session")
def limiter() -> Path:
    """The memlimit tool, or a skip that says how to get a memory cgroup."""
    tool = memlimit()
    if tool is None:
        pytest.skip("memlimit not found: set STRATA_MEMLIMIT to ../shared/tools/memlimit")
    probe = subprocess.run([str(tool), "64M", "true"], capture_output=True, text=True)
    if probe.returncode == 3:
        pytest.skip(
            f"memlimit cannot make a memory cgroup here ({probe.stderr.strip()}): run as root, "
            "or enable the memory controller (cgroup v2: add +memory to the parent's cgroup.subtree_control)"
        )
    return tool


@pytest.fixture
def strata_cli():
    return run_strata


@pytest.fixture(scope="module")
def kg(tmp_path_factory) -> Path:
    """A generated knowledge graph (400 entities, 8 relations) converted into a store."""
    d = tmp_path_factory.mktemp("kg")
    raw = d / "raw"
    run_strata("generate", "kg", "--out", raw, "--entities", "400", "--relations", "8", "--triples", "16000", "-q")
    run_strata("convert", raw, "--relations", "--out", d / "kg.strata", "-q")
    return d / "kg.strata"


@pytest.fixture(scope="module")
def weighted_kg(kg, tmp_path_factory) -> Path:
    """The kg fixture's triples (a module's own kg where it has one), each training triple with
    a weight in [0.5, 2)."""
    raw, d = kg.parent / "raw", tmp_path_factory.mktemp("weighted")
    gen = np.random.default_rng(5)
    for split in ("train", "valid", "test"):
        rows = [line for line in (raw / f"{split}.txt").read_text().split("\n") if line]
        weights = gen.uniform(0.5, 2.0, len(rows)) if split == "train" else np.ones(len(rows))
        (d / f"{split}.txt").write_text("".join(f"{r}\t{w:.4f}\n" for r, w in zip(rows, weights, strict=True)))
    run_strata("convert", d, "--relations", "--columns", "src,rel,dst,weight", "--out", d / "w.strata", "-q")
    return d / "w.strata"
