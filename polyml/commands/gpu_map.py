"""``polyml gpu-map MODEL`` (= ``polyml scops MODEL --target cuda``): how each nest maps onto the
CUDA grid; and ``build --target cuda``.

For every kernel (one top-level nest of an op): its outer band, which band loops are parallel
(no dependence changes their counter, checked with islpy), which became
``blockIdx.a*T + threadIdx.a`` and which stayed loops in the thread, the loops below the band,
the grid/block dimensions, and (``--shared-memory``) which input tiles are promoted into shared
memory.  ``--json`` prints the manifest's ``kernels`` entries.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from rich.markup import escape

from polyml.commands._common import command, console, out, parse_shape


def _read(args: argparse.Namespace):  # noqa: ANN202 - polyml.graph.Graph
    from polyml.compiler import read_graph

    shapes = dict(parse_shape(s) for s in args.input_shape)
    outputs = args.output_names.split(",") if args.output_names else None
    return read_graph(args.model, input_shapes=shapes, outputs=outputs)


def build_cuda(args: argparse.Namespace) -> int:
    """``polyml build MODEL --target cuda -o DIR [--shared-memory]``."""
    from polyml.compiler import file_sha256
    from polyml.gpu.build import build_cuda_artifact

    t0 = time.perf_counter()
    graph = _read(args)
    m = build_cuda_artifact(graph, args.output, sm=args.sm, fuse=args.fuse, model_sha256=file_sha256(args.model),
                            source={"path": str(Path(args.model).resolve())},
                            shared_memory=getattr(args, "shared_memory", False))
    serial = sum(1 for k in m["kernels"] if k["grid"] == [1, 1, 1] and k["block"] == [1, 1, 1])
    stages = ", ".join(f"{k} {v:.1f}s" for k, v in m["seconds"].items())
    shared = f", {m['shared_memory_kernels']} with shared-memory tiles" if m["options"]["shared_memory"] else ""
    console.print(f"polyml build {Path(args.model).name} → {args.output} (cuda, {m['sm']}): {len(m['files'])} PTX modules, "
                  f"{len(m['kernels'])} kernels ({serial} single-thread{shared}), weights {m['weights_bytes'] / 1e6:.1f} MB, "
                  f"device arena {m['arena_bytes'] / 1e6:.1f} MB; ptxas {'ok' if m['ptxas_checked'] else 'not run'}; "
                  f"{stages}; total {time.perf_counter() - t0:.1f}s", highlight=False)
    return 0


def kernel_entries(args: argparse.Namespace) -> list[dict]:
    """The manifest's ``kernels`` entries for ``args.model`` (as ``build --target cuda`` would
    write them, without writing PTX)."""
    from polyml.gpu.lower import lower_graph_cuda
    from polyml.gpu.shared import SHARED_BYTES

    graph = _read(args)
    if args.fuse:
        from polyml.pipeline import cuda_fusion

        graph, _ = cuda_fusion().apply(graph)  # as a CUDA build fuses (polyml.gpu.build)
    low = lower_graph_cuda(graph, shared_bytes=SHARED_BYTES if getattr(args, "shared_memory", False) else 0)
    return [launch.to_json() for launch in low.launches]


def _axes(mp: dict) -> str:
    """``x ← j (tile 16), y ← i (tile 16)``: the band loop on each grid axis of one kernel."""
    parts = []
    for d in mp["band"]:
        if d["to"] != "loop":
            axis = d["to"].split("*")[0][-1]
            tile = d["to"].split("*")[1].split("+")[0]
            parts.append(f"{axis} ← {d['loop']} (tile {tile})")
    return ", ".join(sorted(parts)) or "none (one thread)"


def print_mapping(entries: list[dict], sm: str, as_json: bool) -> int:
    """Print the mapping of every kernel (text, or ``{"sm", "kernels"}`` as JSON)."""
    if as_json:
        sys.stdout.write(json.dumps({"sm": sm, "kernels": entries}, indent=1) + "\n")
        return 0
    for e in entries:
        mp = e["mapping"]
        out.print(f"[bold]{escape(e['name'])}[/] ({escape(e['op_type'])} {escape(e['op'])}) grid {tuple(e['grid'])} "
                  f"block {tuple(e['block'])}" + (f"  serial: {escape(mp['serial'])}" if mp.get("serial") else ""),
                  highlight=False)
        out.print(f"    blockIdx/threadIdx: {escape(_axes(mp))}", highlight=False)
        for d in mp["band"]:
            par = "parallel" if d["parallel"] else "carries a dependence"
            out.print(f"    {d['loop']:>6} in [{d['range'][0]}, {d['range'][1]})  {par:<22} → {escape(d['to'])}", highlight=False)
        seq = [d["loop"] for d in mp["band"] if d["to"] == "loop"] + mp.get("inner_loops", [])
        out.print(f"    sequential in the thread: {escape(', '.join(seq)) or '-'}", highlight=False)
        sh = mp.get("shared")
        if sh:
            arrays = ", ".join(f"{a['name']} {'x'.join(map(str, a['box']))}" for a in sh["arrays"])
            out.print(f"    shared memory: {escape(arrays)} per {sh['loop']} tile of {sh['tile']} ({sh['bytes']} B), "
                      "bar.sync around each tile", highlight=False)
        elif mp.get("shared_note"):
            out.print(f"    shared memory: no ({escape(mp['shared_note'])})", highlight=False)
    return 0


def show_gpu_mapping(args: argparse.Namespace) -> int:
    """``polyml gpu-map MODEL`` and ``polyml scops MODEL --target cuda``."""
    return print_mapping(kernel_entries(args), getattr(args, "sm", "sm_90"), args.json)


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="model file (.onnx, .pb, .pbtxt)")
    p.add_argument("--json", action="store_true", help="the manifest's kernel entries as JSON")
    p.add_argument("--sm", default="sm_90", help="GPU architecture (only recorded; no PTX is written)")
    p.add_argument("--shared-memory", action="store_true", help="map as build --target cuda --shared-memory does")
    p.add_argument("--fuse", action=argparse.BooleanOptionalAction, default=True, help="lower with operator fusion, as build does")
    p.add_argument("--input-shape", action="append", default=[], metavar="NAME=1x3x224x224",
                   help="fix the shape of a graph input with symbolic dimensions (repeatable)")
    p.add_argument("--outputs", dest="output_names", default=None, help="comma-separated output tensor names (TensorFlow)")


@command("gpu-map", _arguments, "show how each loop nest maps onto the CUDA grid (alias of scops --target cuda)")
def cmd_gpu_map(args: argparse.Namespace) -> int:
    return show_gpu_mapping(args)
