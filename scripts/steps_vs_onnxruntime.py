"""Step by step against onnxruntime inside the model: polyml's op functions
(:meth:`CompiledModel.profile`, minimum over ``--repeat``) next to onnxruntime's own profiler
(the minimum of each node's kernel time over as many runs), at the same thread count.

A layer measured alone flatters onnxruntime's rivals: alone, onnxruntime reorders the input into
its blocked layout (NCHWc) and the output back, which inside a model it does once.  Inside the
model each of its nodes runs on the layout the previous one left, so this is the comparison that
says which of polyml's steps lose.  Nodes are paired by their name's block prefix (the name
without its last two path components: ``/features/features.2/conv/conv.0``), which fits
torch-exported models; in models whose node names are not paths (the ONNX zoo's ``n12``) each
onnxruntime node goes to the polyml step at or before it in graph order (onnxruntime names a
fused NCHWc node after its output tensor, ``r2_nchwc``); unpaired steps are listed too::

    .venv/bin/python scripts/steps_vs_onnxruntime.py build/models/mobilenet_v2.onnx \\
        build/mb.polyml --threads 1 --repeat 30 [--by-block]
"""

from __future__ import annotations

import argparse
import collections
import json
import tempfile
from pathlib import Path

from polyml.commands.bench import random_feeds
from polyml.runtime.model import CompiledModel, set_num_threads


def block(name: str) -> str:
    """The node name without its last two path components (the op and its module)."""
    return "/".join(name.split("/")[:-2])


def graph_order_blocks(model: Path, step_nodes: list[str], ort_names: list[str]) -> dict[str, str]:
    """``{onnxruntime node: polyml step node}`` by graph order: the step whose node is the last
    at or before the onnxruntime node's own (found by node name, or by the tensor its name
    carries before ``_nchwc``).  Its layout reorders stay unpaired."""
    import onnx

    graph = onnx.load(str(model), load_external_data=False).graph
    index = {n.name: i for i, n in enumerate(graph.node)}
    index.update({out: i for i, n in enumerate(graph.node) for out in n.output})
    starts = sorted((index[n], n) for n in step_nodes if n in index)
    owners = {}
    for name in ort_names:
        at = index.get(name, index.get(name.removesuffix("_nchwc")))
        if at is None:
            continue
        owned = [node for i, node in starts if i <= at]
        if owned:
            owners[name] = owned[-1]
    return owners


