"""`polyml bench` and polyml.benchmark: block-alternated runs, JSON report, clear errors."""

from __future__ import annotations

import json

import onnx
import pytest

from polyml import benchmark, cli
from polyml.testing import single_node_model


def test_bench_against_onnxruntime_writes_json(tmp_path) -> None:
    import numpy as np

    w = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)
    model = single_node_model("MatMul", {"x": (16, 64)}, initializers={"w": w})
    onnx.save(model, str(tmp_path / "mm.onnx"))
    rc = cli.main(["bench", str(tmp_path / "mm.onnx"), "--compare", "onnxruntime", "--repeat", "3",
                   "--threads", "1", "--json", str(tmp_path / "b.json")])
    assert rc == 0
    report = json.loads((tmp_path / "b.json").read_text())
    assert report["gflop"] == pytest.approx(2 * 16 * 64 * 32 / 1e9)
    for runner in ("polyml", "onnxruntime"):
        r = report["results"][runner]
        assert r["min_ms"] <= r["median_ms"] <= r["max_ms"]
        assert r["gflops"] > 0
    assert report["results"]["polyml"]["ratio_to_polyml"] == 1.0


def test_bench_against_openvino_computes_the_same_numbers(tmp_path) -> None:
    import numpy as np

    pytest.importorskip("openvino")
    from polyml.commands.bench import openvino_runner

    w = np.random.default_rng(1).standard_normal((64, 32)).astype(np.float32)
    model = single_node_model("MatMul", {"x": (16, 64)}, initializers={"w": w})
    onnx.save(model, str(tmp_path / "mm.onnx"))
    x = np.random.default_rng(2).standard_normal((16, 64)).astype(np.float32)
    result = openvino_runner(tmp_path / "mm.onnx", 1, {"x": x})()
    np.testing.assert_allclose(next(iter(result.values())), x @ w, rtol=1e-4, atol=1e-4)
    rc = cli.main(["bench", str(tmp_path / "mm.onnx"), "--compare", "openvino,onnxruntime", "--repeat", "3",
                   "--threads", "1", "--json", str(tmp_path / "b.json")])
    assert rc == 0
    report = json.loads((tmp_path / "b.json").read_text())
    assert set(report["results"]) == {"polyml", "openvino", "onnxruntime"}
    assert report["results"]["openvino"]["gflops"] > 0


def test_bench_unknown_peer_is_an_error(tmp_path, capsys) -> None:
    onnx.save(single_node_model("Relu", {"x": (4,)}), str(tmp_path / "r.onnx"))
    assert cli.main(["bench", str(tmp_path / "r.onnx"), "--compare", "pytorch"]) == 2
    assert "unknown peer" in capsys.readouterr().err


class _Fake:
    """Runners, clock and sleep that log every event; each call advances the clock by a unique amount."""

    def __init__(self) -> None:
        self.now = 0.0
        self.log: list[tuple[str, int]] = []  # (runner or "sleep", call index of that runner)
        self.calls: dict[str, int] = {}

    def runner(self, name: str, base: float):
        def call() -> None:
            i = self.calls.get(name, 0)
            self.calls[name] = i + 1
            self.log.append((name, i))
            self.now += base + i * 1e-6  # call i of this runner takes base + i µs

        return call

    def sleep(self, s: float) -> None:
        self.log.append(("sleep", 0))
        self.now += s

    def clock(self) -> float:
        return self.now


def test_measure_alternates_blocks_and_discards_first_of_block() -> None:
    fake = _Fake()
    runners = {"a": fake.runner("a", 1.0), "b": fake.runner("b", 2.0)}
    seen: list[tuple[str, int, int]] = []
    times = benchmark.measure(runners, warmup=2, repeat=7, block=4, settle_s=0.5, clock=fake.clock, sleep=fake.sleep,
                              progress=lambda phase, done, total: seen.append((phase, done, total)))
    # 3 timed per block → blocks of 3+3+1 timed, each after a sleep and one untimed call
    assert {k: len(v) for k, v in times.items()} == {"a": 7, "b": 7}
    assert fake.calls == {"a": 2 + 3 + 7, "b": 2 + 3 + 7}
    warm = [("a", 0), ("a", 1), ("b", 0), ("b", 1)]
    assert fake.log[:4] == warm
    # after warm-up: a sleep, then a block of one runner; blocks of a and b alternate, round after round
    blocks: list[list[str]] = []
    for name, _ in fake.log[4:]:
        if name == "sleep":
            blocks.append([])
        else:
            blocks[-1].append(name)
    assert fake.log[4] == ("sleep", 0)
    assert [b[0] for b in blocks] == ["a", "b"] * 3
    assert all(len(set(b)) == 1 for b in blocks)
    assert [len(b) for b in blocks] == [4, 4, 4, 4, 2, 2]
    # which calls were timed: call i takes base + i µs, so the times name the call indices
    timed_a = [round((t - 1.0) * 1e6) for t in times["a"]]
    timed_b = [round((t - 2.0) * 1e6) for t in times["b"]]
    # per runner: warm-up calls 0,1; block 1 = call 2 untimed, 3-5 timed; block 2 = 6 untimed, 7-9; block 3 = 10, 11
    assert timed_a == timed_b == [3, 4, 5, 7, 8, 9, 11]
    assert seen[0] == ("warm-up", 0, 24) and seen[-1] == ("timing", 24, 24)
    assert [d for _, d, _ in seen] == list(range(25))


