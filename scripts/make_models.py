"""Export PyTorch transformers and modern CNNs to ONNX with inputs and references.

Needs PyTorch, torchvision, transformers, onnx, onnxscript and onnxruntime, which polyml itself
does not: install them in a venv of their own, e.g.::

    python3 -m venv /work/torchenv
    /work/torchenv/bin/pip install -e '.[models]'      # polyml's `models` extra names them

Every model gets seeded random weights; nothing is downloaded.  Hugging Face models are built
from a config (``BertModel``, ``GPT2Model`` with ``use_cache=False``), torchvision ones with
``weights=None``.  Initializations that make a layer do nothing are replaced by seeded random
values so that a wrong kernel cannot hide behind them: batch-norm statistics and affine
parameters, layer-norm scales and shifts, ConvNeXt's layer scale (1e-6 at init) and parameters
that start as all zeros (biases, ViT's classification head, its class token).

Each model is exported with ``torch.onnx.export(..., dynamo=True)`` (the exporter users get by
default; the opset is the one it picks), batch 1, static shapes.  Where that fails the error is
recorded and the TorchScript exporter (``dynamo=False``) is tried; ``--exporter torchscript``
uses that one only (files ``NAME_ts.*``).  Written to ``--out``::

    NAME.onnx          the model, one self-contained file (no external data)
    NAME.inputs.npz    seeded inputs, keyed by graph input names
    NAME.ref.npz       onnxruntime's outputs keyed by graph output names, and PyTorch's under
                       ``torch:<output name>``
    manifest.json      per model: exporter, opset, inputs/outputs with dtypes and shapes, op
                       counts, the ops on non-float32 tensors, torch-vs-onnxruntime errors

Models (``--models``, comma separated; default all of them):

    bert                BertModel, hidden 256, 4 layers, 4 heads, intermediate 1024, sequence 128;
                        inputs input_ids, attention_mask, token_type_ids
    bert_mask_only      the same model called with input_ids and attention_mask only (the
                        token types then come from the model's buffer)
    gpt2                GPT2Model, n_embd 256, 4 layers, 4 heads, use_cache=False, sequence 128;
                        inputs input_ids, attention_mask
    vit_b_16            torchvision, 224x224
    convnext_tiny       torchvision, 224x224
    mobilenet_v3_large  torchvision, 224x224
    bert_base           BertModel with BERT-base's shape: 12 layers, hidden 768, 12 heads,
                        intermediate 3072, sequence 128 (for benchmarks)

``--small`` builds the same architectures shrunk for CI (each file well under 1 MB), written as
``NAME_small.*``: BERT/GPT-2 with hidden 32, 2 layers, 2 heads, sequence 16, vocabulary 100 (BERT keeps 128
positions: with 64 or more, the exporter's optimizer cannot fold BertEmbeddings' token-type
GatherElements, as in the full model, see ``bert_mask_only``); ViT
with 32x32 images, patch 8, hidden 32, 2 layers; ConvNeXt with two stages (one downsampling
layer) of 8 and 16 channels; MobileNetV3 with five inverted-residual blocks covering every block
kind of the large model (no expansion conv, ReLU/Hardswish, with/without squeeze-excitation, 3x3
and 5x5, stride 1 and 2, residual and not); images 32x32.  Small models leave out the exporter's
per-node metadata (stack traces naming local paths), half their size.  ``bert_base`` has no small variant
(``bert_small`` is the same architecture).

    /work/torchenv/bin/python scripts/make_models.py --out /work/models
    /work/torchenv/bin/python scripts/make_models.py --small --out tests/fixtures/onnx
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
import traceback
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

FULL = ("bert", "bert_mask_only", "gpt2", "vit_b_16", "convnext_tiny", "mobilenet_v3_large", "bert_base")
SMALL = ("bert", "bert_mask_only", "gpt2", "vit_b_16", "convnext_tiny", "mobilenet_v3_large")

#: ops whose result depends only on their input's type, not its value (folded by polyml)
SHAPE_OPS = {"Shape", "Size"}


# ----------------------------------------------------------------------------------------------
# models


def _bert(small: bool, base: bool = False, token_types: bool = True):
    import torch
    from transformers import BertConfig, BertModel

    if small:
        cfg = dict(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                   intermediate_size=64, max_position_embeddings=128)
        seq = 16
    elif base:
        cfg = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)
        seq = 128
    else:
        cfg = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024)
        seq = 128
    config = BertConfig(**cfg)
    model = BertModel(config)

    class Wrapper(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        if token_types:
            def forward(self, input_ids, attention_mask, token_type_ids):
                out = self.m(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
                return out.last_hidden_state, out.pooler_output
        else:
            def forward(self, input_ids, attention_mask):
                out = self.m(input_ids=input_ids, attention_mask=attention_mask)
                return out.last_hidden_state, out.pooler_output

    rng = np.random.default_rng(1)
    inputs = {
        "input_ids": rng.integers(0, config.vocab_size, size=(1, seq), dtype=np.int64),
        "attention_mask": _mask(seq),
    }
    if token_types:
        tt = np.zeros((1, seq), np.int64)
        tt[:, seq // 2:] = 1  # two "sentences"
        inputs["token_type_ids"] = tt
    return Wrapper(model), inputs, ["last_hidden_state", "pooler_output"], _hf_meta(model)


def _gpt2(small: bool):
    import torch
    from transformers import GPT2Config, GPT2Model

    if small:
        cfg = dict(vocab_size=100, n_positions=32, n_embd=32, n_layer=2, n_head=2, bos_token_id=99, eos_token_id=99)
        seq = 16
    else:
        cfg = dict(n_embd=256, n_layer=4, n_head=4)  # n_positions 1024, vocabulary 50257
        seq = 128
    config = GPT2Config(use_cache=False, **cfg)
    model = GPT2Model(config)

    class Wrapper(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask):
            return self.m(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state

    rng = np.random.default_rng(2)
    inputs = {
        "input_ids": rng.integers(0, config.vocab_size, size=(1, seq), dtype=np.int64),
        "attention_mask": _mask(seq),
    }
    return Wrapper(model), inputs, ["last_hidden_state"], _hf_meta(model)


def _mask(seq: int) -> np.ndarray:
    """Ones with the last eighth (at least two) zero: padding."""
    m = np.ones((1, seq), np.int64)
    m[:, seq - max(2, seq // 8):] = 0
    return m


def _hf_meta(model) -> dict:
    return {"attn_implementation": getattr(model.config, "_attn_implementation", None)}


def _image(seed: int, size: int) -> dict[str, np.ndarray]:
    return {"input": np.random.default_rng(seed).standard_normal((1, 3, size, size), dtype=np.float32)}


def _vit(small: bool):
    import torchvision

    if small:
        model = torchvision.models.VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2,
                                                     hidden_dim=32, mlp_dim=64, num_classes=10)
        size = 32
    else:
        model = torchvision.models.vit_b_16(weights=None)
        size = 224
    return model, _image(3, size), ["logits"], {}


def _convnext(small: bool):
    import torchvision
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt

    if small:
        # two stages: stem, blocks, one downsampling (LayerNorm2d + 2x2 stride-2 conv), blocks, head
        setting = [CNBlockConfig(8, 16, 1), CNBlockConfig(16, None, 2)]
        model = ConvNeXt(setting, stochastic_depth_prob=0.0, num_classes=10)
        size = 32
    else:
        model = torchvision.models.convnext_tiny(weights=None)
        size = 224
    return model, _image(4, size), ["logits"], {}


def _mobilenet(small: bool):
    from functools import partial

    import torchvision
    from torchvision.models.mobilenetv3 import InvertedResidualConfig, MobileNetV3

    if small:
        bneck = partial(InvertedResidualConfig, width_mult=1.0)
        # input, kernel, expanded, out, use_se, activation, stride, dilation
        setting = [
            bneck(16, 3, 16, 16, False, "RE", 1, 1),  # no expansion conv, residual
            bneck(16, 3, 32, 24, False, "RE", 2, 1),  # expansion, stride 2
            bneck(24, 5, 48, 24, True, "RE", 1, 1),  # 5x5, squeeze-excitation, residual
            bneck(24, 3, 48, 32, False, "HS", 2, 1),  # Hardswish, stride 2
            bneck(32, 5, 64, 32, True, "HS", 1, 1),  # Hardswish + squeeze-excitation, residual
        ]
        model = MobileNetV3(setting, last_channel=64, num_classes=10)
        size = 32
    else:
        model = torchvision.models.mobilenet_v3_large(weights=None)
        size = 224
    return model, _image(5, size), ["logits"], {}


def build(name: str, small: bool):
    if name == "bert":
        return _bert(small)
    if name == "bert_mask_only":
        return _bert(small, token_types=False)
    if name == "bert_base":
        return _bert(False, base=True)
    if name == "gpt2":
        return _gpt2(small)
    if name == "vit_b_16":
        return _vit(small)
    if name == "convnext_tiny":
        return _convnext(small)
    if name == "mobilenet_v3_large":
        return _mobilenet(small)
    raise SystemExit(f"unknown model {name!r}; known: {', '.join(FULL)}")


def randomize(model, seed: int) -> None:
    """Replace do-nothing initializations (see the module docstring) by seeded random values."""
    import torch

    g = torch.Generator().manual_seed(seed)

    def unif(t, lo, hi):
        return torch.rand(t.shape, generator=g, dtype=t.dtype) * (hi - lo) + lo

    def normal(t, std):
        return torch.randn(t.shape, generator=g, dtype=t.dtype) * std

    done: set[int] = set()
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, torch.nn.modules.batchnorm._BatchNorm):
                mod.running_mean.copy_(normal(mod.running_mean, 0.1))
                mod.running_var.copy_(unif(mod.running_var, 0.5, 1.5))
            if isinstance(mod, (torch.nn.modules.batchnorm._BatchNorm, torch.nn.LayerNorm, torch.nn.GroupNorm)):
                if mod.weight is not None:
                    mod.weight.copy_(unif(mod.weight, 0.5, 1.5))
                    done.add(id(mod.weight))
                if mod.bias is not None:
                    mod.bias.copy_(normal(mod.bias, 0.1))
                    done.add(id(mod.bias))
            if type(mod).__name__ == "CNBlock":  # torchvision ConvNeXt: layer scale 1e-6
                mod.layer_scale.copy_(unif(mod.layer_scale, 0.2, 0.6))
                done.add(id(mod.layer_scale))
        for p in model.parameters():
            if id(p) in done or not p.is_floating_point() or p.numel() == 0:
                continue
            if bool((p == 0).all()):
                p.copy_(normal(p, 0.05))


# ----------------------------------------------------------------------------------------------
# export


def export(model, inputs: dict[str, np.ndarray], output_names: list[str], exporter: str = "dynamo"):
    """(ModelProto, exporter used, errors of exporters that failed).

    ``dynamo``: ``dynamo=True``, falling back to the TorchScript exporter if it fails;
    ``torchscript``: ``dynamo=False`` only (the older exporter, which many tutorials still use).
    """
    import onnx
    import torch

    args = tuple(torch.from_numpy(v) for v in inputs.values())
    errors: dict[str, str] = {}
    if exporter == "dynamo":
        try:
            prog = torch.onnx.export(model, args, dynamo=True, input_names=list(inputs), output_names=output_names,
                                     external_data=False)
            return prog.model_proto, "dynamo", errors
        except Exception as e:
            errors["dynamo"] = f"{type(e).__name__}: {e}\n" + traceback.format_exc(limit=-3)
    try:
        buf = io.BytesIO()
        torch.onnx.export(model, args, buf, dynamo=False, input_names=list(inputs), output_names=output_names)
        return onnx.load_from_string(buf.getvalue()), "torchscript", errors
    except Exception as e:
        errors["torchscript"] = f"{type(e).__name__}: {e}\n" + traceback.format_exc(limit=-3)
    return None, None, errors


def save_single_file(model_proto, path: Path) -> None:
    import onnx
    from onnx.external_data_helper import uses_external_data

    ext = [t.name for t in model_proto.graph.initializer if uses_external_data(t)]
    if ext:
        raise RuntimeError(f"exported model keeps tensors in external data: {ext[:5]}")
    onnx.save(model_proto, str(path), save_as_external_data=False)
    onnx.checker.check_model(str(path))


def rel_err(ref: np.ndarray, got: np.ndarray) -> float:
    ref = np.asarray(ref, np.float64)
    got = np.asarray(got, np.float64)
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    d = float(np.max(np.abs(ref - got))) if ref.size else 0.0
    return d / scale if scale > 0 else d


# ----------------------------------------------------------------------------------------------
# analysis


def analyze(model_proto) -> dict:
    """Op counts, graph input/output dtypes and the ops that touch non-float32 tensors.

    A tensor is *computed* when its value depends on a graph input (through anything but
    Shape/Size); the rest folds to constants at compile time.  Signatures list operand dtypes,
    ``const`` marking constant operands (initializers, Constant nodes, folded subgraphs).
    """
    import onnx
    from onnx import TensorProto, shape_inference

    inferred = shape_inference.infer_shapes(model_proto, strict_mode=False, data_prop=True)
    g = inferred.graph
    dtype: dict[str, int] = {}
    shape: dict[str, list] = {}

    def vi(v):
        tt = v.type.tensor_type
        dtype[v.name] = tt.elem_type
        if tt.HasField("shape"):
            shape[v.name] = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tt.shape.dim]

    for v in list(g.input) + list(g.output) + list(g.value_info):
        vi(v)
    for t in g.initializer:
        dtype[t.name] = t.data_type
        shape[t.name] = list(t.dims)
    for n in g.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    dtype[n.output[0]] = a.t.data_type
                elif a.name in ("value_float", "value_floats"):
                    dtype[n.output[0]] = TensorProto.FLOAT
                elif a.name in ("value_int", "value_ints"):
                    dtype[n.output[0]] = TensorProto.INT64

    def name(t):
        return onnx.helper.tensor_dtype_to_np_dtype(dtype[t]).name if t in dtype and dtype[t] else "?"

    inits = {t.name for t in g.initializer}
    computed = {v.name for v in g.input} - inits
    ops = Counter()
    on_computed = Counter()
    typed: dict[str, Counter] = defaultdict(Counter)  # a computed tensor is not float32
    int_params: dict[str, Counter] = defaultdict(Counter)  # only constant operands are not float32
    for n in g.node:
        op = n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}.{n.op_type}"
        ops[op] += 1
        is_computed = n.op_type not in SHAPE_OPS and any(t in computed for t in n.input if t)
        if is_computed:
            computed.update(t for t in n.output if t)
            on_computed[op] += 1

        def sig(ts):
            return ", ".join(("-" if not t else name(t) if t in computed else f"{name(t)} const") for t in ts)

        tensors = [t for t in list(n.input) + list(n.output) if t]
        if any(name(t) != "float32" for t in tensors):
            s = f"({sig(n.input)}) -> ({sig([t for t in n.output if t])})"
            if any(name(t) != "float32" and t in computed for t in tensors):
                typed[op][s] += 1
            else:
                int_params[op][s] += 1

    def io(vs):
        return [{"name": v.name, "dtype": name(v.name), "shape": shape.get(v.name)} for v in vs]

    opsets = {o.domain or "ai.onnx": int(o.version) for o in model_proto.opset_import}
    return {
        "opset": opsets.get("ai.onnx"),
        "opset_imports": opsets,
        "ir_version": int(model_proto.ir_version),
        "inputs": io([v for v in g.input if v.name not in {t.name for t in g.initializer}]),
        "outputs": io(g.output),
        "ops": dict(sorted(ops.items())),
        "ops_on_computed_data": dict(sorted(on_computed.items())),
        "ops_on_nonfloat32_computed_tensors": {k: dict(v) for k, v in sorted(typed.items())},
        "ops_with_nonfloat32_constant_operands_only": {k: dict(v) for k, v in sorted(int_params.items())},
        "nodes": len(g.node),
    }


# ----------------------------------------------------------------------------------------------


def versions() -> dict[str, str]:
    from importlib.metadata import version

    return {p: version(p) for p in ("torch", "torchvision", "transformers", "onnx", "onnxscript", "onnxruntime")}


def file_stem(name: str, small: bool, exporter: str) -> str:
    return name + ("_small" if small else "") + ("_ts" if exporter == "torchscript" else "")


def strip_metadata(model_proto) -> None:
    """Drop the exporter's per-node metadata (stack traces with local paths, FX node names)."""
    g = model_proto.graph
    for item in list(g.node) + list(g.value_info) + list(g.input) + list(g.output) + list(g.initializer):
        del item.metadata_props[:]
        item.doc_string = ""


