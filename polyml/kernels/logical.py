"""Comparisons, logic, predicates, selection and conversion: the ops that make and use bool and
integer tensors (attention masks, position ids, ``Where``/``Cast`` chains).

All are scalar functions of one element per input (broadcast), lowered by the shared
elementwise kernel.  bool tensors hold one byte per element, 0 or 1, as numpy's.
"""

from __future__ import annotations

import llvmlite.ir as ir
import numpy as np
from onnx import helper

from polyml.codegen.builder import LLVM_TYPES
from polyml.errors import GraphError
from polyml.graph import Node
from polyml.kernels._scalar import ANY, BOOL, FLOAT, INTS, Scalar, boolean, scalar_op

COMPARISONS = {"Equal": "==", "Less": "<", "LessOrEqual": "<=", "Greater": ">", "GreaterOrEqual": ">="}


@scalar_op(*COMPARISONS, dtypes=ANY, result=boolean)
def _compare(s: Scalar, v: list[ir.Value]) -> ir.Value:
    return s.to_bool(s.compare(COMPARISONS[s.node.op_type], v[0], v[1]))


LOGIC = {"And": "and_", "Or": "or_", "Xor": "xor"}


@scalar_op(*LOGIC, dtypes=BOOL)
def _logic(s: Scalar, v: list[ir.Value]) -> ir.Value:
    return getattr(s.b, LOGIC[s.node.op_type])(v[0], v[1])


@scalar_op("Not", dtypes=BOOL)
def _not(s: Scalar, v: list[ir.Value]) -> ir.Value:
    return s.b.xor(v[0], s.const(1, "bool"))


BITWISE = {"BitwiseAnd": "and_", "BitwiseOr": "or_", "BitwiseXor": "xor"}
#: bit operations act on the two's-complement bytes, the same for signed and unsigned types
BIT_TYPES = INTS | {"int8", "uint8"}


@scalar_op(*BITWISE, dtypes=BIT_TYPES)
def _bitwise(s: Scalar, v: list[ir.Value]) -> ir.Value:
    return getattr(s.b, BITWISE[s.node.op_type])(v[0], v[1])


@scalar_op("BitwiseNot", dtypes=BIT_TYPES)
def _bitwise_not(s: Scalar, v: list[ir.Value]) -> ir.Value:
    return s.b.xor(v[0], s.const(-1))


@scalar_op("IsNaN", dtypes=FLOAT, result=boolean)
def _isnan(s: Scalar, v: list[ir.Value]) -> ir.Value:
    return s.to_bool(s.b.fcmp_unordered("uno", v[0], v[0]))


@scalar_op("IsInf", dtypes=FLOAT, result=boolean)
def _isinf(s: Scalar, v: list[ir.Value]) -> ir.Value:
    x = v[0]
    pos = s.b.fcmp_ordered("==", x, s.f(np.inf)) if s.attr("detect_positive", 1) else ir.Constant(ir.IntType(1), 0)
    neg = s.b.fcmp_ordered("==", x, s.f(-np.inf)) if s.attr("detect_negative", 1) else ir.Constant(ir.IntType(1), 0)
    return s.to_bool(s.b.or_(pos, neg))


def _where_result(node: Node, dtypes: list[str]) -> str:
    return dtypes[1]


@scalar_op("Where", dtypes=ANY, result=_where_result, same_dtype=False, per_input=(BOOL,))
def _where(s: Scalar, v: list[ir.Value]) -> ir.Value:
    if s.dtypes[1] != s.dtypes[2]:
        raise GraphError(f"Where node {s.node.label!r}: branches are {s.dtypes[1]} and {s.dtypes[2]}")
    return s.select(s.truth(v[0]), v[1], v[2])


def cast_target(node: Node) -> str:
    """The dtype name Cast's ``to`` attribute (an ONNX TensorProto type) names."""
    to = node.attrs.get("to")
    try:
        name = np.dtype(helper.tensor_dtype_to_np_dtype(int(to))).name
    except Exception:
        raise GraphError(f"Cast node {node.label!r}: unknown target type {to!r}") from None
    if name not in LLVM_TYPES:
        raise GraphError(f"Cast node {node.label!r}: casting to {name} is not supported (supported: {', '.join(LLVM_TYPES)})")
    return name


def _cast_result(node: Node, dtypes: list[str]) -> str:
    return cast_target(node)


@scalar_op("Cast", dtypes=ANY, result=_cast_result)
def _cast(s: Scalar, v: list[ir.Value]) -> ir.Value:
    return s.convert(v[0], s.dtypes[0], cast_target(s.node))