def test_measure_without_settle_or_blocks() -> None:
    fake = _Fake()
    runners = {"a": fake.runner("a", 1.0), "b": fake.runner("b", 1.0), "c": fake.runner("c", 1.0)}
    times = benchmark.measure(runners, warmup=0, repeat=3, block=1, settle_s=0, clock=fake.clock, sleep=fake.sleep)
    assert ("sleep", 0) not in fake.log
    # block=1: call-by-call alternation, every call timed
    assert [n for n, _ in fake.log] == ["a", "b", "c"] * 3
    assert all(len(v) == 3 for v in times.values())
    times = benchmark.measure({"a": fake.runner("a", 1.0)}, warmup=0, repeat=2, block=6, settle_s=0,
                              clock=fake.clock, sleep=fake.sleep)
    assert len(times["a"]) == 2 and fake.calls["a"] == 3 + 3  # one untimed + two timed in the last block
    with pytest.raises(ValueError):
        benchmark.measure(runners, repeat=3, block=0)


def test_summarize() -> None:
    s = benchmark.summarize({"a": [0.003, 0.001, 0.002], "b": [0.004]})
    assert s["a"] == {"median_ms": pytest.approx(2.0), "min_ms": pytest.approx(1.0), "max_ms": pytest.approx(3.0), "n": 3}
    assert s["b"]["median_ms"] == pytest.approx(4.0)


def test_profile_times_every_op_function(tmp_path, capsys) -> None:
    """``polyml bench --profile``: each op function timed alone through ``polyml_step``, with
    the kernel's choice and its flop count, listed by the CLI and written to the JSON."""
    import numpy as np
    from onnx import TensorProto, helper

    from polyml.compiler import compile as polyml_compile

    rng = np.random.default_rng(0)
    w = rng.standard_normal((32, 16, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("MaxPool", ["c"], ["y"], kernel_shape=[2, 2])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 32, 4, 4])],
                              [helper.make_tensor("w", TensorProto.FLOAT, w.shape, w.ravel())])
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    compiled = polyml_compile(path, tmp_path / "build")
    x = {"x": rng.standard_normal((1, 16, 8, 8)).astype(np.float32)}
    rows = compiled.profile(x, repeat=3)
    assert [r["op_type"] for r in rows] == ["Conv", "MaxPool"]
    assert all(r["median_s"] > 0 for r in rows)
    assert all(0 < r["min_s"] <= r["median_s"] for r in rows)
    assert rows[0]["flops"] == 2.0 * 32 * 16 * 64 and "16->32" in rows[0]["detail"]
    assert cli.main(["bench", str(tmp_path / "build"), "--repeat", "2", "--warmup", "0", "--settle", "0",
                     "--profile", "5", "--json", str(tmp_path / "b.json")]) == 0
    report = capsys.readouterr().out
    assert "per op type" in report and "MaxPool" in report
    assert len(json.loads((tmp_path / "b.json").read_text())["profile"]) == 2


def test_steps_vs_onnxruntime_sums_fused_nodes_per_block(capsys) -> None:
    """scripts/steps_vs_onnxruntime.py --by-block: onnxruntime's nodes that carry a longer name
    than polyml's step (a QuickGelu fused from the SiLU polyml runs as the conv's epilogue) are
    summed under the step whose name is their path prefix; nodes of no step keep their own block."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "steps_vs_onnxruntime.py"
    spec = importlib.util.spec_from_file_location("steps_vs_onnxruntime", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    steps = [{"node": "/f/f.0/block/block.0/block.0.0/Conv", "op_type": "Conv", "min_s": 3e-3},
             {"node": "/f/f.1/block/block.1/block.1.0/Conv", "op_type": "Conv", "min_s": 1e-3}]
    ort = {"/f/f.0/block/block.0/block.0.0/Conv": ("Conv", 1.0), "/f/f.0/block/block.0/block.0.2/Mul": ("QuickGelu", 1.0),
           "/f/f.1/block/block.1/block.1.0/Conv": ("Conv", 2.0), "ReorderOutput_7": ("ReorderOutput", 0.5)}
    script.print_blocks(steps, ort)
    rows = {next(f for f in line.split() if f.endswith(":")).rstrip(":"): line.split()
            for line in capsys.readouterr().out.splitlines()[2:]}
    assert rows["/f/f.0/block/block.0"][:3] == ["3.000", "2.000", "1.50"]
    assert rows["/f/f.0/block/block.0"][-2:] == ["Conv", "QuickGelu"]
    assert rows["/f/f.1/block/block.1"][:3] == ["1.000", "2.000", "0.50"]
    assert rows["(none)"][:2] == ["0.000", "0.500"]