def make(name: str, small: bool, out: Path, threads: int, exporter: str = "dynamo") -> dict:
    import onnxruntime as ort
    import torch

    fname = file_stem(name, small, exporter)
    t0 = time.time()
    torch.manual_seed(0)
    model, inputs, output_names, meta = build(name, small)
    model.eval()
    randomize(model, seed=0)
    with torch.no_grad():
        res = model(*(torch.from_numpy(v) for v in inputs.values()))
    res = res if isinstance(res, tuple) else (res,)
    torch_out = {k: v.detach().numpy() for k, v in zip(output_names, res)}

    proto, exporter, errors = export(model, inputs, output_names, exporter)
    entry: dict = {"file": f"{fname}.onnx", "exporter": exporter, "export_errors": errors, **meta,
                   "versions": versions()}
    if proto is None:
        print(f"{fname}: export failed\n" + "\n".join(errors.values()), file=sys.stderr)
        return entry
    if small:
        strip_metadata(proto)
    path = out / f"{fname}.onnx"
    save_single_file(proto, path)
    entry["bytes"] = path.stat().st_size

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    graph_inputs = [i.name for i in sess.get_inputs()]
    feeds = {k: v for k, v in inputs.items() if k in graph_inputs}
    if set(graph_inputs) != set(feeds):
        raise RuntimeError(f"{fname}: graph inputs {graph_inputs} vs provided {list(inputs)}")
    names = [o.name for o in sess.get_outputs()]
    ort_out = dict(zip(names, sess.run(None, feeds)))
    np.savez(out / f"{fname}.inputs.npz", **feeds)
    ref = dict(ort_out)
    ref.update({f"torch:{k}": v for k, v in torch_out.items()})
    np.savez(out / f"{fname}.ref.npz", **ref)

    entry["dropped_inputs"] = [k for k in inputs if k not in graph_inputs]
    entry["torch_vs_onnxruntime"] = {
        k: rel_err(torch_out[k], ort_out[k]) for k in output_names if k in ort_out
    }
    entry.update(analyze(proto))
    seconds = round(time.time() - t0, 1)
    errs = ", ".join(f"{k} {v:.2e}" for k, v in entry["torch_vs_onnxruntime"].items())
    print(f"{fname}: {exporter}, opset {entry['opset']}, {entry['nodes']} nodes, {entry['bytes'] / 1e6:.2f} MB, "
          f"max|d|/max|ref| torch vs onnxruntime: {errs}  ({seconds} s)", flush=True)
    return entry


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--out", required=True, type=Path, help="folder to write to")
    ap.add_argument("--models", default=None, help=f"comma separated (default: all of {', '.join(FULL)})")
    ap.add_argument("--small", action="store_true", help="CI-sized variants, written as NAME_small.*")
    ap.add_argument("--threads", type=int, default=1, help="torch/onnxruntime threads (default 1)")
    ap.add_argument("--exporter", choices=("dynamo", "torchscript"), default="dynamo",
                    help="dynamo (default; TorchScript where it fails) or torchscript only (files NAME[_small]_ts.*)")
    ap.add_argument("--analyze-only", action="store_true",
                    help="redo the manifest's op analysis of the NAME.onnx files already in --out")
    a = ap.parse_args(argv)

    import torch

    torch.set_num_threads(a.threads)
    names = a.models.split(",") if a.models else list(SMALL if a.small else FULL)
    if a.small and "bert_base" in names:
        raise SystemExit("bert_base has no small variant (bert_small is the same architecture)")
    a.out.mkdir(parents=True, exist_ok=True)
    manifest_path = a.out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    failed = []
    for name in names:
        name = name.strip()
        key = file_stem(name, a.small, a.exporter)
        if a.analyze_only:
            import onnx

            manifest.setdefault(key, {}).update(analyze(onnx.load(str(a.out / f"{key}.onnx"))))
            manifest_path.write_text(json.dumps(dict(sorted(manifest.items())), indent=1) + "\n")
            continue
        try:
            manifest[key] = make(name, a.small, a.out, a.threads, a.exporter)
        except Exception:
            traceback.print_exc()
            failed.append(key)
            continue
        if manifest[key].get("exporter") is None:
            failed.append(key)
        manifest_path.write_text(json.dumps(dict(sorted(manifest.items())), indent=1) + "\n")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
