"""Graph rewrites after the translation, all exact up to float rounding, each to a fixed point:
back-to-back Transposes compose; a zero Pad of the spatial dims only (Keras ``ZeroPadding2D``)
moves below a Transpose and, read by a Conv alone, becomes the Conv's padding; per-channel Add,
Sub, Mul, Div and BatchNormalization after a Conv (or a Transpose of one) fold into its weights
and bias; a MatMul (or a Gemm without bias) followed by a bias Add becomes a Gemm.
"""

from __future__ import annotations

import numpy as np

from polyml.graph import Graph, Node, TensorType


def _consumers(graph: Graph) -> dict[str, list[Node]]:
    return graph.consumers()


def _sole_use(graph: Graph, t: str, uses: dict[str, list[Node]]) -> Node | None:
    """The only node reading ``t`` (None if several, none, or ``t`` is a graph output)."""
    readers = uses.get(t, [])
    if len(readers) != 1 or t in graph.outputs:
        return None
    return readers[0]


def _per_channel(c: np.ndarray, shape: tuple[int, ...], axis: int) -> np.ndarray | None:
    """``c`` as a vector along ``axis`` of ``shape`` if broadcasting it changes nothing else."""
    if c.ndim > len(shape):
        return None
    full = (1,) * (len(shape) - c.ndim) + c.shape
    if any(d != 1 and (i != axis or d != shape[axis]) for i, d in enumerate(full)):
        return None
    return np.broadcast_to(c.reshape(-1), (shape[axis],)).astype(np.float32)


def _swap_pad_transpose(graph: Graph) -> bool:
    """Pad → Transpose becomes Transpose → Pad (so that the Pad can meet a Conv)."""
    uses = _consumers(graph)
    for pad in graph.nodes:
        if pad.op_type != "Pad" or len(pad.inputs) > 1:
            continue
        tr = _sole_use(graph, pad.outputs[0], uses)
        if tr is None or tr.op_type != "Transpose":
            continue
        perm = [int(v) for v in tr.attrs["perm"]]
        p = [int(v) for v in pad.attrs["pads"]]
        r = len(perm)
        mid = _fresh(graph, f"{tr.outputs[0]}#unpadded")
        x = pad.inputs[0]
        src = graph.types[x]
        graph.types[mid] = TensorType(tuple(src.shape[i] for i in perm), src.dtype)
        tr.inputs, tr.outputs, pad.inputs, pad.outputs = [x], [mid], [mid], [tr.outputs[0]]
        pad.attrs["pads"] = [p[i] for i in perm] + [p[r + i] for i in perm]
        i, j = graph.nodes.index(pad), graph.nodes.index(tr)
        graph.nodes[i], graph.nodes[j] = tr, pad
        return True
    return False


def _fold_pad_into_conv(graph: Graph) -> bool:
    uses = _consumers(graph)
    for pad in graph.nodes:
        if pad.op_type != "Pad" or float(pad.attrs.get("value", 0.0)) != 0.0 or len(pad.inputs) > 1:
            continue
        conv = _sole_use(graph, pad.outputs[0], uses)
        if conv is None or conv.op_type != "Conv" or conv.inputs[0] != pad.outputs[0]:
            continue
        p = [int(v) for v in pad.attrs["pads"]]
        r = len(p) // 2
        if any(v < 0 for v in p) or any(p[d] or p[r + d] for d in (0, 1)):
            continue
        cp = [int(v) for v in conv.attrs.get("pads", [0] * 2 * (r - 2))]
        s = r - 2
        conv.attrs["pads"] = [cp[i] + p[2 + i] for i in range(s)] + [cp[s + i] + p[r + 2 + i] for i in range(s)]
        conv.inputs[0] = pad.inputs[0]
        graph.nodes.remove(pad)
        return True
    return False


