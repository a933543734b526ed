"""Pictures (polyml/plot, the `plot` extra): what is drawn is counted in the SVG and compared with
isl's counts and the build's reports — points of a domain slice, tiles, dependence arrows, fused
nests and refused edges, roofline points, latency boxes — and the missing extra is one line, exit 2."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import islpy as isl
import numpy as np
import onnx
import pytest

from polyml.cli import main
from polyml.errors import PolymlError
from polyml.testing import light_model_path, randomize_weights, single_node_model

needs_mpl = pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="the plot extra is not installed")
SVG = "{http://www.w3.org/2000/svg}"


def marks(svg: Path, prefix: str) -> dict[str, ET.Element]:
    """Elements whose id matches ``prefix`` followed by a number (the gids polyml sets)."""
    pat = re.compile(re.escape(prefix) + r"\d+$")
    return {e.get("id"): e for e in ET.parse(svg).iter() if pat.match(e.get("id") or "")}


def uses(group: ET.Element) -> int:
    """Drawn markers in a scatter group (matplotlib writes one <use> per point)."""
    return sum(1 for e in group.iter(f"{SVG}use"))


def fill(group: ET.Element) -> str:
    style = next(e.get("style", "") for e in group.iter(f"{SVG}use"))
    return re.search(r"fill:\s*(#[0-9a-f]{6})", style).group(1)


@pytest.fixture(scope="module")
def transpose(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("models") / "transpose.onnx"
    onnx.save(single_node_model("Transpose", {"x": (48, 40)}, perm=[1, 0]), str(path))
    return path


def scops(args: list[str], capsys) -> dict:
    assert main(["scops", *args, "--threads", "1", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@needs_mpl
def test_tiled_transpose_points_and_tiles(transpose, tmp_path, capsys) -> None:
    """32×32 window of a 48×40 Transpose, tiled 8×12: one mark per isl point, one colour per tile."""
    report = scops([str(transpose), "--after", "tile{sizes=8,12}", "--plot", str(tmp_path)], capsys)
    (stmt,) = report["scops"][0]["statements"]
    (svg,) = tmp_path.glob("*.svg")
    window = isl.Set(stmt["domain"]).intersect(isl.Set(f"{{ {stmt['name']}[i0, i1] : 0 <= i0 < 32 and 0 <= i1 < 32 }}"))
    n_points = int(window.count_val().to_python())
    assert n_points == 32 * 32
    tiled = isl.Map(stmt["schedule"]).intersect_domain(window).range()  # [⌊i0/8⌋, ⌊i1/12⌋, i0, i1]
    tiles = int(tiled.project_out(isl.dim_type.set, 2, tiled.dim(isl.dim_type.set) - 2).count_val().to_python())
    assert tiles == 4 * 3  # rows 0-31 in 8s, columns 0-31 in 12s (0-11, 12-23, 24-31)
    for panel, n_tiles in (("p0", 1), ("p1", tiles)):
        groups = marks(svg, f"{panel}-tile-")
        assert len(groups) == n_tiles
        assert sum(uses(g) for g in groups.values()) == n_points
        assert len({fill(g) for g in groups.values()}) == n_tiles
        assert marks(svg, f"{panel}-dep-raw-") == {}  # a Transpose has no dependences
    assert "floor" in svg.read_text()  # the new schedule is printed on the picture


@needs_mpl
def test_reduction_dependence_arrows(tmp_path, capsys) -> None:
    """ReduceSum 6×10 (y[i] += x[i, j]): one arrow per raw/war/waw pair inside the slice."""
    model = tmp_path / "rsum.onnx"
    onnx.save(single_node_model("ReduceSum", {"x": (6, 10)}, initializers={"axes": np.array([1])}, keepdims=0), str(model))
    report = scops([str(model), "--plot", str(tmp_path / "pics"), "--plot-window", "4x7"], capsys)
    entry = report["scops"][0]
    stmt = next(s for s in entry["statements"] if isl.Set(s["domain"]).dim(isl.dim_type.set) == 2)
    svg = next((tmp_path / "pics").glob(f"*{stmt['name']}.svg"))
    window = isl.Set(stmt["domain"]).intersect(isl.Set(f"{{ {stmt['name']}[i0, i1] : 0 <= i0 < 4 and 0 <= i1 < 7 }}"))
    inside = isl.UnionSet.from_set(window)
    assert sum(uses(g) for g in marks(svg, "p0-tile-").values()) == window.count_val().to_python() == 28
    total = 0
    for kind in ("raw", "war", "waw"):
        pairs = isl.UnionMap(entry["dependences"][kind]).intersect_domain(inside).intersect_range(inside)
        maps: list[isl.Map] = []
        pairs.foreach_map(maps.append)
        n = sum(int(m.wrap().count_val().to_python()) for m in maps)
        assert len(marks(svg, f"p0-dep-{kind}-")) == n, kind
        total += n
    assert total == 3 * 4 * 6  # each kind: i1 → i1 + 1 within a row


@needs_mpl
def test_plot_options_are_checked(transpose, tmp_path) -> None:
    from polyml.plot import domain

    with pytest.raises(PolymlError, match="plot-window"):
        domain.parse_window("0x4")
    with pytest.raises(PolymlError, match="NAME=INT"):
        domain.parse_fix("i0")
    assert main(["scops", str(transpose), "--threads", "1", "--plot", str(tmp_path), "--plot-dims", "i0,k"]) == 2
    assert main(["scops", str(transpose), "--threads", "1", "--plot", str(tmp_path), "--plot-fix", "i1=99",
                 "--plot-dims", "i0"]) == 2  # an empty slice


@needs_mpl
def test_squeezenet_fusion_picture(tmp_path) -> None:
    """One box per fused nest, one labelled edge per refused candidate (the build's own report)."""
    from polyml.codegen.lower import lower_graph
    from polyml.compiler import read_graph
    from polyml.driver.toolchain import host_target
    from polyml.passes.fuse import FuseOperators
    from polyml.plot import fusion

    path = tmp_path / "squeezenet.onnx"
    onnx.save(randomize_weights(onnx.load(str(light_model_path("squeezenet")))), str(path))
    graph = read_graph(path)
    fused, report = FuseOperators().apply(graph)
    lowered = lower_graph(fused, host_target(), chunks=1, parallel=True, in_place_concat=True)
    rep = report.to_json()
    rep["groups"] += lowered.concat_in_place
    rep["blocked"] += lowered.concat_blocked
    nests = [g for g in rep["groups"] if g["kind"] != "concat-in-place"]
    assert len(nests) == 26 and len(rep["blocked"]) == 31  # squeezenet: conv+relu epilogues; windows, reductions
    svg = fusion.write(graph, rep, tmp_path / "fusion.svg")
    assert len(marks(svg, "nest-")) == len(nests)
    refused = marks(svg, "refused-")
    assert len(refused) == len(rep["blocked"])
    labels = {e.get("id"): "".join(e.itertext()) for e in ET.parse(svg).iter() if (e.get("id") or "").endswith("-label")}
    for k, b in enumerate(rep["blocked"]):
        assert labels[f"refused-{k}-label"].strip() == fusion.short_reason(b["reason"])
    assert len(marks(svg, "inplace-")) == sum(1 for g in rep["groups"] if g["kind"] == "concat-in-place")
    dot = fusion.write(graph, rep, tmp_path / "fusion.dot").read_text()
    assert dot.count("subgraph cluster_nest_") == len(nests)
    refused_edges = re.findall(r'\[label="([^"]+)"[^\]]* id="refused-\d+"', dot)
    assert refused_edges == [fusion.short_reason(b["reason"]) for b in rep["blocked"]]


@needs_mpl
@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed (optional)")
def test_fusion_dot_lays_out_with_graphviz(tmp_path) -> None:
    """fusion.dot as Graphviz lays it out: one cluster per nest, one edge per refusal."""
    model = tiny_cnn(tmp_path / "tiny.onnx")
    assert main(["build", str(model), "-o", str(tmp_path / "a"), "--emit", "fusion-dot", "--threads", "1"]) == 0
    fusion = json.loads((tmp_path / "a" / "manifest.json").read_text())["fusion"]
    svg = tmp_path / "dot.svg"
    subprocess.run(["dot", "-Tsvg", str(tmp_path / "a" / "fusion.dot"), "-o", str(svg)], check=True)
    assert len(marks(svg, "nest-")) == sum(1 for g in fusion["groups"] if g["kind"] != "concat-in-place") == 2
    assert len(marks(svg, "refused-")) == len(fusion["blocked"])


def test_short_reasons() -> None:
    from polyml.plot.fusion import short_reason

    assert short_reason("MaxPool reads 'r1' through a 3-tap window (stride 2, pad 0); fused on one loop: ...") \
        == "3-tap window, stride 2"
    assert short_reason("Conv reads 'r4' through a 1-tap window (stride 1, pad 0) and sums over all its channels: every") \
        == "channel reduction (1-tap)"
    assert short_reason("'t' is needed elsewhere (2 consumers)") == "2 consumers"
    assert short_reason("'t' is needed elsewhere (1 consumers, graph output)") == "graph output"
    assert short_reason("something quite new and long that nobody has seen before; details") \
        == "something quite new and long…"


def tiny_cnn(path: Path) -> Path:
    """Conv → Relu → MaxPool → Conv → Relu (1×3×16×16): a few op functions, fast to build."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((8, 8, 1, 1)).astype(np.float32), "w2")
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("MaxPool", ["r1"], ["p1"], name="pool1", kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p1", "w2"], ["c2"], name="conv2"),
             helper.make_node("Relu", ["c2"], ["y"], name="relu2")]
    g = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 8, 8])], initializer=[w1, w2])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return path


@needs_mpl
def test_build_emits_fusion_picture(tmp_path, capsys) -> None:
    model = tiny_cnn(tmp_path / "tiny.onnx")
    out = tmp_path / "art"
    assert main(["build", str(model), "-o", str(out), "--emit", "fusion.svg", "--emit", "fusion-dot", "--threads", "1"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    nests = [g for g in manifest["fusion"]["groups"] if g["kind"] != "concat-in-place"]
    assert len(nests) == 2  # conv1+relu1, conv2+relu2
    assert len(marks(out / "fusion.svg", "nest-")) == 2
    assert len(marks(out / "fusion.svg", "refused-")) == len(manifest["fusion"]["blocked"]) >= 1
    assert "fusion.svg" in manifest["files"] and "fusion.dot" in manifest["files"]


@needs_mpl
def test_roofline_one_point_per_op_function(tmp_path, monkeypatch, capsys) -> None:
    from polyml.plot import roofline

    monkeypatch.setattr(roofline, "GEMM_N", 128)
    monkeypatch.setattr(roofline, "TRIAD_N", 1 << 18)
    model = tiny_cnn(tmp_path / "tiny.onnx")
    report = tmp_path / "bench.json"
    assert main(["bench", str(model), "--repeat", "3", "--warmup", "1", "--block", "2", "--settle", "0", "--threads", "1",
                 "--profile", "3", "--json", str(report), "--plot", str(tmp_path / "roofline.svg")]) == 0
    profile = json.loads(report.read_text())["profile"]
    assert len(marks(tmp_path / "roofline.svg", "op-")) == len(profile) >= 3
    assert all(r["bytes"] > 0 for r in profile)
    conv = next(r for r in profile if r["op_type"] == "Conv" and r["flops"])
    assert conv["bytes"] >= 4 * (1 * 3 * 16 * 16 + 8 * 3 * 3 * 3)  # reads at least its input and weights
    points = roofline.points(profile)
    assert [p.counted for p in points] == [bool(r["flops"]) for r in profile]


@needs_mpl
def test_latency_one_box_per_runner(tmp_path, capsys) -> None:
    pytest.importorskip("onnxruntime")
    model = tiny_cnn(tmp_path / "tiny.onnx")
    svg = tmp_path / "latency.svg"
    assert main(["bench", str(model), "--compare", "onnxruntime", "--repeat", "4", "--warmup", "1", "--block", "3",
                 "--settle", "0", "--threads", "1", "--plot", str(svg)]) == 0
    ids = {e.get("id") for e in ET.parse(svg).iter()}
    assert {"runner-polyml", "runner-onnxruntime"} <= ids
    calls = {e.get("id"): uses(e) for e in ET.parse(svg).iter() if (e.get("id") or "").startswith("calls-")}
    assert calls == {"calls-polyml": 4, "calls-onnxruntime": 4}


def test_roofline_needs_profile(tmp_path) -> None:
    if importlib.util.find_spec("matplotlib") is None:
        pytest.skip("the plot extra is not installed")
    assert main(["bench", str(tiny_cnn(tmp_path / "t.onnx")), "--plot", str(tmp_path / "roofline.svg")]) == 2


BLOCKED = "import sys; sys.modules['matplotlib'] = None; sys.modules['graphviz'] = None; " \
          "from polyml.cli import main; sys.exit(main(sys.argv[1:]))"


@pytest.mark.parametrize("args", [["scops", "{model}", "--plot", "{tmp}/p"],
                                  ["build", "{model}", "-o", "{tmp}/a", "--emit", "fusion.svg"],
                                  ["build", "{model}", "-o", "{tmp}/a", "--emit", "fusion-dot"],
                                  ["bench", "{model}", "--profile", "3", "--plot", "{tmp}/roofline.svg"]])
def test_missing_extra_is_one_line_exit_2(args, transpose, tmp_path) -> None:
    argv = [a.format(model=transpose, tmp=tmp_path) for a in args]
    proc = subprocess.run([sys.executable, "-c", BLOCKED, *argv], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'polyml[plot]'" in lines[0], proc.stderr
    assert not (tmp_path / "a").exists()  # refused before building
