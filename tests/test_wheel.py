"""polyml as a user installs it: the sdist and the wheel built from it (scripts/dist.sh), installed
into a fresh virtual environment (not editable: its dependencies from requirements/runtime.txt with
pip --require-hashes, then the wheel), and its command line run from a folder outside the
checkout: doctor, build + run of a small CNN against onnxruntime, scops, passes and opt.

Slow (about a minute; one venv for the whole module, filled by uv from the lock)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from polyml.testing import onnxruntime_run, random_inputs, rel_error, seeded_light_model

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
#: source folders and where they install (setup.py)
INSTALLED_AS = {"polyml": "polyml"}
LOCKS = ("runtime.txt", "test.txt")


def _source_files() -> list[str]:
    """The files of the checkout a build sees: what git tracks or would add."""
    if shutil.which("git") and (ROOT / ".git").exists():
        out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout
        return [f for f in out.splitlines() if (ROOT / f).is_file()]
    return [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file()]


def _expected_modules() -> dict[str, str]:
    """{path in the wheel: source path} of every Python file of polyml."""
    want = {}
    for f in _source_files():
        top, _, rest = f.partition("/")
        if top in INSTALLED_AS and f.endswith(".py") and rest:
            want[f"{INSTALLED_AS[top]}/{rest}"] = f
    return want


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> dict[str, Path]:
    """scripts/dist.sh: the sdist, and the wheel built from it."""
    out = tmp_path_factory.mktemp("dist")
    _run(["bash", str(ROOT / "scripts" / "dist.sh"), str(out)], ROOT, {**os.environ, "PYTHON": sys.executable})
    (sdist,) = out.glob("polyml-*.tar.gz")
    (wheel,) = out.glob("polyml-*-py3-none-any.whl")
    return {"sdist": sdist, "wheel": wheel}


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict[str, str]:
    """The environment of the commands run in the fresh venv: nothing of the checkout's."""
    e = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PYTHONSTARTUP")}
    e["POLYML_CACHE_DIR"] = str(tmp_path_factory.mktemp("wheel-cache"))
    return e