def _fold_affine_into_conv(graph: Graph) -> bool:
    """Conv (→ Transpose) → per-channel Add/Sub/Mul/Div/BatchNormalization: fold into the Conv."""
    uses = _consumers(graph)
    producers = graph.producer_map()
    consts = graph.constants
    for node in graph.nodes:
        if node.op_type not in ("Add", "Sub", "Mul", "Div", "BatchNormalization"):
            continue
        for pos, t in enumerate(node.inputs[:2] if node.op_type != "BatchNormalization" else node.inputs[:1]):
            p = producers.get(t)
            if p is None or t in consts:
                continue
            trans = None
            if p.op_type == "Transpose":
                trans = p
                if _sole_use(graph, p.inputs[0], uses) is not p:
                    continue
                p = producers.get(p.inputs[0])
                if p is None:
                    continue
            if p.op_type != "Conv" or _sole_use(graph, t, uses) is not node:
                continue
            w_name = p.inputs[1]
            b_name = p.inputs[2] if len(p.inputs) > 2 and p.inputs[2] else None
            if w_name not in consts or (b_name is not None and b_name not in consts):
                continue
            shape = graph.types[t].shape
            axis = 1 if trans is None else list(trans.attrs["perm"]).index(1)
            if node.op_type == "BatchNormalization" and axis != 1:
                continue
            w = consts[w_name].astype(np.float32, copy=False)
            m = w.shape[0]
            b = consts[b_name].astype(np.float32, copy=False) if b_name else np.zeros(m, np.float32)
            if node.op_type == "BatchNormalization":
                params = node.inputs[1:5]
                if len(params) != 4 or any(q not in consts or consts[q].size != m for q in params):
                    continue
                scale, bias, mean, var = (consts[q].reshape(m).astype(np.float32) for q in params)
                a = scale / np.sqrt(var + np.float32(node.attrs.get("epsilon", 1e-5)))
                w2, b2 = w * a.reshape(-1, *([1] * (w.ndim - 1))), (b - mean) * a + bias
            else:
                other = node.inputs[1 - pos]
                if other not in consts:
                    continue
                c = _per_channel(consts[other], shape, axis)
                if c is None or graph.types[node.outputs[0]].shape != shape:
                    continue
                cw = c.reshape(-1, *([1] * (w.ndim - 1)))
                if node.op_type == "Add":
                    w2, b2 = w, b + c
                elif node.op_type == "Mul":
                    w2, b2 = w * cw, b * c
                elif node.op_type == "Sub" and pos == 0:
                    w2, b2 = w, b - c
                elif node.op_type == "Sub":
                    w2, b2 = -w, c - b
                elif node.op_type == "Div" and pos == 0:
                    w2, b2 = w / cw, b / c
                else:
                    continue
            wn = _fresh(graph, f"{p.name}#w")
            bn = _fresh(graph, f"{p.name}#b")
            _set_const(graph, wn, w2.astype(np.float32))
            _set_const(graph, bn, b2.astype(np.float32))
            p.inputs[1:] = [wn, bn]
            if trans is None:
                p.outputs[0] = node.outputs[0]
            else:
                trans.outputs[0] = node.outputs[0]
            graph.nodes.remove(node)
            return True
    return False


def _fold_bias_into_gemm(graph: Graph) -> bool:
    """MatMul(A, B) or Gemm(A, B) (no C, alpha = beta = 1) → Add(bias): one Gemm(A, B, bias)."""
    uses = _consumers(graph)
    producers = graph.producer_map()
    for node in graph.nodes:
        if node.op_type != "Add":
            continue
        for pos, t in enumerate(node.inputs[:2]):
            p = producers.get(t)
            other = node.inputs[1 - pos]
            if p is None or other not in graph.constants or _sole_use(graph, t, uses) is not node:
                continue
            gemm = p.op_type == "Gemm" and len(p.inputs) == 2 and float(p.attrs.get("alpha", 1.0)) == 1.0 \
                and float(p.attrs.get("beta", 1.0)) == 1.0
            if p.op_type != "MatMul" and not gemm:
                continue
            sa, sb = graph.types[p.inputs[0]].shape, graph.types[p.inputs[1]].shape
            shape = graph.types[t].shape
            c = graph.constants[other]
            if len(sa) != 2 or len(sb) != 2 or c.ndim > 2 or graph.types[node.outputs[0]].shape != shape:
                continue
            p.op_type = "Gemm"
            p.inputs = [p.inputs[0], p.inputs[1], other]
            p.outputs[0] = node.outputs[0]
            graph.nodes.remove(node)
            return True
    return False


def _compose_transposes(graph: Graph) -> bool:
    uses = _consumers(graph)
    producers = graph.producer_map()
    for node in graph.nodes:
        if node.op_type != "Transpose":
            continue
        p = producers.get(node.inputs[0])
        if p is None or p.op_type != "Transpose" or _sole_use(graph, node.inputs[0], uses) is not node:
            continue
        pa, pb = list(p.attrs["perm"]), list(node.attrs["perm"])
        node.attrs["perm"] = [pa[j] for j in pb]
        node.inputs[0] = p.inputs[0]
        graph.nodes.remove(p)
        if node.attrs["perm"] == list(range(len(pb))):
            node.op_type = "Identity"
            node.attrs = {}
        return True
    return False


def _fresh(graph: Graph, base: str) -> str:
    name, i = base, 1
    while name in graph.types:
        i += 1
        name = f"{base}{i}"
    return name


def _set_const(graph: Graph, name: str, arr: np.ndarray) -> None:
    graph.constants[name] = np.ascontiguousarray(arr)
    graph.types[name] = TensorType(tuple(arr.shape), arr.dtype.name)


def optimize(graph: Graph) -> None:
    """The exact rewrites of the module docstring, each to a fixed point (in place)."""
    for rewrite in (_compose_transposes, _swap_pad_transpose, _fold_pad_into_conv, _fold_affine_into_conv, _fold_bias_into_gemm):
        while rewrite(graph):
            pass
