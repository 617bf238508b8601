"""Vertex programs (`strata.grid.VertexProgram`, `run_program`, `strata run program`): the
shipped PageRank program against the native PageRank, in memory and out of core; connected
components and BFS programs with active sets against networkx, alone and on two ranks under
torchrun; program files (.py, .toml, .json) from the CLI; programs that cannot run."""

from __future__ import annotations

import importlib.util
import json
import sys

import numpy as np
import pytest

from conftest import REPO, needs, run_strata
from torchrun_env import free_port, rank_env, run_session

nx = needs("networkx")

from strata.config import ConvertConfig  # noqa: E402
from strata.convert import convert  # noqa: E402
from strata.errors import ConfigError, ProgramError  # noqa: E402
from strata.grid import VertexProgram, build_grid, load_program, run_program  # noqa: E402

# The tests share module-scoped fixtures: one xdist group keeps them on one worker, which
# builds them once (tests/conftest.py).
pytestmark = pytest.mark.xdist_group("test_grid_program")

N = 400


def example(name: str):
    """``examples/NAME.py`` as a module."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", REPO / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    """A directed graph of several weakly connected parts, isolated vertices and vertices
    without out-edges, its store, and grids in both orders and symmetrised."""
    d = tmp_path_factory.mktemp("program")
    g = nx.DiGraph()
    g.add_nodes_from(range(N))
    rng = np.random.default_rng(4)
    perm = rng.permutation(N - 20)
    start = 0
    for size in (200, 90, 50, 15, 5):
        part = nx.gnm_random_graph(size, 4 * size, seed=size, directed=True)
        g.add_edges_from((int(perm[start + u]), int(perm[start + v])) for u, v in part.edges)
        start += size
    np.save(d / "e.npy", np.array(sorted(g.edges), dtype=np.int64))
    store = d / "g.strata"
    convert(ConvertConfig(inputs=[d / "e.npy"], out=store, num_nodes=N))
    for order in ("column", "row"):
        build_grid(store=store, name=f"d-{order}", partitions=4, order=order)
    build_grid(store=store, name="sym", partitions=4, symmetrize=True)
    return {"g": g, "store": store}


@pytest.mark.parametrize(
    "grid, options",
    [
        ("d-column", {}),
        ("d-row", {"keep_resident": False, "segment": "4K"}),
        ("d-column", {"keep_resident": False, "segment": "4K", "vertex": "windows"}),
    ],
    ids=["column-resident", "row-streamed", "column-windows"],
)
def test_the_pagerank_program_gives_the_native_ranks(graph, tmp_path, grid, options):
    pagerank = example("pagerank_program")
    r = pagerank.compare(graph["store"], iterations=100, out=tmp_path, grid=grid, **options)
    assert r["max_rel_diff"] < 1e-5, r
    assert r["edges"] == 100 * graph["g"].number_of_edges()
    ref = nx.pagerank(graph["g"], alpha=0.85, tol=1e-14, max_iter=1000)
    np.testing.assert_allclose(np.load(tmp_path / "program" / "rank.npy"), [ref[v] for v in range(N)], rtol=1e-4)
    meta = json.loads((tmp_path / "program" / "run.json").read_text())
    assert meta["program"] == pagerank.program.replace(iterations=100).spec()
    assert meta["summary"]["result"]["stopped"] == "iterations"
    assert [p.rsplit("/", 1)[1] for p in meta["summary"]["arrays"]] == ["rank.npy"]


def test_components_with_an_active_set_skip_settled_blocks(graph, tmp_path):
    program = example("components_program").program
    seen = []
    result = run_program(graph["store"], program, out=tmp_path / "c", on_iteration=seen.append)
    assert result.summary["grid"].endswith("sym"), "a symmetric grid is found for it"
    component = np.asarray(result["component"])
    parts = list(nx.weakly_connected_components(graph["g"]))
    assert len(np.unique(component)) == len(parts)
    assert all(set(component[list(p)]) == {min(p)} for p in parts)
    assert result.summary["result"]["stopped"] == "no active vertex"
    assert seen[0]["active"] == N and seen[-1]["value"] == 0
    # A path through chunk 0, whose smallest label takes 99 iterations to reach its end, and
    # triangles in the other chunks, settled after the first: their blocks are not read again.
    edges = [(v, v + 1) for v in range(99)] + [(c + a, c + b) for c in (100, 200, 300) for a, b in ((0, 1), (1, 2))]
    np.save(tmp_path / "path.npy", np.array(edges, dtype=np.int64))
    convert(ConvertConfig(inputs=[tmp_path / "path.npy"], out=tmp_path / "path.strata", num_nodes=N))
    build_grid(store=tmp_path / "path.strata", name="sym", partitions=4, symmetrize=True)
    seen.clear()
    result = run_program(tmp_path / "path.strata" / "grids" / "sym", program, on_iteration=seen.append)
    assert len(seen) == 100 and set(np.asarray(result["component"])[:100]) == {0}
    assert all(it["pass"]["blocks_skipped"] > 0 for it in seen[3:]), "settled chunks' blocks are not read"


def test_two_ranks_under_torchrun_give_the_single_process_components(graph, tmp_path):
    needs("torch")
    program = REPO / "examples" / "components_program.py"
    alone = run_program(graph["store"], load_program(program), out=tmp_path / "alone", threads=2)
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--max-restarts", "0", "-m", "strata", "run", "program",
        graph["store"], "--program", program, "--out", tmp_path / "two", "--threads", "2", "--memory", "1G",
        "--dist-timeout", "60", "-q",
    ]  # fmt: skip
    proc = run_session([str(c) for c in cmd], rank_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    np.testing.assert_array_equal(np.load(tmp_path / "two" / "component.npy"), np.asarray(alone["component"]))
    record = json.loads((tmp_path / "two" / "run.json").read_text())
    assert record["world_size"] == 2 and record["program"]["name"] == "components"
    assert all(r["bytes_sent"] > 0 for r in record["summary"]["dist"]["ranks"])


BFS_TOML = """
name = "bfs"
edge = "src.level + 1"
combine = "min"
apply = ["level = acc if level < 0 else level"]
active = "level != old.level"
start = "id == root"

