"""Every Triton kernel of Strata's device paths, as a GPU would take it. CI has no GPU: the
kernels' arithmetic is tested against their torch twins under Triton's interpreter (next to
each path's tests), and here what the interpreter skips, the compile to a Hopper GPU's machine
code and the names Triton's launcher binds. A kernel that fails either on a GPU is replaced by
its twin (``strata.device.kernels.fused``): the run is right but slower, and says so only once
on stderr, so these checks are what keeps the kernels launching."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from conftest import needs

torch = pytest.importorskip("torch")

from strata.device import kernels, rng  # noqa: E402
from strata.embed.device import adagrad, bilinear_rows, chunk_keys, complex_rows, softmax_loss  # noqa: E402
from strata.gnn.device import floyd, uva  # noqa: E402

#: Each kernel's builder, its parameters' types (as Triton's signatures spell them) and
#: constexpr values of a launch.
KERNELS = {
    **{
        f"adagrad {dtype}": (
            adagrad._kernel,
            dict(weights=f"*{dtype}", state=f"*{dtype}", keys="*i64", valid="*u8", grad="*fp32", sq="*fp32", n="i32",
                 width="i32", lr="fp32", eps="fp32", salt="*i64", state_salt="*i64", slot_rows="i64", tail_row="i64"),
            dict(ROW_WISE=False, BF16=dtype == "bf16", BLOCK_R=32, BLOCK_W=128),
        )
        for dtype in ("fp32", "bf16")
    },
    "complex_rows": (
        complex_rows._kernel,
        dict(x="*fp32", y1="*fp32", y2="*fp32", out1="*fp32", out2="*fp32", rows="i32", h="i32"),
        dict(CONJ=True, TWO=True, BLOCK_R=32, BLOCK_H=128),
    ),
    "softmax_loss": (
        softmax_loss._kernel,
        dict(pos="*fp32", neg="*fp32", w="*fp32", terms="*fp64", dpos="*fp32", dneg="*fp32", rows="i32", n="i32",
             b="i32"),
        dict(HAS_W=True, BLOCK_R=4, BLOCK_N=1024),
    ),
    **{
        f"bilinear_query {model}": (
            bilinear_rows._query_kernel,
            dict(s="*fp32", r="*fp32", t="*fp32", a="*fp32", pos="*fp32", rows="i32", cols="i32"),
            dict(MODEL=bilinear_rows.MODELS[model], BLOCK_R=32, BLOCK_D=64),
        )
        for model in ("distmult", "complex")
    },
    **{
        f"bilinear_grads {model}": (
            bilinear_rows._grads_kernel,
            dict(da0="*fp32", dpos="*fp32", s="*fp32", r="*fp32", t="*fp32", a="*fp32", ds="*fp32", dt="*fp32",
                 dr="*fp32", rows="i32", cols="i32"),
            dict(MODEL=bilinear_rows.MODELS[model], BLOCK_R=32, BLOCK_D=64),
        )
        for model in ("dot", "complex")
    },
    "chunk_keys": (
        chunk_keys._kernel,
        dict(edges="*i64", layout="*i64", streams="*i64", out="*i64", b="i32", n="i32", offset="i32", total="i32",
             parts="i32"),
        dict(S=2, FIRST_SIDE=0, RESIDENT=True, BLOCK=1024),
    ),
    "draw_below": (
        rng._kernel,
        dict(keys="*i64", bounds="*i64", stride="i32", step="i32", bound="i64", out="*i64", count="i32",
             first="i64"),
        dict(IN_MEMORY=True, BLOCK=1024),
    ),
    "derive": (
        rng._derive_kernel,
        dict(index="*i64", out="*i64", key="*i64", n="i32"),
        dict(BLOCK=1024),
    ),
    "floyd": (
        floyd._kernel,
        dict(keys="*i64", degree="*i64", picks="*i64", m="i32"),
        dict(K=10, BLOCK_M=256, BLOCK_K=16),
    ),
    "uva_gather": (
        uva._kernel,
        dict(table="*fp32", index="*i64", out="*fp32", total="i64", width="i32"),
        dict(BLOCK=1024),
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", KERNELS)
def test_each_kernel_compiles_for_a_hopper_gpu(monkeypatch, name):
    """Triton's front end and ptxas (shipped with Triton) on sm_90, no GPU needed: a kernel
    the interpreter runs can still fail to compile (an unsupported construct, a type clash)."""
    triton = needs("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    build, signature, constexprs = KERNELS[name]
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    kernels.clear_builders()
    try:
        kernel = build()
        assert set(inspect.signature(kernel.fn).parameters) == {*signature, *constexprs}, name
        source = ASTSource(kernel, {**signature, **dict.fromkeys(constexprs, "constexpr")}, constexprs)
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=kernels.OPTIONS)
    finally:
        kernels.clear_builders()
    assert ".entry" in compiled.asm["ptx"] and compiled.asm["cubin"]
    assert compiled.metadata.enable_fp_fusion is kernels.OPTIONS["enable_fp_fusion"]


def launches(tree: ast.AST):
    """The Triton launches in ``tree``: calls of the form ``builder()[grid](...)``."""
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Subscript)
            and isinstance(node.func.value, ast.Call)
        ):
            yield node


def test_every_launch_passes_the_compile_options():
    """Triton's defaults change between releases (3.10 stops fusing ``a * b + c`` into an FMA
    unless asked), and its interpreter ignores compile options, so only this check shows a
    launch that would take whatever default the GPU machine's Triton has."""
    package = Path(kernels.__file__).resolve().parents[1]
    found = []
    for path in sorted(package.rglob("*.py")):
        for call in launches(ast.parse(path.read_text(), str(path))):
            passed = [k.value for k in call.keywords if k.arg is None]
            found.append((path.name, call.lineno, any(ast.unparse(v) == "kernels.OPTIONS" for v in passed)))
    assert [f for f in found if not f[2]] == []
    # Every kernel's module launches it (bilinear_rows twice, rng twice; adagrad's two dtypes one launch).
    assert len(found) == 10, found


