"""The TensorFlow GraphDef frontend, without TensorFlow: committed frozen Keras fixtures through
the CLI, small GraphDefs built with the protobuf classes checked against numpy references,
``.pbtxt`` reading, the interface (batch dimension, ``--input-shape``, ``:0`` names, sinks) and
the error contract.  Tests that need TensorFlow skip cleanly where it is absent (and are slow).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from google.protobuf import text_format
from tensorboard.compat.proto import graph_pb2, tensor_pb2, types_pb2

import polyml
from polyml import cli
from polyml.compiler import compile_graph
from polyml.errors import GraphError, ModelFormatError, ShapeError, UnsupportedError
from polyml.frontends.tensorflow import from_graphdef, inline_functions, tensor_to_numpy
from polyml.testing import rel_error

FIXTURES = Path(__file__).parent / "fixtures" / "tf"
RNG = np.random.default_rng(7)
TYPE_ATTRS = {"T", "dtype", "out_type", "Tidx", "DstT", "SrcT", "Tpaddings", "Tshape", "U", "Tperm", "Tdim",
              "Index", "Tmultiples", "Tparams", "Tindices", "Taxis", "index_type", "Tin", "Tout", "Tlen"}


# -- building GraphDefs ------------------------------------------------------------------------

def set_attrs(n, attrs: dict) -> None:
    """Set a NodeDef's attributes from Python values (type attributes by name, see TYPE_ATTRS)."""
    for k, v in attrs.items():
        a = n.attr[k]
        if k in TYPE_ATTRS and isinstance(v, list):
            a.list.type.extend(v)
        elif k in TYPE_ATTRS:
            a.type = v
        elif isinstance(v, bool):
            a.b = v
        elif isinstance(v, int):
            a.i = v
        elif isinstance(v, float):
            a.f = v
        elif isinstance(v, str):
            a.s = v.encode()
        elif isinstance(v, (list, tuple)):
            a.list.i.extend(int(i) for i in v)
        else:
            raise TypeError(k)


class G:
    """A GraphDef under construction (the protobuf classes only; no TensorFlow)."""

    def __init__(self) -> None:
        self.gd = graph_pb2.GraphDef()
        self.gd.versions.producer = 1882

    def node(self, name: str, op: str, inputs: list[str] = (), **attrs) -> str:
        set_attrs(self.gd.node.add(name=name, op=op, input=list(inputs)), attrs)
        return name

    def function(self, name: str, inputs: list[str], rets: dict[str, str], body: list[tuple[str, str, list[str], dict]]) -> None:
        """A library function of float args ``inputs``, outputs ``rets`` (name → body tensor, in
        TensorFlow's ``node:out_arg:i`` form) and nodes ``body`` ((name, op, inputs, attrs))."""
        f = self.gd.library.function.add()
        f.signature.name = name
        for a in inputs:
            f.signature.input_arg.add(name=a, type=types_pb2.DT_FLOAT)
        for o, t in rets.items():
            f.signature.output_arg.add(name=o, type=types_pb2.DT_FLOAT)
            f.ret[o] = t
        for node_name, op, ins, attrs in body:
            set_attrs(f.node_def.add(name=node_name, op=op, input=ins), attrs)

    def call(self, name: str, fn: str, inputs: list[str], n_out: int = 1, op: str = "PartitionedCall") -> str:
        n_in = sum(not t.startswith("^") for t in inputs)
        self.node(name, op, inputs, Tin=[types_pb2.DT_FLOAT] * n_in, Tout=[types_pb2.DT_FLOAT] * n_out)
        self.gd.node[-1].attr["f"].func.name = fn
        return name

    def placeholder(self, name: str, shape: list[int] | None, dtype: int = types_pb2.DT_FLOAT) -> str:
        n = self.gd.node.add(name=name, op="Placeholder")
        n.attr["dtype"].type = dtype
        if shape is None:
            n.attr["shape"].shape.unknown_rank = True
        else:
            for d in shape:
                n.attr["shape"].shape.dim.add(size=d)
        return name

    def const(self, name: str, value, form: str = "content") -> str:
        arr = np.asarray(value)
        n = self.gd.node.add(name=name, op="Const")
        dt = {np.dtype(np.float32): types_pb2.DT_FLOAT, np.dtype(np.int32): types_pb2.DT_INT32,
              np.dtype(np.int64): types_pb2.DT_INT64}[arr.dtype]
        n.attr["dtype"].type = dt
        t = n.attr["value"].tensor
        t.dtype = dt
        for d in arr.shape:
            t.tensor_shape.dim.add(size=d)
        if form == "content":
            t.tensor_content = arr.astype(arr.dtype.newbyteorder("<")).tobytes()
        else:  # typed values; "scalar" stores one value broadcast to the shape
            flat = arr.reshape(-1)[:1] if form == "scalar" else arr.reshape(-1)
            field = {types_pb2.DT_FLOAT: t.float_val, types_pb2.DT_INT32: t.int_val, types_pb2.DT_INT64: t.int64_val}[dt]
            field.extend(flat.tolist())
        return name

    def f32(self, name: str, shape: tuple[int, ...], lo: float = -1.0, hi: float = 1.0) -> tuple[str, np.ndarray]:
        arr = RNG.uniform(lo, hi, shape).astype(np.float32)
        return self.const(name, arr), arr

    def ints(self, name: str, values) -> str:
        return self.const(name, np.asarray(values, np.int32))

    def save(self, path: Path) -> Path:
        path.write_bytes(self.gd.SerializeToString())
        return path


# -- numpy references (TensorFlow's semantics) ----------------------------------------------------

