"""polyml.codegen.vmath: exp, tanh, erf, logistic as vectorizable arithmetic, against float64 references
over their whole float32 range, the special values, and that a loop of them vectorizes."""

from __future__ import annotations

import ctypes
import math

import llvmlite.binding as llvm
import llvmlite.ir as ir
import numpy as np
import pytest

from polyml.codegen import vmath
from polyml.codegen.builder import counted_loop

F32, I64 = ir.FloatType(), ir.IntType(64)
REFS = {"exp": np.exp, "tanh": np.tanh, "erf": np.vectorize(math.erf, otypes=[np.float64]),
        "logistic": lambda x: 1.0 / (1.0 + np.exp(-x))}
#: (max relative error where |ref| > 1e-30, max absolute error); the logistic function's
#: relative error is that of onnxruntime's MLAS (the same approximation): large only where the
#: value is below ~1e-7, clamped at x = -18
BOUNDS = {"exp": (2e-7, math.inf), "tanh": (5e-7, 2e-7), "erf": (1e-6, 4e-7), "logistic": (math.inf, 3e-7)}


def _module() -> ir.Module:
    m = ir.Module()
    for name in REFS:
        fn = ir.Function(m, ir.FunctionType(ir.VoidType(), [F32.as_pointer(), F32.as_pointer(), I64]), name)
        for a in fn.args[:2]:
            a.add_attribute("noalias")
        b = ir.IRBuilder(fn.append_basic_block())
        with counted_loop(b, ir.Constant(I64, 0), fn.args[2], name, "i") as i:
            b.store(getattr(vmath, name)(b, b.load(b.gep(fn.args[0], [i]))), b.gep(fn.args[1], [i]))
        b.ret_void()
    return m


@pytest.fixture(scope="module")
def engine():
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    mod = llvm.parse_assembly(str(_module()))
    tm = llvm.Target.from_default_triple().create_target_machine()
    ee = llvm.create_mcjit_compiler(mod, tm)
    ee.finalize_object()
    return ee


def _run(engine, name: str, x: np.ndarray) -> np.ndarray:
    y = np.empty_like(x)
    f = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(engine.get_function_address(name))
    f(x.ctypes.data, y.ctypes.data, x.size)
    return y


@pytest.mark.parametrize("name", list(REFS))
def test_accuracy_over_the_range(engine, name: str) -> None:
    rng = np.random.default_rng(0)
    x = np.concatenate([np.linspace(-100, 100, 100_001), rng.standard_normal(100_000) * 3,
                        rng.standard_normal(1000) * 1e-3]).astype(np.float32)
    y = _run(engine, name, x).astype(np.float64)
    with np.errstate(all="ignore"):
        ref = REFS[name](x.astype(np.float64))
    ok = np.isfinite(ref) & (np.abs(ref) > 1e-30) & (np.abs(ref) < 3e38)
    rel = np.max(np.abs(y[ok] - ref[ok]) / np.abs(ref[ok]))
    ab = np.max(np.abs(y[ok] - ref[ok]))
    max_rel, max_abs = BOUNDS[name]
    assert rel <= max_rel and ab <= max_abs, (rel, ab)


def test_special_values(engine) -> None:
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 89.0, -200.0, 1e-30], np.float32)
    with np.errstate(all="ignore"):
        e, t, r = (_run(engine, n, x) for n in ("exp", "tanh", "erf"))
    np.testing.assert_array_equal(e[:4], [1, 1, np.inf, 0])
    assert np.isnan(e[4]) and e[5] == np.inf and e[6] == 0 and e[7] == 1
    np.testing.assert_array_equal(t[[0, 2, 3]], [0, 1, -1])
    assert np.signbit(t[1]) and np.isnan(t[4]) and t[7] == np.float32(1e-30)
    np.testing.assert_array_equal(r[[0, 2, 3]], [0, 1, -1])
    assert np.signbit(r[1]) and np.isnan(r[4])
    s = _run(engine, "logistic", x)
    np.testing.assert_array_equal(s[[0, 1, 2, 3, 5, 6]], [0.5, 0.5, 1, 0, 1, 0])
    assert np.isnan(s[4]) and s[7] == np.float32(0.5)


def test_logistic_in_silu_is_accurate_in_absolute_terms(engine) -> None:
    """x·logistic(x) (the SiLU epilogue) within 4e-6·max(1, |x·σ(x)|) of float64 for |x| ≤ 30:
    the float32 cancellation of ``p/q + ½`` for negative x (as in onnxruntime) is an absolute
    error of at most 2e-7, multiplied by x (3e-6 at x = -16, where the output is ~1e-6)."""
    x = np.linspace(-30, 30, 600_001).astype(np.float32)
    y = x.astype(np.float64) * _run(engine, "logistic", x).astype(np.float64)
    ref = x.astype(np.float64) / (1.0 + np.exp(-x.astype(np.float64)))
    assert np.max(np.abs(y - ref) / np.maximum(1.0, np.abs(ref))) <= 4e-6


def test_loop_vectorizes() -> None:
    """The point of the module: a loop over them becomes vector code at -O3."""
    import subprocess

    from polyml.driver.toolchain import host_target, tool

    t = host_target()
    m = _module()
    m.triple, m.data_layout = t.triple, t.datalayout
    for fn in m.functions:
        if not fn.is_declaration:
            set.add(fn.attributes, f'"target-cpu"="{t.cpu}"')
            set.add(fn.attributes, f'"target-features"="{t.features}"')
    out = subprocess.run([tool("opt"), "-O3", "-S", "-"], input=str(m), capture_output=True, text=True, check=True).stdout
    for name in REFS:
        body = out.split(f"@{name}(")[1].split("\n}\n")[0]
        assert "<8 x float>" in body or "<16 x float>" in body or "<4 x float>" in body, name
