"""Freeze a Keras model (random weights) to a TensorFlow GraphDef ``.pb`` with a reference.

Needs TensorFlow (``pip install -e '.[tf]'``); polyml itself reads the ``.pb`` without it.

The model gets seeded random weights (``weights=None``, ``keras.utils.set_random_seed``); the
normalization parameters, which Keras initializes to the identity (batch-norm mean 0, variance
1, gamma 1, beta 0; layer-norm gamma 1, beta 0) and ConvNeXt's layer scales (1e-6, which would
hide everything its residual branches compute) are replaced by seeded random values so that
they matter.  A classifier is built without its activation; the frozen function returns the
softmax (``Identity``) and the logits (``Identity_1``): with random weights a deep net's softmax
often saturates, which would hide errors in everything before it.  ``transformer`` returns its
one output (``Identity``).

The function is frozen with ``convert_variables_to_constants_v2``; its input Placeholder is
named ``input`` and has an unknown batch dimension.  Written next to each other::

    OUT/NAME.pb         the frozen GraphDef (binary)
    OUT/NAME.in.npz     one seeded input, key ``input`` (standard normal; uniform on [0, 255)
                        for the models that include ImageNet preprocessing)
    OUT/NAME.out.npz    TensorFlow's outputs on it, keys ``Identity`` (and ``Identity_1``)

Models:

``mobilenet_v2``, ``resnet50``
    ``keras.applications`` (``--alpha``: MobileNetV2's width).
``convnext_tiny``, ``efficientnetv2_b0``
    ``keras.applications.ConvNeXtTiny`` / ``EfficientNetV2B0`` (preprocessing included, as by
    default: a ``Normalization`` / ``Rescaling`` layer).
``convnext_mini``, ``efficientnetv2_mini``
    the same Keras builders (``keras.src.applications``) with a few narrow blocks: every op type
    of the full models in a graph of some 100 kB (test fixtures).  ConvNeXt: 4×4 stem, one block
    per stage (7×7 depthwise, LayerNormalization, Dense → GELU → Dense, layer scale, residual),
    downsampling LayerNorm + 2×2 convolutions, head; EfficientNetV2: fused-MBConv without and
    with expansion, MBConv with squeeze-and-excitation, swish.
``transformer``
    input ``[1, --seq, --dim]`` → ``MultiHeadAttention(--heads, key_dim=dim/heads)`` self-attention
    + residual + LayerNormalization → Dense(``--ff``, GELU) → Dense(dim) + residual +
    LayerNormalization (defaults: seq 64, dim 128, 4 heads, ff 512).
``tiny``
    a small hand-made CNN (a few kB; with ``--tf1`` its batch norms are FusedBatchNormV3).

``--tf1`` builds the model with ``tf-keras`` (Keras 2), whose BatchNormalization layers freeze
to ``FusedBatchNormV3`` nodes (Keras 3 decomposes them into Rsqrt/Mul/Add), its
LayerNormalization to a training-mode ``FusedBatchNormV3`` of the reshaped input, and its
``EinsumDense`` to ``Einsum``.

    python scripts/freeze_keras.py mobilenet_v2 --size 224 -o build/tf
    python scripts/freeze_keras.py resnet50 --size 224 -o build/tf
    python scripts/freeze_keras.py convnext_tiny --size 224 -o build/tf
    python scripts/freeze_keras.py efficientnetv2_b0 --size 224 -o build/tf
    python scripts/freeze_keras.py transformer -o build/tf                     # transformer_64x128
    python scripts/freeze_keras.py mobilenet_v2 --size 96 --alpha 0.35 --classes 10 -o tests/fixtures/tf
    python scripts/freeze_keras.py transformer --seq 8 --dim 16 --ff 64 [--tf1] -o tests/fixtures/tf
    python scripts/freeze_keras.py convnext_mini --size 64 --classes 10 -o tests/fixtures/tf
    python scripts/freeze_keras.py efficientnetv2_mini --size 64 --classes 10 -o tests/fixtures/tf
    python scripts/freeze_keras.py mobilenet_v2 --tf1 --size 224 -o build/tf
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

MODELS = ("mobilenet_v2", "resnet50", "convnext_tiny", "efficientnetv2_b0", "convnext_mini", "efficientnetv2_mini",
          "transformer", "tiny")
#: models whose first layer is ImageNet preprocessing (their inputs are pixels in [0, 255))
PIXELS = ("convnext_tiny", "efficientnetv2_b0", "convnext_mini", "efficientnetv2_mini")

#: EfficientNetV2's block arguments for ``efficientnetv2_mini``: a fused-MBConv without and one
#: with expansion (the second strided), an MBConv with squeeze-and-excitation, one repeated
EFFNETV2_MINI_BLOCKS = [
    {"kernel_size": 3, "num_repeat": 1, "input_filters": 16, "output_filters": 8, "expand_ratio": 1, "se_ratio": 0,
     "strides": 1, "conv_type": 1},
    {"kernel_size": 3, "num_repeat": 1, "input_filters": 8, "output_filters": 16, "expand_ratio": 4, "se_ratio": 0,
     "strides": 2, "conv_type": 1},
    {"kernel_size": 3, "num_repeat": 2, "input_filters": 16, "output_filters": 24, "expand_ratio": 4, "se_ratio": 0.25,
     "strides": 2, "conv_type": 0},
]


def _keras(tf1: bool):
    if tf1:
        import tf_keras

        return tf_keras
    import keras

    return keras


def transformer_block(keras, seq: int, dim: int, heads: int, ff: int):
    """Post-norm transformer encoder block: self-attention, residual, LayerNorm, GELU MLP,
    residual, LayerNorm (``dim / heads`` per head)."""
    layers = keras.layers
    x = inp = keras.Input((seq, dim))
    a = layers.MultiHeadAttention(num_heads=heads, key_dim=dim // heads)(x, x)
    x = layers.LayerNormalization()(layers.Add()([x, a]))
    h = layers.Dense(ff, activation="gelu")(x)
    h = layers.Dense(dim)(h)
    x = layers.LayerNormalization()(layers.Add()([x, h]))
    return keras.Model(inp, x)


def tiny_cnn(keras, shape, classes: int):
    layers = keras.layers
    x = inp = keras.Input(shape)
    x = layers.ZeroPadding2D(((1, 1), (1, 1)))(x)
    x = layers.Conv2D(8, 3, strides=2, use_bias=False)(x)
    x = layers.BatchNormalization()(x)
    x = layers.ReLU(6.0)(x)
    y = layers.DepthwiseConv2D(3, padding="same")(x)
    y = layers.BatchNormalization()(y)
    y = layers.Activation("relu")(y)
    y = layers.Conv2D(8, 1, padding="same")(y)
    x = layers.Add()([x, y])
    x = layers.MaxPooling2D(2, padding="same")(x)
    x = layers.Conv2D(12, 3, padding="same", dilation_rate=2, activation="sigmoid")(x)  # SpaceToBatchND pattern
    x = layers.AveragePooling2D(2)(x)
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.Dense(classes)(x)
    return keras.Model(inp, x)


def build_model(name: str, size: int, alpha: float, classes: int, tf1: bool, seed: int,
                seq: int = 64, dim: int = 128, heads: int = 4, ff: int = 512):
    """The Keras model with seeded random weights and no classifier activation."""
    import tensorflow as tf

    keras = _keras(tf1)
    keras.utils.set_random_seed(seed)
    tf.random.set_seed(seed)
    shape = (size, size, 3)
    apps = keras.applications
    if name == "mobilenet_v2":
        model = apps.MobileNetV2(input_shape=shape, alpha=alpha, weights=None, classes=classes, classifier_activation=None)
    elif name == "resnet50":
        model = apps.ResNet50(input_shape=shape, weights=None, classes=classes, classifier_activation=None)
    elif name == "convnext_tiny":
        model = apps.ConvNeXtTiny(input_shape=shape, weights=None, classes=classes, classifier_activation=None)
    elif name == "efficientnetv2_b0":
        model = apps.EfficientNetV2B0(input_shape=shape, weights=None, classes=classes, classifier_activation=None)
    elif name == "convnext_mini":
        from keras.src.applications import convnext

        model = convnext.ConvNeXt(depths=[1, 1, 1, 1], projection_dims=[8, 16, 24, 32], default_size=size,
                                  name="convnext_mini", input_shape=shape, weights=None, classes=classes,
                                  classifier_activation=None)
    elif name == "efficientnetv2_mini":
        from keras.src.applications import efficientnet_v2

        model = efficientnet_v2.EfficientNetV2(width_coefficient=0.5, depth_coefficient=1.0, default_size=size,
                                               blocks_args=EFFNETV2_MINI_BLOCKS, name="efficientnetv2_mini",
                                               input_shape=shape, weights=None, classes=classes,
                                               classifier_activation=None)
    elif name == "transformer":
        model = transformer_block(keras, seq, dim, heads, ff)
    elif name == "tiny":
        model = tiny_cnn(keras, shape, classes)
    else:
        raise SystemExit(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    randomize(keras, model, np.random.default_rng(seed))
    return model


def _sublayers(layer):
    """``layer`` and every layer nested in it (Sequential blocks of ConvNeXt, ...)."""
    yield layer
    for sub in getattr(layer, "layers", None) or []:
        yield from _sublayers(sub)


def randomize(keras, model, rng: np.random.Generator) -> None:
    """Seeded random normalization statistics and scales, Keras' identities otherwise."""
    for layer in _sublayers(model):
        if isinstance(layer, keras.layers.BatchNormalization):
            c = layer.gamma.shape[0] if layer.gamma is not None else layer.moving_mean.shape[0]
            if layer.gamma is not None:
                layer.gamma.assign(rng.uniform(0.5, 1.5, c).astype(np.float32))
            if layer.beta is not None:
                layer.beta.assign(rng.normal(0.0, 0.1, c).astype(np.float32))
            layer.moving_mean.assign(rng.normal(0.0, 0.1, c).astype(np.float32))
            layer.moving_variance.assign(rng.uniform(0.5, 1.5, c).astype(np.float32))
        elif isinstance(layer, keras.layers.LayerNormalization):
            if getattr(layer, "gamma", None) is not None:
                layer.gamma.assign(rng.uniform(0.5, 1.5, layer.gamma.shape).astype(np.float32))
            if getattr(layer, "beta", None) is not None:
                layer.beta.assign(rng.normal(0.0, 0.1, layer.beta.shape).astype(np.float32))
        elif type(layer).__name__ == "LayerScale":  # ConvNeXt: initialized to 1e-6
            layer.gamma.assign(rng.uniform(0.1, 0.3, layer.gamma.shape).astype(np.float32))