def same_pads(size: int, k: int, s: int, d: int = 1) -> tuple[int, int]:
    out = -(-size // s)
    total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
    return total // 2, total - total // 2


def conv_ref(x: np.ndarray, w: np.ndarray, strides=(1, 1), dil=(1, 1), pads=((0, 0), (0, 0)), depthwise=False) -> np.ndarray:
    """NHWC convolution with HWIO (or HWCM depthwise) filters, explicit (begin, end) pads."""
    x = np.pad(x.astype(np.float64), ((0, 0), *pads, (0, 0)))
    kh, kw = w.shape[:2]
    oh = (x.shape[1] - (kh - 1) * dil[0] - 1) // strides[0] + 1
    ow = (x.shape[2] - (kw - 1) * dil[1] - 1) // strides[1] + 1
    cin = x.shape[3]
    if depthwise:
        cout = w.shape[2] * w.shape[3]
    else:
        cout = w.shape[3]
        groups = cin // w.shape[2]
    y = np.zeros((x.shape[0], oh, ow, cout))
    for i in range(kh):
        for j in range(kw):
            r0, c0 = i * dil[0], j * dil[1]
            patch = x[:, r0 : r0 + strides[0] * (oh - 1) + 1 : strides[0], c0 : c0 + strides[1] * (ow - 1) + 1 : strides[1], :]
            if depthwise:
                y += (patch[..., :, None] * w[i, j][None, None, None]).reshape(*patch.shape[:3], cout)
            else:
                ci, co = w.shape[2], cout // groups
                for g in range(groups):
                    y[..., g * co : (g + 1) * co] += patch[..., g * ci : (g + 1) * ci] @ w[i, j][:, g * co : (g + 1) * co]
    return y.astype(np.float32)


def pool_ref(x: np.ndarray, k: int, s: int, padding: str, op: str) -> np.ndarray:
    h, w = x.shape[1:3]
    (pt, pb), (pl, pr) = (same_pads(h, k, s), same_pads(w, k, s)) if padding == "SAME" else ((0, 0), (0, 0))
    fill = -np.inf if op == "max" else np.nan
    xp = np.pad(x.astype(np.float64), ((0, 0), (pt, pb), (pl, pr), (0, 0)), constant_values=fill)
    oh, ow = (xp.shape[1] - k) // s + 1, (xp.shape[2] - k) // s + 1
    wins = np.stack([xp[:, i : i + s * (oh - 1) + 1 : s, j : j + s * (ow - 1) + 1 : s] for i in range(k) for j in range(k)])
    return (np.max(wins, 0) if op == "max" else np.nanmean(wins, 0)).astype(np.float32)


def bn_ref(x, scale, offset, mean, var, eps, axis=-1):
    shape = [1] * x.ndim
    shape[axis] = -1
    return ((x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps) * scale.reshape(shape) + offset.reshape(shape)).astype(np.float32)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


# -- op cases: (graph, feeds, expected outputs) ------------------------------------------------

Case = tuple[G, dict[str, np.ndarray], dict[str, np.ndarray]]


def case_conv() -> Case:
    """Conv2D SAME/VALID/EXPLICIT, strides, dilations, groups, NCHW; BiasAdd, Relu, Relu6."""
    g = G()
    x = RNG.standard_normal((1, 9, 9, 4)).astype(np.float32)
    g.placeholder("x", [-1, 9, 9, 4])
    exp = {}
    w1n, w1 = g.f32("w1", (3, 3, 4, 6))
    b1n, b1 = g.f32("b1", (6,))
    g.node("same_s2", "Conv2D", ["x", w1n], T=1, strides=[1, 2, 2, 1], padding="SAME", data_format="NHWC")
    g.node("same_bias", "BiasAdd", ["same_s2", b1n], T=1, data_format="NHWC")
    g.node("same_relu6", "Relu6", ["same_bias"], T=1)
    pads = (same_pads(9, 3, 2), same_pads(9, 3, 2))
    exp["same_relu6"] = np.clip(conv_ref(x, w1, (2, 2), pads=pads) + b1, 0, 6)
    w2n, w2 = g.f32("w2", (3, 2, 4, 5))
    g.node("valid_dil", "Conv2D", ["x", w2n], T=1, strides=[1, 1, 1, 1], dilations=[1, 2, 3, 1], padding="VALID")
    g.node("valid_relu", "Relu", ["valid_dil"], T=1)
    exp["valid_relu"] = np.maximum(conv_ref(x, w2, dil=(2, 3)), 0)
    w3n, w3 = g.f32("w3", (2, 3, 4, 3))
    g.node("explicit", "Conv2D", ["x", w3n], T=1, strides=[1, 1, 2, 1], padding="EXPLICIT",
           explicit_paddings=[0, 0, 1, 2, 2, 1, 0, 0])
    exp["explicit"] = conv_ref(x, w3, (1, 2), pads=((1, 2), (2, 1)))
    w4n, w4 = g.f32("w4", (3, 3, 2, 6))  # 4 input channels, 2 per group: group 2
    g.node("grouped", "Conv2D", ["x", w4n], T=1, strides=[1, 1, 1, 1], padding="SAME")
    exp["grouped"] = conv_ref(x, w4, pads=(same_pads(9, 3, 1), same_pads(9, 3, 1)))
    # data_format NCHW: a transposed input, no layout change needed
    g.ints("perm_nchw", [0, 3, 1, 2])
    g.node("x_nchw", "Transpose", ["x", "perm_nchw"], T=1, Tperm=3)
    g.node("nchw_conv", "Conv2D", ["x_nchw", w1n], T=1, strides=[1, 1, 2, 2], padding="SAME", data_format="NCHW")
    exp["nchw_conv"] = np.transpose(conv_ref(x, w1, (2, 2), pads=pads), (0, 3, 1, 2))
    return g, {"x": x}, exp


def case_depthwise_bn() -> Case:
    """DepthwiseConv2dNative (multiplier 2); Keras-3-style Mul/AddV2 batch norm and
    FusedBatchNormV3 after convolutions (folded) and on a Placeholder (not folded)."""
    g = G()
    x = RNG.standard_normal((1, 8, 10, 4)).astype(np.float32)
    g.placeholder("x", [1, 8, 10, 4])
    exp = {}
    wn, w = g.f32("dw", (3, 3, 4, 2))
    g.node("dw_conv", "DepthwiseConv2dNative", ["x", wn], T=1, strides=[1, 2, 2, 1], padding="SAME")
    sn, s = g.f32("bn_mul", (8,), 0.5, 1.5)
    on, o = g.f32("bn_add", (8,))
    g.node("mul", "Mul", ["dw_conv", sn], T=1)
    g.node("add", "AddV2", ["mul", on], T=1)
    g.node("sig", "Sigmoid", ["add"], T=1)
    y = conv_ref(x, w, (2, 2), pads=(same_pads(8, 3, 2), same_pads(10, 3, 2)), depthwise=True) * s + o
    exp["sig"] = 1 / (1 + np.exp(-y))
    params = [RNG.uniform(0.5, 1.5, 6).astype(np.float32), RNG.normal(0, 0.1, 6).astype(np.float32),
              RNG.normal(0, 0.1, 6).astype(np.float32), RNG.uniform(0.5, 1.5, 6).astype(np.float32)]
    names = [g.const(f"p{i}", p) for i, p in enumerate(params)]
    w1n, w1 = g.f32("w1", (1, 1, 4, 6))
    g.node("pw", "Conv2D", ["x", w1n], T=1, strides=[1, 1, 1, 1], padding="VALID")
    g.node("fbn", "FusedBatchNormV3", ["pw", *names], T=1, U=1, epsilon=0.001, is_training=False, data_format="NHWC")
    g.node("fbn_relu", "Relu", ["fbn"], T=1)
    exp["fbn_relu"] = np.maximum(bn_ref(conv_ref(x, w1), *params, 0.001), 0)
    p4 = [p[:4] for p in params]
    names4 = [g.const(f"q{i}", p) for i, p in enumerate(p4)]
    g.node("fbn_in", "FusedBatchNorm", ["x", *names4], T=1, epsilon=0.01, is_training=False)
    exp["fbn_in"] = bn_ref(x, *p4, 0.01)
    return g, {"x": x}, exp


def case_elementwise() -> Case:
    """Binary ops with constants of every rank, mixed layouts (a Conv output plus a Placeholder),
    and the unary ops."""
    g = G()
    x = RNG.standard_normal((1, 6, 7, 4)).astype(np.float32)
    g.placeholder("x", [1, 6, 7, 4])
    wn, w = g.f32("w", (1, 1, 4, 4))
    g.node("conv", "Conv2D", ["x", wn], T=1, strides=[1, 1, 1, 1], padding="SAME")
    c = conv_ref(x, w)
    g.node("mixed", "AddV2", ["conv", "x"], T=1)  # NCHW-held + NHWC-held
    m2n, m2 = g.f32("m2", (7, 4))
    g.node("mul2d", "Mul", ["mixed", m2n], T=1)
    g.const("half", np.float32(0.5), "scalar")
    g.node("sub", "Sub", ["half", "mul2d"], T=1)
    d4n, d4 = g.f32("d4", (1, 6, 1, 1), 1.0, 2.0)
    g.node("div", "RealDiv", ["sub", d4n], T=1)
    g.const("lo", np.full(4, -0.25, np.float32), "scalar")  # one float_val broadcast to 4 values
    g.node("max", "Maximum", ["div", "lo"], T=1)
    g.const("hi", np.float32(0.75))
    g.node("min", "Minimum", ["hi", "max"], T=1)
    y = np.minimum(0.75, np.maximum((0.5 - (c + x) * m2) / d4, -0.25))
    exp = {"min": y}
    g.node("tanh", "Tanh", ["conv"], T=1)
    g.node("sq", "Square", ["conv"], T=1)
    g.const("one", np.float32(1.0))
    g.node("sq1", "AddV2", ["sq", "one"], T=1)
    g.node("rsqrt", "Rsqrt", ["sq1"], T=1)
    g.node("sqrt", "Sqrt", ["sq1"], T=1)
    g.node("prod", "Mul", ["rsqrt", "tanh"], T=1)
    g.node("sum", "AddV2", ["prod", "sqrt"], T=1)
    exp["sum"] = np.tanh(c) / np.sqrt(c * c + 1) + np.sqrt(c * c + 1)
    # Keras 3's batch norm arithmetic on constants: folded at import
    vn, v = g.f32("var", (4,), 0.5, 1.5)
    g.const("eps", np.float32(1e-3))
    g.node("v_eps", "AddV2", [vn, "eps"], T=1)
    g.node("inv", "Rsqrt", ["v_eps"], T=1)
    g.node("scaled", "Mul", ["x", "inv"], T=1)
    g.node("neg", "Neg", ["scaled"], T=1)
    exp["neg"] = -(x / np.sqrt(v + np.float32(1e-3)))
    g.node("leaky", "LeakyRelu", ["conv"], T=1, alpha=0.1)
    g.node("absx", "Abs", ["x"], T=1)
    g.node("sqdiff", "SquaredDifference", ["leaky", "absx"], T=1)
    g.node("expc", "Exp", ["tanh"], T=1)
    g.node("addn", "AddN", ["sqdiff", "expc", "x"], T=1, N=3)
    g.const("two", np.float32(2.0))
    g.node("pow", "Pow", ["addn", "two"], T=1)
    leaky = np.where(c >= 0, c, 0.1 * c)
    exp["pow"] = ((leaky - np.abs(x)) ** 2 + np.exp(np.tanh(c)) + x) ** 2
    return g, {"x": x}, exp


def case_reduce_pool_pad() -> Case:
    """Mean (keep_dims, axes), MaxPool/AvgPool SAME/VALID on NHWC- and NCHW-held inputs, Pad/PadV2."""
    g = G()
    x = RNG.standard_normal((1, 9, 8, 3)).astype(np.float32)
    g.placeholder("x", [1, 9, 8, 3])
    wn, w = g.f32("w", (1, 1, 3, 5))
    g.node("conv", "Conv2D", ["x", wn], T=1, strides=[1, 1, 1, 1], padding="VALID")
    c = conv_ref(x, w)
    exp = {}
    for name, axes, keep in [("mean_hw", [1, 2], False), ("mean_hw_keep", [1, 2], True), ("mean_c", [-1], True),
                             ("mean_all", [0, 1, 2, 3], False), ("mean_w", [2], False)]:
        g.ints(f"{name}/axes", axes)
        g.node(name, "Mean", ["conv", f"{name}/axes"], T=1, Tidx=3, keep_dims=keep)
        exp[name] = np.mean(c, axis=tuple(axes), keepdims=keep)
    for op, fn in (("Sum", np.sum), ("Max", np.max), ("Min", np.min)):
        g.ints(f"{op}/axes", [2, 1])
        g.node(f"red_{op}", op, ["conv", f"{op}/axes"], T=1, Tidx=3, keep_dims=False)
        exp[f"red_{op}"] = fn(c, axis=(1, 2))
    g.ints("mp2/k", [1, 2, 3, 1])
    g.ints("mp2/s", [1, 2, 1, 1])
    g.node("maxpool_v2", "MaxPoolV2", ["conv", "mp2/k", "mp2/s"], T=1, padding="VALID")
    xp = np.stack([c[:, i : i + 7 : 2, j : j + 6] for i in range(2) for j in range(3)])
    exp["maxpool_v2"] = xp.max(0)
    g.node("mean_sq", "Squeeze", ["mean_hw_keep"], T=1, squeeze_dims=[1, 2])
    exp["mean_sq"] = np.mean(c, axis=(1, 2))
    for src, ref in (("x", x), ("conv", c)):
        for op, k, s, padding in (("MaxPool", 3, 2, "SAME"), ("AvgPool", 3, 2, "SAME"), ("AvgPool", 2, 2, "VALID")):
            name = f"{op}_{src}_{padding}_{k}"
            g.node(name, op, [src], T=1, ksize=[1, k, k, 1], strides=[1, s, s, 1], padding=padding, data_format="NHWC")
            exp[name] = pool_ref(ref, k, s, padding, "max" if op == "MaxPool" else "avg")
    g.ints("pads", [[0, 0], [1, 2], [0, 1], [0, 0]])
    g.node("pad", "Pad", ["conv", "pads"], T=1, Tpaddings=3)
    exp["pad"] = np.pad(c, ((0, 0), (1, 2), (0, 1), (0, 0)))
    g.ints("cpads", [[0, 0], [0, 0], [0, 0], [1, 2]])
    g.const("minus1", np.float32(-1.0))
    g.node("padv2", "PadV2", ["conv", "cpads", "minus1"], T=1, Tpaddings=3)
    exp["padv2"] = np.pad(c, ((0, 0), (0, 0), (0, 0), (1, 2)), constant_values=-1.0)
    # ZeroPadding2D before a VALID convolution (folded into the Conv's pads)
    g.ints("zpads", [[0, 0], [1, 1], [2, 0], [0, 0]])
    g.node("zpad", "Pad", ["x", "zpads"], T=1, Tpaddings=3)
    w2n, w2 = g.f32("w2", (3, 3, 3, 2))
    g.node("zconv", "Conv2D", ["zpad", w2n], T=1, strides=[1, 2, 2, 1], padding="VALID")
    exp["zconv"] = conv_ref(x, w2, (2, 2), pads=((1, 1), (2, 0)))
    return g, {"x": x}, exp


def case_matmul_shapes() -> Case:
    """MatMul (transpose flags, constant and run-time operands), BiasAdd, Softmax on 2-D and on
    an NCHW-held 4-D tensor, Reshape, ExpandDims, Squeeze, ConcatV2, TF Transpose."""
    g = G()
    x = RNG.standard_normal((1, 5, 6, 4)).astype(np.float32)
    g.placeholder("x", [-1, 5, 6, 4])
    wn, w = g.f32("w", (3, 3, 4, 4))
    g.node("conv", "Conv2D", ["x", wn], T=1, strides=[1, 1, 1, 1], padding="SAME")
    c = conv_ref(x, w, pads=(same_pads(5, 3, 1), same_pads(6, 3, 1)))
    exp = {}
    g.ints("hw", [1, 2])
    g.node("gap", "Mean", ["conv", "hw"], T=1, Tidx=3, keep_dims=False)
    gap = c.mean(axis=(1, 2))
    dn, d = g.f32("dense", (4, 7))
    bn, b = g.f32("bias", (7,))
    g.node("fc", "MatMul", ["gap", dn], T=1, transpose_a=False, transpose_b=False)
    g.node("fc_bias", "BiasAdd", ["fc", bn], T=1)
    g.node("probs", "Softmax", ["fc_bias"], T=1)
    exp["probs"] = softmax(gap @ d + b)
    tn, t = g.f32("dense_t", (7, 4))
    g.node("fc_t", "MatMul", ["gap", tn], T=1, transpose_b=True)
    exp["fc_t"] = gap @ t.T
    g.ints("flat_shape", [-1, 4])
    g.node("rows", "Reshape", ["conv", "flat_shape"], T=1, Tshape=3)  # (30, 4), TF element order
    g.node("gram", "MatMul", ["rows", "rows"], T=1, transpose_a=True)  # run-time operands: Gemm
    exp["gram"] = c.reshape(30, 4).T @ c.reshape(30, 4)
    g.node("softmax4d", "Softmax", ["conv"], T=1)
    exp["softmax4d"] = softmax(c)
    g.ints("ax3", 3)
    g.node("cat_c", "ConcatV2", ["conv", "x", "ax3"], T=1, Tidx=3, N=2)  # channels of an NCHW- and an NHWC-held input
    exp["cat_c"] = np.concatenate([c, x], axis=3)
    g.node("relu", "Relu", ["conv"], T=1)
    g.ints("ax1", 1)
    g.node("cat_h", "ConcatV2", ["conv", "relu", "ax1"], T=1, Tidx=3, N=2)
    exp["cat_h"] = np.concatenate([c, np.maximum(c, 0)], axis=1)
    g.ints("perm", [0, 3, 2, 1])
    g.node("tr", "Transpose", ["relu", "perm"], T=1, Tperm=3)
    exp["tr"] = np.transpose(np.maximum(c, 0), (0, 3, 2, 1))
    g.ints("ax0", [0])
    g.node("expand", "ExpandDims", ["gap", "ax0"], T=1, Tdim=3)
    exp["expand"] = gap[None]
    g.node("squeezed", "Squeeze", ["expand"], T=1)  # no squeeze_dims: every size-1 dim
    exp["squeezed"] = gap.reshape(4)
    g.ints("rows3_shape", [5, 6, 4])
    g.node("rows3", "Reshape", ["conv", "rows3_shape"], T=1, Tshape=3)
    bmn, bm = g.f32("bm", (4, 3))
    g.node("bmm", "BatchMatMulV2", ["rows3", bmn], T=1, adj_x=False, adj_y=False)
    exp["bmm"] = c.reshape(5, 6, 4) @ bm
    g.node("logsm", "LogSoftmax", ["bmm"], T=1)
    exp["logsm"] = np.log(softmax(c.reshape(5, 6, 4) @ bm))
    return g, {"x": x}, exp


def case_conv3d() -> Case:
    """Conv3D (NDHWC, VALID, strides) and MaxPool3D."""
    g = G()
    x = RNG.standard_normal((1, 5, 6, 7, 2)).astype(np.float32)
    g.placeholder("x", [1, 5, 6, 7, 2])
    wn, w = g.f32("w", (2, 3, 2, 2, 3))
    g.node("conv3d", "Conv3D", ["x", wn], T=1, strides=[1, 1, 2, 1, 1], padding="VALID")
    y = np.stack([sum(conv_ref(x[:, d + kd], w[kd], (2, 1)) for kd in range(2)) for d in range(4)], axis=1)
    g.node("pool3d", "MaxPool3D", ["conv3d"], T=1, ksize=[1, 2, 2, 2, 1], strides=[1, 2, 2, 2, 1], padding="VALID")
    p = np.stack([y[:, a : a + 3 : 2, b : b + 1 : 2, e : e + 5 : 2] for a in range(2) for b in range(2) for e in range(2)]).max(0)
    return g, {"x": x}, {"conv3d": y, "pool3d": p}


def case_shape_folding() -> Case:
    """Keras' Flatten with a dynamic batch (Shape → StridedSlice → Pack → Reshape) and constant
    computations (Range, GatherV2, Tile, Cast, Fill, Prod, ZerosLike): all folded at import."""
    g = G()
    x = RNG.standard_normal((1, 4, 4, 3)).astype(np.float32)
    g.placeholder("x", [-1, 4, 4, 3])
    wn, w = g.f32("w", (1, 1, 3, 2))
    g.node("conv", "Conv2D", ["x", wn], T=1, strides=[1, 1, 1, 1], padding="VALID")
    c = conv_ref(x, w)
    g.node("shape", "Shape", ["conv"], T=1, out_type=3)
    g.ints("b0", [0])
    g.ints("b1", [1])
    g.node("batch", "StridedSlice", ["shape", "b0", "b1", "b1"], T=3, Index=3, shrink_axis_mask=1)
    g.ints("minus1", -1)
    g.node("flat_shape", "Pack", ["batch", "minus1"], T=3, N=2, axis=0)
    g.node("flat", "Reshape", ["conv", "flat_shape"], T=1, Tshape=3)
    g.ints("start", 0)
    g.ints("limit", 8)
    g.ints("delta", 1)
    g.node("range", "Range", ["start", "limit", "delta"], Tidx=3)
    g.ints("idx", [1, 3])
    g.ints("axis0", 0)
    g.node("gather", "GatherV2", ["range", "idx", "axis0"], Tparams=3, Tindices=3, Taxis=3, batch_dims=0)
    g.ints("reps", [16])
    g.node("tile", "Tile", ["gather", "reps"], T=3, Tmultiples=3)
    g.node("bias", "Cast", ["tile"], SrcT=3, DstT=1, Truncate=False)
    g.ints("fdims", [1, 32])
    g.node("prod", "Prod", ["fdims", "axis0"], T=3, Tidx=3, keep_dims=False)
    g.node("scale_i", "Fill", [g.ints("one_dim", [1]), "prod"], T=3, index_type=3)
    g.node("scale", "Cast", ["scale_i"], SrcT=3, DstT=1)
    g.node("zeros", "ZerosLike", ["flat"], T=1)
    g.node("y0", "AddV2", ["flat", "bias"], T=1)
    g.node("y1", "RealDiv", ["y0", "scale"], T=1)
    g.node("y", "AddV2", ["y1", "zeros"], T=1)
    bias = np.tile(np.array([1, 3]), 16).astype(np.float32)
    return g, {"x": x}, {"y": (c.reshape(1, -1) + bias) / 32}


CASES: dict[str, Callable[[], Case]] = {
    "conv": case_conv,
    "depthwise_bn": case_depthwise_bn,
    "elementwise": case_elementwise,
    "reduce_pool_pad": case_reduce_pool_pad,
    "matmul_shapes": case_matmul_shapes,
    "conv3d": case_conv3d,
    "shape_folding": case_shape_folding,
}


def test_shape_folding_leaves_no_shape_ops() -> None:
    g, _, _ = case_shape_folding()
    ops = [n.op_type for n in from_graphdef(g.gd).nodes]
    assert sorted(set(ops)) == ["Add", "Conv", "Div", "Reshape", "Transpose"], ops


@pytest.mark.parametrize("name", CASES)
def test_op_graph_matches_numpy(name: str, tmp_path: Path) -> None:
    g, feeds, exp = CASES[name]()
    m = polyml.compile(g.save(tmp_path / "g.pb"), tmp_path / "art", outputs=list(exp), threads=1, polly=False)
    got = m.run(feeds)
    assert set(got) == set(exp)
    for k, ref in exp.items():
        assert got[k].shape == ref.shape, (k, got[k].shape, ref.shape)
        err = rel_error(got[k], ref)
        assert err <= 1e-5, f"{name}/{k}: max|Δ|/max|ref| = {err:.2e}"


def test_layout_tracking_keeps_transposes_out() -> None:
    """The conv chain stays NCHW: the only Transposes are at the input and where TF order is needed."""
    g, _, exp = case_matmul_shapes()
    graph = from_graphdef(g.gd, outputs=["probs"])
    ops = [n.op_type for n in graph.nodes]
    assert ops.count("Transpose") == 1, ops  # x → NCHW; Mean's (N, C) result is already TF order
    assert "Gemm" in ops and "BatchNormalization" not in ops
    names = {n.name for n in graph.nodes}
    assert {"conv", "gap", "probs"} <= names  # IR nodes carry the TF node names
    g, _, _ = case_depthwise_bn()
    graph = from_graphdef(g.gd, outputs=["sig", "fbn_relu"])
    ops = [n.op_type for n in graph.nodes]
    assert ops.count("Conv") == 2 and "Mul" not in ops and "Add" not in ops and "BatchNormalization" not in ops, ops


def test_nhwc_layout_option_agrees(tmp_path: Path) -> None:
    g, feeds, exp = case_conv()
    graph = from_graphdef(g.gd, outputs=["same_relu6", "valid_relu"], layout="nhwc")
    assert sum(n.op_type == "Transpose" for n in graph.nodes) == 3  # one in (shared), one out per conv
    m = compile_graph(graph, tmp_path / "art", threads=1)
    got = m.run(feeds)
    for k in ("same_relu6", "valid_relu"):
        assert rel_error(got[k], exp[k]) <= 1e-5


# -- frozen Keras fixtures through the CLI --------------------------------------------------------

@pytest.mark.parametrize("stem", ["mobilenet_v2_a0.35_96", "tiny_32_tf1", "tiny_32"])
def test_frozen_keras_fixture_cli(stem: str, tmp_path: Path) -> None:
    """`polyml build X.pb --polly --fuse` then `polyml run` match TensorFlow's stored outputs."""
    pb = FIXTURES / f"{stem}.pb"
    art = tmp_path / "art"
    assert cli.main(["build", str(pb), "--polly", "--fuse", "-o", str(art), "--threads", "2"]) == 0
    out = tmp_path / "out.npz"
    assert cli.main(["run", str(art), "--inputs", str(FIXTURES / f"{stem}.in.npz"), "--outputs", str(out)]) == 0
    with np.load(FIXTURES / f"{stem}.out.npz") as ref, np.load(out) as got:
        assert set(got.files) == set(ref.files) == {"Identity", "Identity_1"}
        for k in ref.files:
            assert got[k].shape == ref[k].shape
            err = rel_error(got[k], ref[k])
            assert err <= 1e-3, f"{stem} {k}: max|Δ|/max|ref| = {err:.2e}"
            assert np.std(ref[k]) > 0


def test_fused_batchnorm_fixture_has_fused_ops() -> None:
    gd = graph_pb2.GraphDef()
    gd.ParseFromString((FIXTURES / "tiny_32_tf1.pb").read_bytes())
    ops = {n.op for n in gd.node}
    assert "FusedBatchNormV3" in ops and "SpaceToBatchND" in ops and "DepthwiseConv2dNative" in ops


# -- interface ----------------------------------------------------------------------------------

def small_graph(batch: int = -1) -> G:
    """x[batch, 4, 4, 3] → Conv2D 1x1 → Relu → y (plus a NoOp with control inputs, an IdentityN)."""
    g = G()
    g.placeholder("input", [batch, 4, 4, 3])
    g.const("w", np.arange(3 * 2, dtype=np.float32).reshape(1, 1, 3, 2) / 6)
    g.node("conv", "Conv2D", ["input", "w"], T=1, strides=[1, 1, 1, 1], padding="VALID")
    g.node("relu", "Relu", ["conv"], T=1)
    g.node("ids", "IdentityN", ["relu", "conv"], T=[1, 1])
    g.node("NoOp", "NoOp", ["^relu", "^conv"])
    g.node("Identity", "Identity", ["ids", "^NoOp"], T=1)
    g.node("Identity_1", "Identity", ["ids:1"], T=1)
    return g


def small_ref(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    c = x @ (np.arange(6, dtype=np.float32).reshape(3, 2) / 6)
    return np.maximum(c, 0), c


def test_interface_sinks_batch_and_names(tmp_path: Path) -> None:
    graph = from_graphdef(small_graph().save(tmp_path / "m.pb"))
    assert graph.inputs == ["input"] and graph.outputs == ["Identity", "Identity_1"]
    assert graph.types["input"].shape == (1, 4, 4, 3)  # unknown batch → 1
    m = polyml.compile(tmp_path / "m.pb", tmp_path / "art", threads=1)
    x = RNG.standard_normal((1, 4, 4, 3)).astype(np.float32)
    got = m.run({"input": x})
    ref = small_ref(x)
    np.testing.assert_allclose(got["Identity"], ref[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["Identity_1"], ref[1], rtol=1e-5, atol=1e-6)
    got0 = m.run({"input:0": x})  # the TF tensor name is accepted too
    np.testing.assert_array_equal(got0["Identity"], got["Identity"])


def test_input_shape_and_outputs_options(tmp_path: Path) -> None:
    pb = small_graph().save(tmp_path / "m.pb")
    x = RNG.standard_normal((3, 4, 4, 3)).astype(np.float32)
    np.savez(tmp_path / "in.npz", **{"input:0": x})
    out = tmp_path / "out.npz"
    rc = cli.main(["build", str(pb), "-o", str(tmp_path / "art"), "--input-shape", "input:0=3x4x4x3",
                   "--outputs", "relu:0,ids:1"])
    assert rc == 0
    assert cli.main(["run", str(tmp_path / "art"), "--inputs", str(tmp_path / "in.npz"), "--outputs", str(out)]) == 0
    ref = small_ref(x)
    with np.load(out) as z:
        assert sorted(z.files) == ["ids:1", "relu"]
        np.testing.assert_allclose(z["relu"], ref[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(z["ids:1"], ref[1], rtol=1e-5, atol=1e-6)


def test_unknown_dims_need_input_shape(tmp_path: Path) -> None:
    g = G()
    g.placeholder("img", [-1, -1, -1, 3])
    g.node("r", "Relu", ["img"], T=1)
    with pytest.raises(ShapeError, match=r"img \[1, '\?', '\?', 3\].*--input-shape"):
        from_graphdef(g.gd)
    graph = from_graphdef(g.gd, input_shapes={"img": (2, 5, 5, 3)})
    assert graph.types["r"].shape == (2, 5, 5, 3)
    g2 = G()
    g2.placeholder("img", None)
    g2.node("r", "Relu", ["img"], T=1)
    with pytest.raises(ShapeError, match="unknown rank"):
        from_graphdef(g2.gd)
    with pytest.raises(GraphError, match="not inputs"):
        from_graphdef(g.gd, input_shapes={"nope": (1,)})
    with pytest.raises(GraphError, match="name no node"):
        from_graphdef(g.gd, outputs=["missing"], input_shapes={"img": (1, 2, 2, 3)})


def test_pbtxt(tmp_path: Path) -> None:
    path = tmp_path / "m.pbtxt"
    path.write_text(text_format.MessageToString(small_graph(batch=1).gd))
    m = polyml.compile(path, tmp_path / "art", threads=1)
    x = RNG.standard_normal((1, 4, 4, 3)).astype(np.float32)
    np.testing.assert_allclose(m.run({"input": x})["Identity"], small_ref(x)[0], rtol=1e-5, atol=1e-6)
    bad = tmp_path / "bad.pbtxt"
    bad.write_text('node { name: "x" op: "Relu" input: ')
    with pytest.raises(ModelFormatError, match="bad.pbtxt"):
        from_graphdef(bad)


def test_tensor_forms() -> None:
    t = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT)
    for d in (2, 3):
        t.tensor_shape.dim.add(size=d)
    t.float_val.append(1.5)  # one value fills the tensor
    np.testing.assert_array_equal(tensor_to_numpy(t), np.full((2, 3), 1.5, np.float32))
    t.float_val.append(2.5)  # fewer values than elements: the last one repeats
    np.testing.assert_array_equal(tensor_to_numpy(t).reshape(-1), [1.5, 2.5, 2.5, 2.5, 2.5, 2.5])
    t2 = tensor_pb2.TensorProto(dtype=types_pb2.DT_INT64)
    t2.tensor_shape.dim.add(size=3)
    t2.tensor_content = np.array([1, -2, 3], "<i8").tobytes()
    np.testing.assert_array_equal(tensor_to_numpy(t2), [1, -2, 3])
    t3 = tensor_pb2.TensorProto(dtype=types_pb2.DT_HALF)
    t3.tensor_shape.dim.add(size=2)
    t3.half_val.extend(np.array([1.0, -0.5], np.float16).view(np.uint16).tolist())
    np.testing.assert_array_equal(tensor_to_numpy(t3), np.array([1.0, -0.5], np.float16))
    t4 = tensor_pb2.TensorProto(dtype=types_pb2.DT_BOOL)
    np.testing.assert_array_equal(tensor_to_numpy(t4), np.zeros((), bool))  # no values: zeros
    t5 = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT)
    t5.tensor_shape.dim.add(size=4)
    t5.tensor_content = b"\0" * 12
    with pytest.raises(ModelFormatError, match="content bytes"):
        tensor_to_numpy(t5)


# -- function library ---------------------------------------------------------------------------

def test_partitioned_call_is_inlined(tmp_path: Path) -> None:
    """A PartitionedCall of a library function adding its two inputs, against numpy."""
    g = G()
    g.placeholder("x", [1, 3, 4])
    g.placeholder("y", [1, 3, 4])
    g.function("add2", ["a", "b"], {"sum": "add:z:0"}, [("add", "AddV2", ["a", "b"], {"T": 1})])
    g.call("call", "add2", ["x", "y"])
    g.const("call/add", np.float32(0.0))  # takes the name the inlined node would have had
    graph = from_graphdef(g.gd)
    # the output keeps the call's name (an Identity view of the inlined Add, as for any TF Identity output)
    assert graph.outputs == ["call"]
    assert [(n.name, n.op_type) for n in graph.nodes] == [("call/add_1", "Add"), ("call", "Identity")]
    m = polyml.compile(g.save(tmp_path / "g.pb"), tmp_path / "art", threads=1, polly=False)
    x, y = (RNG.standard_normal((1, 3, 4)).astype(np.float32) for _ in range(2))
    np.testing.assert_array_equal(m.run({"x": x, "y": y})["call"], x + y)
    plain = small_graph().gd
    assert inline_functions(plain) is plain  # nothing to inline: the graph itself


def nested_calls() -> G:
    """``model`` (StatefulPartitionedCall of ``outer``) returns ``((x + y) * z - x, (x + y) * z)``
    through a nested StatefulPartitionedCall of ``add2``, a node whose op is ``add2`` itself,
    control inputs and a second output read by the graph."""
    g = G()
    for name in "xyz":
        g.placeholder(name, [1, 2, 3, 4])
    g.function("add2", ["a", "b"], {"sum": "add:z:0"}, [("add", "AddV2", ["a", "b"], {"T": 1})])
    g.function("outer", ["a", "b", "c"], {"out": "d:sum:0", "prod": "mul:z:0"}, [
        ("inner", "StatefulPartitionedCall", ["a", "b"], {"Tin": [1, 1], "Tout": [1]}),
        ("mul", "Mul", ["inner:output:0", "c"], {"T": 1}),
        ("neg", "Neg", ["a", "^mul"], {"T": 1}),
        ("d", "add2", ["mul:z:0", "neg:y:0"], {}),
    ])
    g.gd.library.function[1].node_def[0].attr["f"].func.name = "add2"
    g.node("init", "NoOp")
    g.call("model", "outer", ["x", "y", "z", "^init"], n_out=2, op="StatefulPartitionedCall")
    g.node("prod_relu", "Relu", ["model:1"], T=1)
    return g


def test_nested_calls_are_inlined(tmp_path: Path) -> None:
    g = nested_calls()
    graph = from_graphdef(g.gd, outputs=["model", "model:1", "prod_relu"])
    names = {n.name for n in graph.nodes}
    assert {"model/inner/add", "model/mul", "model/neg", "model/d/add", "prod_relu"} <= names, names
    assert "IdentityN" not in {n.op_type for n in graph.nodes}
    m = polyml.compile(g.save(tmp_path / "g.pb"), tmp_path / "art", outputs=["model", "model:1", "prod_relu"],
                       threads=1, polly=False)
    x, y, z = (RNG.standard_normal((1, 2, 3, 4)).astype(np.float32) for _ in range(3))
    got = m.run({"x": x, "y": y, "z": z})
    prod = (x + y) * z
    np.testing.assert_allclose(got["model"], prod - x, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got["model:1"], prod, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(got["prod_relu"], np.maximum(prod, 0), rtol=1e-6, atol=1e-6)


def test_inlined_unsupported_ops_listed_with_outer_ones() -> None:
    g = G()
    g.placeholder("x", [2, 3])
    g.function("f", ["a"], {"r": "relu:activations:0"}, [
        ("bits", "SomeCustomOp", ["a"], {"T": 1}),
        ("relu", "Relu", ["bits:output:0"], {"T": 1}),
    ])
    g.call("call", "f", ["x"])
    g.node("after", "Relu", ["call"], T=1)
    g.node("custom", "OtherCustomOp", ["x"], T=1)
    g.node("both", "AddV2", ["after", "custom"], T=1)
    with pytest.raises(UnsupportedError) as info:
        from_graphdef(g.gd)
    msg = str(info.value)
    assert "2 unsupported node(s)" in msg and "SomeCustomOp node 'call/bits'" in msg and "OtherCustomOp node 'custom'" in msg, msg
    assert "IdentityN" not in msg and "'call'" not in msg and "'after'" not in msg


def test_bad_function_calls() -> None:
    g = G()
    g.placeholder("x", [2])
    g.call("call", "missing", ["x"])
    with pytest.raises(ModelFormatError, match="calls function 'missing', which the graph's function library does not"):
        from_graphdef(g.gd)
    g = G()
    g.placeholder("x", [2])
    g.function("loop", ["a"], {"r": "again:output:0"}, [("again", "PartitionedCall", ["a"], {"Tin": [1], "Tout": [1]})])
    g.gd.library.function[0].node_def[0].attr["f"].func.name = "loop"
    g.call("call", "loop", ["x"])
    with pytest.raises(ModelFormatError, match="function 'loop' calls itself"):
        from_graphdef(g.gd)
    g = G()
    g.placeholder("x", [2])
    g.function("f", ["a"], {"r": "nowhere:z:0"}, [("neg", "Neg", ["a"], {"T": 1})])
    g.call("call", "f", ["x", "x"])
    with pytest.raises(ModelFormatError, match="passes 2 inputs to function 'f', which takes 1"):
        from_graphdef(g.gd)
    g.gd.node[-1].input.pop()
    with pytest.raises(ModelFormatError, match="reads 'nowhere:z:0'"):
        from_graphdef(g.gd)


# -- errors ---------------------------------------------------------------------------------------

def test_unsupported_ops_listed_at_once(tmp_path: Path) -> None:
    g = G()
    g.placeholder("x", [1, 4, 4, 2])
    g.node("lgamma", "Lgamma", ["x"], T=1)
    g.node("relu_after", "Relu", ["lgamma"], T=1)  # downstream of an unsupported node: not listed
    g.ints("mp", [[0, 0], [1, 1], [1, 1], [0, 0]])
    g.node("mirror", "MirrorPad", ["x", "mp"], T=1, mode="REFLECT")
    g.node("where", "Where", ["x"], T=1)
    g.node("bn_train", "FusedBatchNormV3", ["x", "x", "x", "x", "x"], T=1, is_training=True)
    g.node("ok", "Relu", ["x"], T=1)
    with pytest.raises(UnsupportedError) as info:
        polyml.compile(g.save(tmp_path / "m.pb"), tmp_path / "out")
    msg = str(info.value)
    assert "4 unsupported node(s)" in msg, msg
    assert "op types: FusedBatchNormV3, Lgamma, MirrorPad, Where" in msg
    for op, name in [("Lgamma", "lgamma"), ("MirrorPad", "mirror"), ("Where", "where"), ("FusedBatchNormV3", "bn_train")]:
        assert f"{op} node '{name}'" in msg
    assert "parameter 'x' is computed at run time" in msg and "REFLECT" in msg
    assert "relu" not in msg and "'ok'" not in msg
    assert not (tmp_path / "out" / "model.so").exists()


def test_control_flow_cycle_is_unsupported() -> None:
    g = G()
    g.placeholder("x", [2])
    g.node("enter", "Enter", ["x"], T=1, frame_name="loop")
    g.node("merge", "Merge", ["enter", "next"], T=1, N=2)
    g.node("body", "Relu", ["merge"], T=1)
    g.node("next", "NextIteration", ["body"], T=1)
    g.node("exit", "Exit", ["merge"], T=1)
    with pytest.raises(UnsupportedError) as info:
        from_graphdef(g.gd)
    msg = str(info.value)
    assert "op types: Enter, Exit, Merge, NextIteration" in msg and "cycle" in msg, msg


@pytest.mark.parametrize("fraction", [0.05, 0.3, 0.6, 0.95])
def test_truncated_pb(tmp_path: Path, fraction: float) -> None:
    data = (FIXTURES / "tiny_32_tf1.pb").read_bytes()
    path = tmp_path / "cut.pb"
    path.write_bytes(data[: int(len(data) * fraction)])
    with pytest.raises(ModelFormatError, match="cut.pb"):
        polyml.compile(path, tmp_path / "out")


def test_truncated_at_node_boundary(tmp_path: Path) -> None:
    """A cut between two nodes still parses; the lost ``versions`` field gives it away."""
    g = small_graph()
    full = g.gd.SerializeToString()
    g.gd.ClearField("versions")
    path = tmp_path / "cut.pb"
    path.write_bytes(g.gd.SerializeToString())
    assert len(path.read_bytes()) < len(full)
    with pytest.raises(ModelFormatError, match="truncated"):
        from_graphdef(path)


@pytest.mark.parametrize(
    "content",
    [b"", b"this is a text file, not a model\n", b'{"graph": []}', bytes(RNG.integers(0, 256, 4096, dtype=np.uint8)), "onnx"],
    ids=["empty", "text", "json", "random", "onnx"],
)
def test_not_a_graphdef(tmp_path: Path, content: bytes | str) -> None:
    if content == "onnx":
        from tests.test_errors import relu_model

        content = relu_model().SerializeToString()
    path = tmp_path / "model.pb"
    path.write_bytes(content)
    with pytest.raises(ModelFormatError, match="model.pb"):
        polyml.compile(path, tmp_path / "out")


def test_missing_file_and_cli_exit_code(tmp_path: Path, capsys) -> None:
    with pytest.raises(ModelFormatError, match="no such model file"):
        from_graphdef(tmp_path / "nope.pb")
    (tmp_path / "bad.pb").write_bytes(b"\x0a\x05hello")
    assert cli.main(["build", str(tmp_path / "bad.pb"), "-o", str(tmp_path / "x")]) == 2
    assert "bad.pb" in capsys.readouterr().err


# -- with TensorFlow (slow, skipped without it) ---------------------------------------------------

def _tf_run(gd, feeds: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
    tf = pytest.importorskip("tensorflow")
    tgd = tf.compat.v1.GraphDef()
    tgd.ParseFromString(gd.SerializeToString())
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(tgd, name="")
    with tf.compat.v1.Session(graph=graph) as sess:
        vals = sess.run([f"{o}:0" if ":" not in o else o for o in outputs], {f"{k}:0": v for k, v in feeds.items()})
    return dict(zip(outputs, vals))


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in CASES if n != "conv"])
def test_numpy_references_match_tensorflow(name: str) -> None:
    """The per-op references above are TensorFlow's semantics (NCHW convolutions need a GPU in
    TensorFlow, so the ``conv`` case is checked through the Keras fixtures instead)."""
    g, feeds, exp = CASES[name]()
    got = _tf_run(g.gd, feeds, list(exp))
    for k, ref in exp.items():
        assert rel_error(got[k], ref) <= 1e-5, k


@pytest.mark.slow
@pytest.mark.parametrize("model, args", [
    ("mobilenet_v2", ["--size", "224"]),
    ("resnet50", ["--size", "224"]),
    ("mobilenet_v2", ["--size", "224", "--tf1"]),
])
def test_keras_applications_224(model: str, args: list[str], tmp_path: Path) -> None:
    """Acceptance: freeze with TensorFlow, build with --polly --fuse, match TensorFlow's outputs."""
    pytest.importorskip("tensorflow")
    import subprocess
    import sys

    script = Path(__file__).parent.parent / "scripts" / "freeze_keras.py"
    subprocess.run([sys.executable, str(script), model, *args, "-o", str(tmp_path), "--name", "m"], check=True,
                   capture_output=True)
    if "--tf1" in args:
        gd = graph_pb2.GraphDef()
        gd.ParseFromString((tmp_path / "m.pb").read_bytes())
        assert any(n.op == "FusedBatchNormV3" for n in gd.node)
    assert cli.main(["build", str(tmp_path / "m.pb"), "--polly", "--fuse", "-o", str(tmp_path / "art")]) == 0
    out = tmp_path / "out.npz"
    assert cli.main(["run", str(tmp_path / "art"), "--inputs", str(tmp_path / "m.in.npz"), "--outputs", str(out)]) == 0
    with np.load(tmp_path / "m.out.npz") as ref, np.load(out) as got:
        for k in ref.files:
            assert rel_error(got[k], ref[k]) <= 1e-3, k
