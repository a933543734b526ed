"""The errors polyml reports to users. Each carries one clear message; none is a crash."""

from __future__ import annotations


class PolymlError(Exception):
    """Base class: anything polyml reports as a user-facing error (CLI exit code 2)."""


class ModelFormatError(PolymlError):
    """The model file is missing, truncated, malformed or refers to data it may not read."""


class GraphError(PolymlError):
    """The graph is structurally invalid (cycles, undefined tensors, bad attributes)."""


class ShapeError(PolymlError):
    """A shape is not static, or operands have incompatible shapes."""


class UnsupportedError(PolymlError):
    """Operators (or dtypes) polyml cannot lower; lists every offending node at once."""

    def __init__(self, problems: list[tuple[str, str, str]]):
        self.problems = problems
        lines = [f"  - {op} node {name!r}: {why}" for name, op, why in problems]
        ops = sorted({op for _, op, _ in problems})
        super().__init__(
            f"{len(problems)} unsupported node(s) (op types: {', '.join(ops)}):\n" + "\n".join(lines)
        )


class ToolchainError(PolymlError):
    """An external tool (opt, llc, clang) is missing or failed."""


class InputError(PolymlError):
    """Inputs given at run time do not match the compiled model's interface."""


def index_out_of_range(what: str) -> InputError:
    """The error of a run whose step ``what`` (``"Gather node 'y'"``) met an index out of range
    in the input data (CPU builds, the CUDA emulator and a device alike)."""
    return InputError(f"{what}: an index in the input data is out of range (the outputs are not valid)")


class EmulationError(PolymlError):
    """The CUDA emulator found a kernel fault (an out-of-bounds access, a barrier not every
    thread of a block reaches) or cannot emulate a kernel."""
