"""Freeze a Keras application (random weights) to a TensorFlow GraphDef ``.pb`` with a reference.

Needs TensorFlow (``pip install -e '.[tf]'``); polyml itself reads the ``.pb`` without it.

The model gets seeded random weights (``weights=None``, ``keras.utils.set_random_seed``); the
batch-norm statistics, which Keras initializes to the identity (mean 0, variance 1, gamma 1,
beta 0), are replaced by seeded random values so that the frozen normalizations do something.
The classifier is built without its activation; the frozen function returns the softmax
(``Identity``) and the logits (``Identity_1``): with random weights a deep net's softmax often
saturates, which would hide errors in everything before it.

The function is frozen with ``convert_variables_to_constants_v2``; its input Placeholder is
named ``input`` and has an unknown batch dimension.  Written next to each other::

    OUT/NAME.pb         the frozen GraphDef (binary)
    OUT/NAME.in.npz     one seeded standard-normal input, key ``input``
    OUT/NAME.out.npz    TensorFlow's outputs on it, keys ``Identity``, ``Identity_1``

``--tf1`` builds the model with ``tf-keras`` (Keras 2), whose BatchNormalization layers freeze
to ``FusedBatchNormV3`` nodes (Keras 3 decomposes them into Rsqrt/Mul/Add).  ``tiny`` is a small
hand-made CNN (a few kB; with ``--tf1`` its batch norms are FusedBatchNormV3) for test fixtures.

    python scripts/freeze_keras.py mobilenet_v2 --size 224 -o build/tf
    python scripts/freeze_keras.py resnet50 --size 224 -o build/tf
    python scripts/freeze_keras.py mobilenet_v2 --size 96 --alpha 0.35 --classes 10 -o tests/fixtures/tf
    python scripts/freeze_keras.py mobilenet_v2 --tf1 --size 224 -o build/tf
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

MODELS = ("mobilenet_v2", "resnet50", "tiny")


def _keras(tf1: bool):
    if tf1:
        import tf_keras

        return tf_keras
    import keras

    return keras


def build_model(name: str, size: int, alpha: float, classes: int, tf1: bool, seed: int):
    """The Keras model with seeded random weights and no classifier activation."""
    import tensorflow as tf

    keras = _keras(tf1)
    keras.utils.set_random_seed(seed)
    tf.random.set_seed(seed)
    shape = (size, size, 3)
    if name == "mobilenet_v2":
        model = keras.applications.MobileNetV2(input_shape=shape, alpha=alpha, weights=None, classes=classes,
                                               classifier_activation=None)
    elif name == "resnet50":
        model = keras.applications.ResNet50(input_shape=shape, weights=None, classes=classes, classifier_activation=None)
    elif name == "tiny":
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
        model = keras.Model(inp, x)
    else:
        raise SystemExit(f"unknown model {name!r}; choose from {', '.join(MODELS)}")
    rng = np.random.default_rng(seed)
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            c = layer.gamma.shape[0] if layer.gamma is not None else layer.moving_mean.shape[0]
            if layer.gamma is not None:
                layer.gamma.assign(rng.uniform(0.5, 1.5, c).astype(np.float32))
            if layer.beta is not None:
                layer.beta.assign(rng.normal(0.0, 0.1, c).astype(np.float32))
            layer.moving_mean.assign(rng.normal(0.0, 0.1, c).astype(np.float32))
            layer.moving_variance.assign(rng.uniform(0.5, 1.5, c).astype(np.float32))
    return model


def freeze(model, size: int):
    """(GraphDef, concrete function) of softmax and logits, variables frozen to constants."""
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    @tf.function
    def forward(x):
        logits = model(x, training=False)
        return [tf.nn.softmax(logits), logits]

    concrete = forward.get_concrete_function(tf.TensorSpec([None, size, size, 3], tf.float32, name="input"))
    frozen = convert_variables_to_constants_v2(concrete)
    return frozen.graph.as_graph_def(), frozen


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", choices=MODELS)
    ap.add_argument("--size", type=int, default=224, help="input height and width")
    ap.add_argument("--alpha", type=float, default=1.0, help="MobileNetV2 width multiplier")
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--tf1", action="store_true", help="build with tf-keras (FusedBatchNormV3)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--name", default=None, help="file stem (default: derived from the options)")
    ap.add_argument("-o", "--output", default="build/tf", help="folder to write")
    args = ap.parse_args(argv)

    import tensorflow as tf

    model = build_model(args.model, args.size, args.alpha, args.classes, args.tf1, args.seed)
    graph_def, frozen = freeze(model, args.size)
    stem = args.name or "_".join(
        [args.model, *([f"a{args.alpha:g}"] if args.model == "mobilenet_v2" and args.alpha != 1.0 else []),
         str(args.size), *(["tf1"] if args.tf1 else [])]
    )
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.pb").write_bytes(graph_def.SerializeToString())
    x = np.random.default_rng(args.seed + 1).standard_normal((1, args.size, args.size, 3)).astype(np.float32)
    probs, logits = (t.numpy() for t in frozen(tf.constant(x)))
    np.savez(out / f"{stem}.in.npz", input=x)
    np.savez(out / f"{stem}.out.npz", Identity=probs, Identity_1=logits)
    ops: dict[str, int] = {}
    for n in graph_def.node:
        ops[n.op] = ops.get(n.op, 0) + 1
    print(f"{out / stem}.pb: {(out / f'{stem}.pb').stat().st_size / 1e6:.2f} MB, {len(graph_def.node)} nodes")
    print("  ops: " + ", ".join(f"{k}×{v}" for k, v in sorted(ops.items())))
    print(f"  logits range [{logits.min():.3g}, {logits.max():.3g}], max softmax {probs.max():.3g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