def freeze(model, input_shape, classifier: bool = True):
    """(GraphDef, frozen concrete function): softmax and logits of a classifier, else the
    model's output; variables frozen to constants, the batch dimension unknown."""
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    @tf.function
    def forward(x):
        y = model(x, training=False)
        return [tf.nn.softmax(y), y] if classifier else [y]

    concrete = forward.get_concrete_function(tf.TensorSpec([None, *input_shape], tf.float32, name="input"))
    frozen = convert_variables_to_constants_v2(concrete)
    return frozen.graph.as_graph_def(), frozen


def default_stem(args) -> str:
    if args.model == "transformer":
        return f"transformer_{args.seq}x{args.dim}" + ("_tf1" if args.tf1 else "")
    return "_".join([args.model, *([f"a{args.alpha:g}"] if args.model == "mobilenet_v2" and args.alpha != 1.0 else []),
                     str(args.size), *(["tf1"] if args.tf1 else [])])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", choices=MODELS)
    ap.add_argument("--size", type=int, default=224, help="input height and width")
    ap.add_argument("--alpha", type=float, default=1.0, help="MobileNetV2 width multiplier")
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--seq", type=int, default=64, help="transformer: sequence length")
    ap.add_argument("--dim", type=int, default=128, help="transformer: model width")
    ap.add_argument("--heads", type=int, default=4, help="transformer: attention heads (key_dim = dim / heads)")
    ap.add_argument("--ff", type=int, default=512, help="transformer: feed-forward width")
    ap.add_argument("--tf1", action="store_true", help="build with tf-keras (FusedBatchNormV3)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default=None, help="file stem (default: derived from the options)")
    ap.add_argument("-o", "--output", default="build/tf", help="folder to write")
    args = ap.parse_args(argv)

    import tensorflow as tf

    model = build_model(args.model, args.size, args.alpha, args.classes, args.tf1, args.seed,
                        args.seq, args.dim, args.heads, args.ff)
    classifier = args.model != "transformer"
    in_shape = (args.seq, args.dim) if not classifier else (args.size, args.size, 3)
    graph_def, frozen = freeze(model, in_shape, classifier)
    stem = args.name or default_stem(args)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.pb").write_bytes(graph_def.SerializeToString())
    rng = np.random.default_rng(args.seed + 1)
    if args.model in PIXELS:
        x = rng.uniform(0.0, 255.0, (1, *in_shape)).astype(np.float32)
    else:
        x = rng.standard_normal((1, *in_shape)).astype(np.float32)
    ys = [t.numpy() for t in frozen(tf.constant(x))]
    names = ["Identity", "Identity_1"][: len(ys)]
    np.savez(out / f"{stem}.in.npz", input=x)
    np.savez(out / f"{stem}.out.npz", **dict(zip(names, ys)))
    ops: dict[str, int] = {}
    for n in graph_def.node:
        ops[n.op] = ops.get(n.op, 0) + 1
    for f in graph_def.library.function:
        for n in f.node_def:
            ops[n.op] = ops.get(n.op, 0) + 1
    print(f"{out / stem}.pb: {(out / f'{stem}.pb').stat().st_size / 1e6:.2f} MB, {len(graph_def.node)} nodes, "
          f"{len(graph_def.library.function)} library functions")
    print("  ops: " + ", ".join(f"{k}×{v}" for k, v in sorted(ops.items())))
    if classifier:
        probs, logits = ys
        print(f"  logits range [{logits.min():.3g}, {logits.max():.3g}], max softmax {probs.max():.3g}")
    else:
        print(f"  output {list(ys[0].shape)}, range [{ys[0].min():.3g}, {ys[0].max():.3g}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
