"""Where a model loses to onnxruntime, op by op: polyml's steps (:meth:`CompiledModel.profile`: the same
order and buffers as a run) next to onnxruntime's node profile, matched by node name, sorted by the
difference. Each side's figure is the minimum over ``--repeat`` runs (robust on a noisy host).

onnxruntime fuses and renames nodes (``.../Clip_output_0_nchwc``): a row is keyed by the node
name without its last two path components (the module), which pairs a Conv with the fused node
onnxruntime made of it and its activation; onnxruntime nodes that nothing matched (a SiLU's
``Mul`` it left unfused, its layout reorders) are listed at the end, as their time belongs to
the comparison::

    .venv/bin/python scripts/profile_vs_onnxruntime.py build/models/mobilenet_v2.t1.polyml \\
        build/models/mobilenet_v2.onnx --threads 1 [--top 30]
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

import numpy as np
import onnxruntime as ort

from polyml.commands.bench import random_feeds
from polyml.runtime.model import CompiledModel


def module_key(node: str) -> str:
    """``/a/b/conv/Conv`` → ``/a/b``; a name without a module path stands for itself."""
    parts = node.split("/")
    return "/".join(parts[:-2]) if len(parts) > 2 else node


def onnxruntime_nodes(path: Path, feeds: dict[str, np.ndarray], threads: int, repeat: int) -> dict[str, float]:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.enable_profiling = True
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    mine = {i.name: feeds[i.name] for i in sess.get_inputs()}
    for _ in range(repeat):
        sess.run(None, mine)
    events = json.loads(Path(sess.end_profiling()).read_text())
    per_node: dict[str, list[float]] = collections.defaultdict(list)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            per_node[e["name"][: -len("_kernel_time")]].append(e["dur"] / 1e3)
    return {name: min(v) for name, v in per_node.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("artifact", type=Path)
    p.add_argument("model", type=Path, help="the .onnx the artifact was built from")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeat", type=int, default=40)
    p.add_argument("--top", type=int, default=30)
    args = p.parse_args()
    model = CompiledModel(args.artifact)
    feeds = random_feeds(model)
    rows = [{**r, "ms": r["min_s"] * 1e3} for r in model.profile(feeds, repeat=args.repeat)]
    ort_nodes = onnxruntime_nodes(args.model, feeds, args.threads, args.repeat)
    by_module: dict[str, float] = collections.defaultdict(float)
    for name, ms in ort_nodes.items():
        by_module[module_key(name)] += ms
    print(f"polyml steps {sum(r['ms'] for r in rows):.3f} ms, onnxruntime nodes {sum(ort_nodes.values()):.3f} ms "
          f"(minima, threads={args.threads})")
    table = []
    for r in rows:
        theirs = by_module.pop(module_key(r["node"]), float("nan"))
        table.append((r["ms"] - (0.0 if theirs != theirs else theirs), r["ms"], theirs, r["op_type"], r.get("detail", ""), r["node"]))
    print(f"{'Δ ms':>7} {'polyml':>7} {'ort':>7}  op")
    for diff, ours, theirs, op, detail, node in sorted(table, key=lambda t: -t[0])[: args.top]:
        print(f"{diff:+7.3f} {ours:7.3f} {theirs:7.3f}  {op} {detail}  {node}")
    left = sorted(((ms, k) for k, ms in by_module.items()), reverse=True)
    if left:
        print("onnxruntime nodes without a polyml step (their time counts on onnxruntime's side):")
        for ms, k in left[:10]:
            print(f"        {'':7} {ms:7.3f}  {k}")


if __name__ == "__main__":
    main()