[params]
root = 7

[values]
level = { dtype = "i64", init = "0 if id == root else -1" }

[aggregates]
reached = { reduce = "sum", expr = "level != old.level" }
"""


def test_program_files_from_the_command_line(graph, tmp_path):
    (tmp_path / "bfs.toml").write_text(BFS_TOML)
    want = np.full(N, -1)
    for v, k in nx.single_source_shortest_path_length(graph["g"], 7).items():
        want[v] = k
    proc = run_strata("run", "program", graph["store"], "--program", tmp_path / "bfs.toml", "--grid", "d-row",
                      "--out", tmp_path / "bfs", "--json-summary", "-q")  # fmt: skip
    summary = json.loads(proc.stdout)
    assert np.array_equal(np.load(tmp_path / "bfs" / "level.npy"), want)
    assert summary["result"]["program"] == "bfs" and summary["iterations"] == want.max() + 1
    # The same program as JSON (a file, and text), and as Python with its default out directory.
    spec = load_program(tmp_path / "bfs.toml").spec()
    (tmp_path / "bfs.json").write_text(json.dumps(spec))
    for given in (tmp_path / "bfs.json", json.dumps(spec)):
        run_strata("run", "program", graph["store"], "--program", given, "--out", tmp_path / "j", "-q")
        assert np.array_equal(np.load(tmp_path / "j" / "level.npy"), want)
    (tmp_path / "prog.py").write_text(
        "from strata.grid import load_program\n"
        f"program = load_program({str(tmp_path / 'bfs.toml')!r}).replace(params={{'root': 7}})\n"
    )
    proc = run_strata("run", "program", graph["store"], "--program", tmp_path / "prog.py")
    assert "iter 1 " in proc.stderr and "active next" in proc.stderr
    assert "program bfs, stopped no active vertex" in proc.stdout
    assert np.array_equal(np.load(graph["store"] / "runs" / "grid-program-bfs" / "level.npy"), want)


def test_programs_that_cannot_run_say_why(graph, tmp_path):
    store = graph["store"]
    # Checked by the engine before anything runs, naming the step.
    bad = VertexProgram("pr", values={"rank": ("f32", "1 / n")}, edge="src.rnk", apply={"rank": "acc"}, iterations=1)
    with pytest.raises(
        ConfigError, match=r"run\.program: program 'pr': edge: unknown vertex array 'rnk'; did you mean 'rank'\?"
    ):
        bad.check()
    with pytest.raises(ConfigError, match=r"values\['rank'\]\.dtype: unknown choice 'float'"):
        VertexProgram("pr", values={"rank": ("float", "0")}, edge="src.rank", apply={"rank": "acc"})
    with pytest.raises(ConfigError, match=r"params: unknown parameter 'dampng'; did you mean 'damping'\?"):
        example("pagerank_program").program.replace(params={"dampng": 0.9})
    # A value an int64 array cannot hold stops the run naming the step and the vertex.
    nan = VertexProgram("x", values={"k": ("i64", "0")}, edge="src.k", apply={"k": "acc / 0"}, iterations=2)
    with pytest.raises(ProgramError, match=r"program 'x': apply statement 1 \(k\): vertex 0 got nan, which the int64"):
        run_program(store, nan, out=tmp_path / "x", grid="d-column")
    assert not (tmp_path / "x").exists()
    # Program files: code that raises, no program, several; and from the CLI (exit 2, no traceback).
    (tmp_path / "raises.py").write_text("import math\n\nx = math.sqrt(-1)\n")
    with pytest.raises(ProgramError, match=r"raises\.py \(line 3\): running the program file raised ValueError"):
        load_program(tmp_path / "raises.py")
    (tmp_path / "none.py").write_text("x = 1\n")
    with pytest.raises(ProgramError, match="defines no VertexProgram"):
        load_program(tmp_path / "none.py")
    (tmp_path / "two.py").write_text(
        "from strata.grid import VertexProgram\n"
        "a = VertexProgram('a', values={'v': ('f64', '0')}, edge='1', apply={'v': 'acc'}, iterations=1)\n"
        "b = VertexProgram('b', values={'v': ('f64', '0')}, edge='1', apply={'v': 'acc'}, iterations=1)\n"
    )
    with pytest.raises(ProgramError, match=r"defines 2 VertexPrograms \(a, b\); name the one to run `program`"):
        load_program(tmp_path / "two.py")
    (tmp_path / "bad.toml").write_text('name = "b"\nedg = "1"\n')
    cases = [
        (tmp_path / "raises.py", "running the program file raised ValueError: math domain error"),
        (tmp_path / "bad.toml", "unknown program key 'edg'; did you mean 'edge'?"),
        (tmp_path / "missing.py", "no such program file"),
        ('{"name": "q"}', "run.program: not a vertex program: missing field `values`"),
    ]
    for given, message in cases:
        proc = run_strata("run", "program", store, "--program", given, "--out", tmp_path / "o", check=False)
        assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    proc = run_strata("run", "program", store, "--out", tmp_path / "o", check=False)
    assert proc.returncode == 2 and "runs the vertex program --program names, and none is given" in proc.stderr
    assert not (tmp_path / "o").exists()
