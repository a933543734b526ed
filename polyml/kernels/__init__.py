"""Operator lowerings: one module per op family, each registering :class:`Kernel` subclasses.

A kernel says three things about an op type:

* ``infer`` — the static output types from the input types (and compile-time input values);
* ``lower`` — the loop nests that compute it, written with :class:`polyml.codegen.KernelBuilder`;
* how the driver treats it: ``alias`` ops (Reshape, Flatten, ...) emit no code and reuse their
  input's memory, ``static_inputs`` must be compile-time constants (shape-like operands) and are
  not passed to the generated code, ``temps`` are scratch buffers the nest needs, and ``polly``
  names the Polly policy for the op's function (see :mod:`polyml.driver.flags`).

Every module in this package is imported on first use, so adding a file adds its ops.
"""

from __future__ import annotations

import copy
import importlib
import pkgutil
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from polyml.codegen.builder import KernelBuilder
from polyml.errors import GraphError, ShapeError
from polyml.graph import Node, TensorType
from polyml.options import CodegenConfig


@dataclass(frozen=True)
class Operand:
    """What ``infer`` knows of an input: its type and, for constants, its value."""

    name: str
    type: TensorType
    value: np.ndarray | None = None


class Kernel:
    """Base class for an op family's lowering. Subclasses set ``op_types`` and override methods."""

    op_types: ClassVar[tuple[str, ...]] = ()
    #: output 0 is a view of input 0's memory (no code is emitted)
    alias: ClassVar[bool] = False
    #: input indices that must be constants at compile time and are not passed as buffers
    static_inputs: ClassVar[tuple[int, ...]] = ()
    #: Polly policy of the op's function: "polly" (full), "tile" (keep schedule, tile and
    #: parallelize), or "off" (plain -O3). Chosen per op family by measurement.
    polly: ClassVar[str] = "polly"
    #: dtypes the op's data inputs may have (static inputs are checked by ``infer``)
    dtypes: ClassVar[frozenset[str]] = frozenset({"float32"})
    #: the build's code generation choices (:meth:`configured`); registered instances have the
    #: plain configuration (no packed GEMM), as CUDA and the SCoP tools lower
    config: CodegenConfig = CodegenConfig()

    def configured(self, config: CodegenConfig) -> Kernel:
        """This kernel for a build of ``config`` (a copy; the registered instance is unchanged)."""
        k = copy.copy(self)
        k.config = config
        return k

    def infer(self, node: Node, ins: list[Operand | None]) -> list[TensorType]:
        raise NotImplementedError

    def describe(self, node: Node, ins: list[Operand | None], outs: list[TensorType]) -> str:
        """A short note of what the lowering chose for this node (profiles, manifest)."""
        return ""

    def policy(self, node: Node, ins: list[Operand | None]) -> str:
        """The Polly policy for this node's function (default: the family's ``polly``)."""
        return self.polly

    def temps(self, node: Node, ins: list[Operand | None], outs: list[TensorType]) -> list[TensorType]:
        return []

    def constants(self, node: Node, ins: list[Operand | None]) -> list[np.ndarray]:
        """Compile-time arrays derived from constant inputs (weights re-laid out for the packed
        GEMM): passed to the op function after its temps (``k.constants``), stored with the weights."""
        return []

    def replaced_inputs(self, node: Node, ins: list[Operand | None]) -> set[int]:
        """Inputs that :meth:`constants` replace: not passed to the op function (``k.inputs``
        holds None there) and not stored unless another op reads them."""
        return set()

    def lower(self, k: KernelBuilder) -> None:
        raise NotImplementedError

    def supports(self, node: Node, ins: list[Operand | None]) -> str | None:
        """Return why this node cannot be lowered (unsupported dtype or mode), or None."""
        for i, op in enumerate(ins):
            if op is not None and i not in self.static_inputs and op.type.dtype not in self.dtypes:
                return unsupported_dtype(i, op, self.dtypes)
        return None


def unsupported_dtype(i: int, op: Operand, allowed: frozenset[str] | set[str]) -> str:
    """The reason text for input ``i`` of a dtype the kernel does not compute on."""
    hint = " (float16 models: convert to float32 first)" if op.type.dtype == "float16" else ""
    return f"input {i} ({op.name!r}) is {op.type.dtype}; supported: {', '.join(sorted(allowed))}{hint}"


REGISTRY: dict[str, Kernel] = {}
_loaded = False


def register(cls: type[Kernel]) -> type[Kernel]:
    """Class decorator: register one instance of ``cls`` for each of its ``op_types``."""
    inst = cls()
    for op in cls.op_types:
        register_instance(op, inst)
    return cls


def register_instance(op: str, kernel: Kernel) -> None:
    """Register ``kernel`` for ``op`` (families whose op list is built from a table)."""
    if op in REGISTRY:
        raise RuntimeError(f"op {op} registered twice ({type(REGISTRY[op]).__name__}, {type(kernel).__name__})")
    REGISTRY[op] = kernel


def registry(config: CodegenConfig | None = None) -> dict[str, Kernel]:
    """All kernels by op type (imports every module of this package once); with ``config``,
    each configured for it (one copy per kernel instance, shared by its op types)."""
    global _loaded
    if not _loaded:
        _loaded = True
        for info in pkgutil.iter_modules(__path__):
            if not info.name.startswith("_"):
                importlib.import_module(f"{__name__}.{info.name}")
    if config is None or config == Kernel.config:
        return REGISTRY
    copies: dict[int, Kernel] = {}
    return {op: copies.setdefault(id(k), k.configured(config)) for op, k in REGISTRY.items()}


# -- helpers shared by kernels' shape inference ---------------------------------------------

def broadcast_shapes(node: Node, *shapes: tuple[int, ...]) -> tuple[int, ...]:
    """numpy (multidirectional) broadcasting, with an error naming the node."""
    try:
        return tuple(int(d) for d in np.broadcast_shapes(*shapes))
    except ValueError:
        raise ShapeError(f"{node.op_type} node {node.label!r}: shapes {list(shapes)} do not broadcast") from None


def normalize_axis(node: Node, axis: int, rank: int) -> int:
    if not -rank <= axis < max(rank, 1):
        raise GraphError(f"{node.op_type} node {node.label!r}: axis {axis} out of range for rank {rank}")
    return axis % rank if rank else 0


def const_ints(node: Node, op: Operand | None, what: str) -> list[int]:
    """A compile-time int tensor input (shape, axes, pads), flattened to a Python list."""
    if op is None:
        return []
    if op.value is None:
        raise ShapeError(
            f"{node.op_type} node {node.label!r}: {what} ({op.name!r}) must be a compile-time "
            "constant (polyml compiles static shapes)"
        )
    return [int(v) for v in np.asarray(op.value).reshape(-1)]