def onnxruntime_nodes(model: Path, threads: int, feeds: dict, repeat: int) -> dict[str, tuple[str, float]]:
    """``{node name: (op type, minimum ms)}`` from onnxruntime's profiler."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.enable_profiling = True
    with tempfile.TemporaryDirectory() as tmp:
        so.profile_file_prefix = str(Path(tmp) / "ort")
        sess = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
        for _ in range(repeat):
            sess.run(None, feeds)
        events = json.loads(Path(sess.end_profiling()).read_text())
    times: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            times[(e["name"][: -len("_kernel_time")], e["args"].get("op_name", "?"))].append(e["dur"] / 1000)
    return {name: (op, min(ts)) for (name, op), ts in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", type=Path, help="the .onnx the artifact was built from")
    p.add_argument("artifact", type=Path)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeat", type=int, default=30)
    p.add_argument("--by-block", action="store_true",
                   help="also sum both sides per block (name prefix): models where one side fuses more nodes")
    args = p.parse_args()
    set_num_threads(args.threads)
    compiled = CompiledModel(args.artifact)
    feeds = random_feeds(compiled)
    ort_nodes = onnxruntime_nodes(args.model, args.threads, feeds, args.repeat)
    steps = compiled.profile(feeds, repeat=args.repeat)
    key = block
    if any("/" in name for name in ort_nodes):
        # a fused expansion and depthwise step stands for both convolutions' nodes
        merged = {block(op): block(group["nest"]) for group in compiled.manifest.get("fusion", {}).get("groups", [])
                  if group.get("kind") == "depthwise-product" for op in group["ops"]}
        by_block = {}
        for name, (_, ms) in ort_nodes.items():
            owner = merged.get(block(name), block(name))
            by_block[owner] = by_block.get(owner, 0.0) + ms if owner in merged.values() else ms
    else:  # zoo-style names: pair by graph order, summing the nodes each step covers
        owners = graph_order_blocks(args.model, [s.get("node") or "" for s in steps], list(ort_nodes))
        by_block = collections.defaultdict(float)
        for name, (_, ms) in ort_nodes.items():
            if name in owners:
                by_block[owners[name]] += ms
        key = str
        unpaired = {name: ms for name, (_, ms) in ort_nodes.items() if name not in owners}
        print(f"onnxruntime nodes left unpaired: {sum(unpaired.values()):.3f} ms "
              f"({', '.join(f'{n} {ms:.3f}' for n, ms in unpaired.items())})")
    print(f"polyml steps {sum(s['min_s'] for s in steps) * 1e3:.3f} ms ({len(steps)}), "
          f"onnxruntime nodes {sum(ms for _, ms in ort_nodes.values()):.3f} ms ({len(ort_nodes)}); "
          f"{args.threads} thread(s), minimum of {args.repeat}")
    print(f"{'polyml':>8} {'ort':>8} {'ratio':>6}  step")
    paired = [0.0, 0.0]
    for s in steps:
        ms = s["min_s"] * 1e3
        ort_ms = by_block.get(key(s.get("node") or ""))
        label = f"{s['op_type']} {s.get('detail', '')}".strip()
        if ort_ms is None:
            print(f"{ms:8.3f} {'-':>8} {'':>6}  {label}")
            continue
        paired[0] += ms
        paired[1] += ort_ms
        print(f"{ms:8.3f} {ort_ms:8.3f} {ms / ort_ms:6.2f}  {label}")
    print(f"paired: polyml {paired[0]:.3f} ms, onnxruntime {paired[1]:.3f} ms")
    if args.by_block:
        print_blocks(steps, ort_nodes)


def print_blocks(steps: list[dict], ort_nodes: dict[str, tuple[str, float]]) -> None:
    """Per block (name prefix), the sum of polyml's steps next to the sum of onnxruntime's
    nodes: the fair pairing where one side fuses what the other runs as several nodes (polyml's
    conv with its SiLU epilogue against onnxruntime's Conv and QuickGelu)."""
    ours: dict[str, list] = {}
    for s in steps:
        entry = ours.setdefault(block(s.get("node") or ""), [0.0, []])
        entry[0] += s["min_s"] * 1e3
        entry[1].append(s["op_type"])
    def owner(name: str) -> str:
        """The deepest polyml block that is a path prefix of this node's name (onnxruntime's
        fused nodes such as QuickGelu keep a longer name), else its own block."""
        parts = name.split("/")
        for end in range(len(parts), 0, -1):
            if "/".join(parts[:end]) in ours:
                return "/".join(parts[:end])
        return block(name)

    theirs: dict[str, list] = {}
    for name, (op, ms) in ort_nodes.items():
        entry = theirs.setdefault(owner(name), [0.0, []])
        entry[0] += ms
        entry[1].append(op)
    print(f"\n{'polyml':>8} {'ort':>8} {'ratio':>6}  block: polyml steps | onnxruntime nodes")
    for name in sorted(set(ours) | set(theirs), key=lambda n: -(ours.get(n, [0])[0])):
        mine, other = ours.get(name, [0.0, []]), theirs.get(name, [0.0, []])
        ratio = f"{mine[0] / other[0]:6.2f}" if mine[0] and other[0] else f"{'':>6}"
        print(f"{mine[0]:8.3f} {other[0]:8.3f} {ratio}  {name or '(none)'}: {' '.join(mine[1])} | "
              f"{' '.join(other[1])}")


if __name__ == "__main__":
    main()
