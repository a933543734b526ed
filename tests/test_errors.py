"""The error contract: every way a model, its data or the toolchain can be wrong raises a
:class:`polyml.errors.PolymlError` subclass with a message that says what and where — never a
traceback from protobuf, numpy, ctypes or a crash of native code.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import polyml
from polyml.errors import (
    InputError,
    ModelFormatError,
    PolymlError,
    ShapeError,
    ToolchainError,
    UnsupportedError,
)
from polyml.frontends.onnx import from_onnx

RNG = np.random.default_rng(0)


def save(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, str(path))
    return path


def relu_model(shape: list[int | str] | None = None, dtype: int = TensorProto.FLOAT) -> onnx.ModelProto:
    """x → Add(w) → Relu → y, with a 4x4 weight (so the file has a tensor to truncate)."""
    shape = shape or [4, 4]
    w = numpy_helper.from_array(RNG.standard_normal((4, 4)).astype(np.float32), "w")
    nodes = [helper.make_node("Add", ["x", "w"], ["a"], name="add0"), helper.make_node("Relu", ["a"], ["y"], name="relu0")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", dtype, shape)],
        [helper.make_tensor_value_info("y", dtype, None)], initializer=[w],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


# -- unsupported operators -------------------------------------------------------------------

def test_unsupported_ops_are_all_listed(tmp_path: Path) -> None:
    """Three unsupported nodes of two op types: one error naming all three, nothing else."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu_ok"),
        helper.make_node("NonZero", ["r"], ["nz_a"], name="first_nonzero"),
        helper.make_node("Unique", ["x"], ["u"], name="the_unique"),
        helper.make_node("NonZero", ["u"], ["nz_b"], name="second_nonzero"),  # after another unsupported node
        helper.make_node("Relu", ["x"], ["y"], name="relu_fine"),
    ]
    outs = [helper.make_empty_tensor_value_info(o) for o in ("nz_a", "nz_b", "y")]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], outs), opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(UnsupportedError) as info:
        polyml.compile(save(model, tmp_path / "m.onnx"), tmp_path / "out")
    msg = str(info.value)
    assert "3 unsupported node(s)" in msg
    assert "op types: NonZero, Unique" in msg
    for op, name in [("NonZero", "first_nonzero"), ("Unique", "the_unique"), ("NonZero", "second_nonzero")]:
        assert f"{op} node '{name}'" in msg, msg
    assert "relu" not in msg
    assert sorted(p[0] for p in info.value.problems) == ["first_nonzero", "second_nonzero", "the_unique"]
    assert not (tmp_path / "out" / "model.so").exists()


@pytest.mark.parametrize("dtype, np_dtype", [(TensorProto.INT64, np.int64), (TensorProto.DOUBLE, np.float64)])
def test_non_float32_data_to_float_ops(tmp_path: Path, dtype: int, np_dtype: type) -> None:
    """int64 or double data reaching float-only ops: UnsupportedError naming node and dtype."""
    x = helper.make_tensor_value_info("x", dtype, [3])
    nodes = [helper.make_node("Sigmoid", ["x"], ["a"], name="sigmoid_int"), helper.make_node("Relu", ["x"], ["b"], name="relu_int")]
    outs = [helper.make_empty_tensor_value_info(o) for o in ("a", "b")]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], outs), opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(UnsupportedError) as info:
        polyml.compile(save(model, tmp_path / "m.onnx"), tmp_path / "out")
    msg = str(info.value)
    dname = np.dtype(np_dtype).name
    assert "Sigmoid node 'sigmoid_int'" in msg and "Relu node 'relu_int'" in msg
    assert f"is {dname}" in msg and "float32" in msg, msg