@pytest.fixture(scope="module")
def venv(dist, env, tmp_path_factory) -> Path:
    """A fresh venv with the locked runtime packages and the wheel (no editable install)."""
    d = tmp_path_factory.mktemp("venv") / "venv"
    _run([sys.executable, "-m", "venv", str(d)], d.parent, env)
    pip = [str(d / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    lock = ["--require-hashes", "-r", str(ROOT / "requirements" / "runtime.txt")]
    uv = Path(sys.executable).parent / "uv"  # in the test extra: seconds where pip takes a minute and a half
    if uv.is_file():
        _run([str(uv), "pip", "install", "-q", "--native-tls", "--python", str(d / "bin" / "python"), *lock], d.parent, env)
    else:
        _run([*pip, *lock], d.parent, env)
    _run([*pip, "--no-deps", str(dist["wheel"])], d.parent, env)
    # the wheel's declared dependencies are all satisfied by the lock
    _run([str(d / "bin" / "python"), "-m", "pip", "check"], d.parent, env)
    return d


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """A folder outside the checkout to run from."""
    w = tmp_path_factory.mktemp("work")
    assert ROOT not in w.parents
    return w


def polyml(venv: Path, env: dict[str, str], work: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return _run([str(venv / "bin" / "polyml"), *args], work, env, timeout)


def test_sdist_has_every_package_and_the_locks(dist) -> None:
    with tarfile.open(dist["sdist"]) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    missing = sorted(set(_expected_modules().values()) - names)
    assert not missing, f"not in the sdist: {missing}"
    for f in ("setup.py", "pyproject.toml", "README.md", *(f"requirements/{lock}" for lock in LOCKS)):
        assert f in names, f


def test_wheel_has_every_module_and_the_locks(dist) -> None:
    with zipfile.ZipFile(dist["wheel"]) as z:
        names = set(z.namelist())
        missing = sorted(set(_expected_modules()) - names)
        assert not missing, f"not in the wheel: {missing}"
        for lock in LOCKS:
            assert z.read(f"polyml/requirements/{lock}") == (ROOT / "requirements" / lock).read_bytes()
        assert z.read("polyml/gpu/emulate/runtime.c") == (ROOT / "polyml" / "gpu" / "emulate" / "runtime.c").read_bytes()
        (entry_points,) = (n for n in names if n.endswith(".dist-info/entry_points.txt"))
        assert "polyml = polyml.cli:main" in z.read(entry_points).decode()
    assert not any(n.startswith(("tests/", "requirements/")) for n in names), \
        "top-level folders must install under polyml/"


def test_wheel_is_reproducible(dist, tmp_path) -> None:
    """The same sources give the same wheel, byte for byte (scripts/dist.sh sets SOURCE_DATE_EPOCH)."""
    _run(["bash", str(ROOT / "scripts" / "dist.sh"), str(tmp_path)], ROOT, {**os.environ, "PYTHON": sys.executable})
    (again,) = tmp_path.glob("polyml-*.whl")
    assert again.read_bytes() == dist["wheel"].read_bytes()


def test_every_module_imports_from_the_installed_wheel(venv, env, work) -> None:
    code = ("import importlib, json, pkgutil, polyml; "
            "names = [m.name for m in pkgutil.walk_packages(polyml.__path__, 'polyml.')]; "
            "[importlib.import_module(n) for n in names]; "
            "print(json.dumps({'file': polyml.__file__, 'modules': names}))")
    got = json.loads(_run([str(venv / "bin" / "python"), "-c", code], work, env).stdout)
    assert Path(got["file"]).is_relative_to(venv), got["file"]
    want = {p[:-3].replace("/", ".").removesuffix(".__init__") for p in _expected_modules()}
    assert want - {"polyml"} <= set(got["modules"])


def test_doctor(venv, env, work) -> None:
    report = json.loads(polyml(venv, env, work, "doctor", "--json").stdout)
    assert report["ok"] and report["missing"] == []
    assert Path(report["polyml"]["path"]).is_relative_to(venv)
    runtime = report["lock"]["runtime"]
    assert runtime["matches"], runtime["differences"]
    assert Path(runtime["file"]).is_relative_to(venv)
    assert runtime["sha256"] == hashlib.sha256((ROOT / "requirements" / "runtime.txt").read_bytes()).hexdigest()
    assert not report["lock"]["test"]["matches"]  # pytest & co. are not in this venv
    assert "lock runtime" in polyml(venv, env, work, "doctor").stdout


def test_build_and_run_a_cnn_against_onnxruntime(venv, env, work) -> None:
    model = seeded_light_model("squeezenet")
    onnx.save(model, str(work / "squeezenet.onnx"))
    feeds = random_inputs(model, seed=1)
    np.savez(work / "in.npz", **feeds)
    polyml(venv, env, work, "build", "squeezenet.onnx", "-o", "squeezenet.polyml")
    polyml(venv, env, work, "run", "squeezenet.polyml", "--inputs", "in.npz", "--outputs", "out.npz")
    ref = onnxruntime_run(model, feeds)
    with np.load(work / "out.npz") as got:
        assert set(got.files) == set(ref)
        for k in ref:
            assert rel_error(got[k], ref[k]) <= 1e-3, k
    manifest = json.loads((work / "squeezenet.polyml" / "manifest.json").read_text())
    lock_sha = hashlib.sha256((ROOT / "requirements" / "runtime.txt").read_bytes()).hexdigest()
    assert manifest["versions"]["lock_sha256"] == lock_sha
    assert manifest["versions"]["lock_installed"] == "yes"


def _conv_relu(path: Path) -> None:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv0", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"], name="relu0")]
    graph = helper.make_graph(nodes, "conv_relu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], initializer=[w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), str(path))


def test_scops(venv, env, work) -> None:
    _conv_relu(work / "conv_relu.onnx")
    report = json.loads(polyml(venv, env, work, "scops", "conv_relu.onnx", "--json").stdout)
    assert report["scops"] and report["rejected"] == []
    ops = {st["op"] for s in report["scops"] for st in s["statements"]}
    assert "conv0" in ops, ops  # the Relu is fused into it


def test_cuda_build_runs_on_the_emulator(venv, env, work) -> None:
    """`--target cuda-emulated` from the installed wheel: its C runtime is package data."""
    _conv_relu(work / "conv_relu.onnx")
    model = onnx.load(str(work / "conv_relu.onnx"))
    feeds = random_inputs(model, seed=3)
    np.savez(work / "cin.npz", **feeds)
    polyml(venv, env, work, "run", "conv_relu.onnx", "--target", "cuda-emulated", "--inputs", "cin.npz",
           "--outputs", "cout.npz")
    ref = onnxruntime_run(model, feeds)
    with np.load(work / "cout.npz") as got:
        assert rel_error(got["y"], ref["y"]) <= 1e-5


def test_passes_and_opt(venv, env, work) -> None:
    from tests.test_scop_workflow import GEMM_C

    assert "tile" in polyml(venv, env, work, "passes").stdout
    (work / "gemm.c").write_text(GEMM_C)
    from polyml.driver.toolchain import tool

    _run([tool("clang"), "-S", "-emit-llvm", "-O1", "-Xclang", "-disable-llvm-passes", "gemm.c", "-o", "gemm.ll"], work, env)
    polyml(venv, env, work, "opt", "gemm.ll", "--passes", "tile{sizes=32}", "-o", "gemm.tiled.ll", "--jscop-dir", "jscop")
    _run([tool("opt"), "-passes=verify", "-disable-output", "gemm.tiled.ll"], work, env)
    (new,) = (work / "jscop").glob("*.jscop.new")
    assert "floor((i0)/32)" in new.read_text()