def test_no_kernel_names_a_parameter_after_a_local_of_tritons_binder():
    """Triton 3.6 binds a launch's arguments in a generated function whose locals ``params``,
    ``specialization`` and ``options``, and globals ``backend``, ``specialize_impl`` and
    ``JITCallable``, clash with parameters of those names: a kernel with a parameter ``params``
    fails every launch on a GPU ("failed to specialize argument of type: dict"). The
    interpreter binds otherwise, so only this check catches it on the CPU."""
    needs("triton")
    binder = {"params", "specialization", "options", "backend", "specialize_impl", "JITCallable"}
    for name, (build, _, _) in KERNELS.items():
        names = set(inspect.signature(build().fn).parameters)
        assert not names & binder, (name, sorted(names))


def test_each_epoch_s_device_line_names_the_kernels_a_twin_replaced(monkeypatch):
    """A kernel that fails is said once on stderr when it fails, which a long run's log buries;
    each epoch's device line (which the benches record) says it again."""
    from strata.embed.device.graphs import StepGraphs

    graphs = StepGraphs(torch.device("cpu"))
    assert "Triton" not in graphs.report()
    monkeypatch.setitem(kernels._FAILED, "Adagrad", "TypeError: failed to specialize argument of type: dict")
    line = graphs.report()
    assert line.startswith("device: ") and "replaced by their torch twins: Adagrad (TypeError: failed" in line


def test_a_switch_of_the_interpreter_setting_rebuilds_every_kernel_with_its_helpers(monkeypatch):
    """Tests run a kernel's CPU case under Triton's interpreter and its CUDA case compiled, in one
    process. A kernel built for the interpreter must not be launched on a GPU, nor a compiled one
    call helpers (module globals) that an interpreter build rebound: clearing every builder
    makes the next use build each kernel, and the helpers it calls, for the setting of then."""
    triton = needs("triton")
    from triton.runtime.interpreter import InterpretedFunction

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    kernels.clear_builders()
    try:
        assert all(isinstance(build(), InterpretedFunction) for build, _, _ in KERNELS.values())
        assert isinstance(rng._mix64, InterpretedFunction) and isinstance(floyd._below_draw, InterpretedFunction)
        monkeypatch.delenv("TRITON_INTERPRET")
        kernels.clear_builders()
        for name, (build, _, _) in KERNELS.items():
            assert isinstance(build(), triton.runtime.JITFunction), name
        compiled = (rng._mix64, rng._below_draw, floyd._below_draw, chunk_keys._below_draw, softmax_loss._larger,
                    softmax_loss._plus, bilinear_rows._plus)  # fmt: skip
        assert all(isinstance(helper, triton.runtime.JITFunction) for helper in compiled)
    finally:
        kernels.clear_builders()
