"""Smoke test of an installed polyml, run inside the image by docker/build.sh (make docker):

1. ``polyml doctor --json``: every required component there, and the installed Python packages
   exactly those of the runtime lock;
2. a bundled CNN (SqueezeNet 1.0 from the onnx wheel's light models, seeded random weights)
   built with ``polyml build``, run with ``polyml run`` and compared with onnxruntime;
3. ``polyml build --from-manifest``: a rebuild with the same ``artifact_sha256``, byte for byte.

Everything goes through the ``polyml`` command, as a user would type it, in the working folder
(``/models``, or the first argument). A summary is written to ``smoke.json`` there; the exit
status is 1 when a check fails.

    docker run --rm -v "$PWD/out:/models" --entrypoint python polyml /opt/polyml/smoke.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx

from polyml.testing import expose_logits, light_model_path, onnxruntime_run, random_inputs, randomize_weights, rel_error

MODEL = "squeezenet"
TOLERANCE = 1e-3  # max|polyml - onnxruntime| / max|onnxruntime|, as tests/test_cnns.py


def polyml(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    t0 = time.perf_counter()
    proc = subprocess.run(["polyml", *args], cwd=cwd, capture_output=True, text=True)
    print(f"$ polyml {' '.join(args)}  ({time.perf_counter() - t0:.1f} s, exit {proc.returncode})", flush=True)
    if proc.returncode != 0:
        sys.stdout.write(proc.stdout + proc.stderr)
    return proc


def main(work: Path) -> int:
    work.mkdir(parents=True, exist_ok=True)
    summary: dict = {"checks": {}}
    checks = summary["checks"]

    proc = polyml("doctor", "--json", cwd=work)
    doctor = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else {}
    lock = doctor.get("lock", {}).get("runtime", {})
    checks["doctor"] = proc.returncode == 0 and doctor.get("ok") is True
    checks["lock"] = bool(lock.get("matches"))
    summary["lock_sha256"] = lock.get("sha256")
    if not checks["lock"]:
        print(f"not the locked packages: {lock.get('differences')}")

    model = expose_logits(randomize_weights(onnx.load(str(light_model_path(MODEL))), seed=0))
    onnx.save(model, str(work / f"{MODEL}.onnx"))
    feeds = random_inputs(model, seed=1)
    np.savez(work / "inputs.npz", **feeds)
    art = f"{MODEL}.polyml"
    built = polyml("build", f"{MODEL}.onnx", "-o", art, "--no-cache", cwd=work)
    ran = built.returncode == 0 and polyml("run", art, "--inputs", "inputs.npz", "--outputs", "outputs.npz",
                                           cwd=work).returncode == 0
    errors = {}
    if ran:
        ref = onnxruntime_run(model, feeds)
        with np.load(work / "outputs.npz") as got:
            errors = {k: rel_error(got[k], ref[k]) if k in got.files else float("inf") for k in ref}
    summary["rel_errors"] = errors
    checks["build_run_vs_onnxruntime"] = ran and bool(errors) and max(errors.values()) <= TOLERANCE
    print(f"{MODEL}: max|Δ|/max|ref| vs onnxruntime {errors}")

    if built.returncode == 0:
        manifest = json.loads((work / art / "manifest.json").read_text())
        summary["artifact_sha256"] = manifest["artifact_sha256"]
        summary["versions"] = manifest["versions"]
        checks["manifest_lock"] = (manifest["versions"].get("lock_sha256") == lock.get("sha256")
                                   and manifest["versions"].get("lock_installed") == "yes")
        re = polyml("build", "--from-manifest", f"{art}/manifest.json", "-o", f"{MODEL}.rebuilt", cwd=work)
        rebuilt = json.loads((work / f"{MODEL}.rebuilt" / "manifest.json").read_text()) if re.returncode == 0 else {}
        checks["rebuild_identical"] = (re.returncode == 0 and rebuilt.get("artifact_sha256") == manifest["artifact_sha256"]
                                       and all((work / art / f).read_bytes() == (work / f"{MODEL}.rebuilt" / f).read_bytes()
                                               for f in manifest["files"]))
    else:
        checks["manifest_lock"] = checks["rebuild_identical"] = False

    summary["ok"] = all(checks.values())
    (work / "smoke.json").write_text(json.dumps(summary, indent=1) + "\n")
    for name, ok in checks.items():
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "/models")))