def test_float16_model_is_refused_clearly(tmp_path: Path) -> None:
    """float16 data anywhere (compute ops and views alike): every node listed, with the hint."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT16, [2, 3])
    nodes = [helper.make_node("Identity", ["x"], ["i"], name="copy"), helper.make_node("Relu", ["i"], ["y"], name="act")]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [helper.make_empty_tensor_value_info("y")]),
                              opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(UnsupportedError) as info:
        polyml.compile(save(model, tmp_path / "m.onnx"), tmp_path / "out")
    msg = str(info.value)
    assert "Identity node 'copy'" in msg and "float16" in msg and "convert to float32" in msg, msg


# -- shapes ----------------------------------------------------------------------------------

def test_dynamic_input_shape_and_override(tmp_path: Path) -> None:
    path = save(relu_model(["batch", 4]), tmp_path / "m.onnx")
    with pytest.raises(ShapeError) as info:
        polyml.compile(path, tmp_path / "out")
    msg = str(info.value)
    assert "'batch'" in msg and "x" in msg and "input_shapes" in msg, msg
    model = polyml.compile(path, tmp_path / "out", input_shapes={"x": (4, 4)})
    xv = RNG.standard_normal((4, 4)).astype(np.float32)
    w = numpy_helper.to_array(onnx.load(str(path)).graph.initializer[0])
    np.testing.assert_allclose(model.run({"x": xv})["y"], np.maximum(xv + w, 0), rtol=1e-6)


def test_input_without_shape(tmp_path: Path) -> None:
    model = relu_model()
    model.graph.input[0].type.tensor_type.ClearField("shape")
    with pytest.raises(ShapeError, match="no shape"):
        polyml.compile(save(model, tmp_path / "m.onnx"), tmp_path / "out")


# -- bad files -------------------------------------------------------------------------------

@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.9])
def test_truncated_file(tmp_path: Path, fraction: float) -> None:
    data = relu_model().SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: int(len(data) * fraction)])
    with pytest.raises(ModelFormatError, match="cut.onnx"):
        polyml.compile(path, tmp_path / "out")


@pytest.mark.parametrize(
    "content",
    [b"", b"this is a text file, not a model\n", b'{"graph": []}', bytes(RNG.integers(0, 256, 4096, dtype=np.uint8))],
    ids=["empty", "text", "json", "random"],
)
def test_not_an_onnx_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(content)
    with pytest.raises(ModelFormatError, match="model.onnx"):
        polyml.compile(path, tmp_path / "out")


def test_op_type_not_utf8(tmp_path: Path) -> None:
    """A byte-flipped op type (protobuf hands it over as bytes): one ModelFormatError naming it."""
    data = relu_model().SerializeToString()
    i = data.index(b"Relu")
    path = tmp_path / "flipped.onnx"
    path.write_bytes(data[:i] + b"\xffelu" + data[i + 4 :])
    with pytest.raises(ModelFormatError) as info:
        polyml.compile(path, tmp_path / "out")
    msg = str(info.value)
    assert "flipped.onnx" in msg and "UTF-8" in msg and "op_type" in msg and "\n" not in msg, msg


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelFormatError, match="no such model file"):
        polyml.compile(tmp_path / "nope.onnx", tmp_path / "out")


def test_unknown_suffix(tmp_path: Path) -> None:
    path = tmp_path / "model.txt"
    path.write_text("hello")
    with pytest.raises(ModelFormatError, match="unknown model format"):
        polyml.compile(path, tmp_path / "out")


def _external(model: onnx.ModelProto, location: str) -> onnx.ModelProto:
    """Move the weight ``w`` to external data at ``location`` (relative to the model file)."""
    t = model.graph.initializer[0]
    t.ClearField("raw_data")
    t.ClearField("float_data")
    t.data_location = TensorProto.EXTERNAL
    del t.external_data[:]
    t.external_data.add(key="location", value=location)
    return model


@pytest.mark.parametrize("location", ["../secret.bin", "sub/../../secret.bin", "/etc/passwd"])
def test_external_data_outside_model_folder(tmp_path: Path, location: str) -> None:
    folder = tmp_path / "model"
    (folder / "sub").mkdir(parents=True)
    (tmp_path / "secret.bin").write_bytes(np.ones(16, np.float32).tobytes())
    path = save(_external(relu_model(), location), folder / "m.onnx")
    with pytest.raises(ModelFormatError, match="outside the model's folder") as info:
        polyml.compile(path, tmp_path / "out")
    assert "'w'" in str(info.value) and location in str(info.value)


def test_external_data_inside_folder_loads_and_missing_file_fails(tmp_path: Path) -> None:
    model = relu_model()
    w = numpy_helper.to_array(model.graph.initializer[0])
    (tmp_path / "w.bin").write_bytes(w.tobytes())
    path = save(_external(model, "w.bin"), tmp_path / "m.onnx")
    xv = RNG.standard_normal((4, 4)).astype(np.float32)
    np.testing.assert_allclose(polyml.compile(path, tmp_path / "out").run({"x": xv})["y"], np.maximum(xv + w, 0), rtol=1e-6)
    (tmp_path / "w.bin").unlink()
    with pytest.raises(ModelFormatError, match="missing"):
        polyml.compile(path, tmp_path / "out2")


# -- run-time inputs -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> polyml.runtime.model.CompiledModel:
    tmp = tmp_path_factory.mktemp("compiled")
    return polyml.compile(save(relu_model(), tmp / "m.onnx"), tmp / "out")


@pytest.mark.parametrize(
    "feeds, words",
    [
        ({"input": np.zeros((4, 4), np.float32)}, ["missing ['x']", "unexpected ['input']"]),
        ({}, ["missing ['x']"]),
        ({"x": np.zeros((4, 4), np.float32), "z": np.zeros(1, np.float32)}, ["unexpected ['z']"]),
        ({"x": np.zeros((4, 5), np.float32)}, ["shape (4, 5)", "(4, 4)"]),
        ({"x": np.zeros((16,), np.float32)}, ["shape (16,)"]),
        ({"x": np.zeros((4, 4), np.float64)}, ["dtype float64", "float32"]),
        ({"x": np.zeros((4, 4), np.int64)}, ["dtype int64"]),
        ({"x": [[0.0] * 4] * 4}, ["numpy array", "list"]),
    ],
    ids=["wrong-name", "none", "extra", "wrong-shape", "flat", "float64", "int64", "list"],
)
def test_run_time_input_errors(compiled: polyml.runtime.model.CompiledModel, feeds: dict, words: list[str]) -> None:
    with pytest.raises(InputError) as info:
        compiled.run(feeds)
    for w in words:
        assert w in str(info.value), str(info.value)


def test_run_time_inputs_not_a_dict(compiled: polyml.runtime.model.CompiledModel) -> None:
    with pytest.raises(InputError, match="dict"):
        compiled.run(np.zeros((4, 4), np.float32))  # type: ignore[arg-type]


def test_non_contiguous_input_is_accepted(compiled: polyml.runtime.model.CompiledModel) -> None:
    """Not an error: a transposed view is copied before native code sees it."""
    x = RNG.standard_normal((4, 4)).astype(np.float32)
    a = compiled.run({"x": x.T})["y"]
    b = compiled.run({"x": np.ascontiguousarray(x.T)})["y"]
    np.testing.assert_array_equal(a, b)


# -- toolchain failure -----------------------------------------------------------------------

def test_opt_failure_saves_ir_and_reproducible_command(tmp_path: Path) -> None:
    out = tmp_path / "out"
    flag = "-this-flag-does-not-exist"
    with pytest.raises(ToolchainError) as info:
        polyml.compile(save(relu_model(), tmp_path / "m.onnx"), out, extra_opt_flags=(flag,))
    msg = str(info.value)
    failed = out / "failed"
    assert msg.startswith("opt ("), msg
    assert str(failed) in msg and flag in msg, msg
    saved = re.search(r"input saved to: (.+)", msg).group(1).split(", ")
    assert saved and all(Path(p).is_file() and Path(p).parent == failed and p.endswith(".ll") for p in saved), saved
    assert "define " in Path(saved[0]).read_text()  # the real module, not an empty file
    stem = Path(saved[0]).stem
    assert (failed / f"{stem}.command.sh").is_file() and (failed / f"{stem}.stderr.txt").is_file()

    # the command in the message fails again, the same way
    cmd = re.search(r"reproduce with: (.+)", msg).group(1)
    assert saved[0] in cmd
    again = subprocess.run(cmd, shell=True, capture_output=True, text=True)
    assert again.returncode != 0
    assert flag.lstrip("-") in again.stderr
    first_error = msg.splitlines()[0].split(": ", 1)[1]
    assert first_error in again.stderr

    # and without the bad flag the saved IR compiles: the failure is the flag, not the input
    args = [a for a in shlex.split(cmd) if a != flag]
    args[args.index("-o") + 1] = str(tmp_path / "fixed.ll")
    ok = subprocess.run(args, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr


def test_every_error_is_a_polyml_error() -> None:
    for cls in (InputError, ModelFormatError, ShapeError, ToolchainError, UnsupportedError):
        assert issubclass(cls, PolymlError)


def test_from_onnx_rejects_undefined_tensor() -> None:
    """A node reading a tensor nobody produces is a GraphError, not a KeyError."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    node = helper.make_node("Add", ["x", "ghost"], ["y"], name="add_ghost")
    model = helper.make_model(helper.make_graph([node], "g", [x], [helper.make_empty_tensor_value_info("y")]),
                              opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(PolymlError, match="ghost"):
        from_onnx(model)


def test_reproduce_command_output_path_exists(tmp_path: Path) -> None:
    """The saved command is runnable as printed: its output goes somewhere that still exists."""
    out = tmp_path / "out"
    with pytest.raises(ToolchainError) as info:
        polyml.compile(save(relu_model(), tmp_path / "m.onnx"), out, extra_opt_flags=("-this-flag-does-not-exist",))
    args = shlex.split(re.search(r"reproduce with: (.+)", str(info.value)).group(1))
    assert Path(args[args.index("-o") + 1]).parent.is_dir()
