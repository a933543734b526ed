"""TensorFlow frontend: a frozen GraphDef (``.pb`` binary, ``.pbtxt`` text) → polyml's graph IR.

Moved from ``polyml/frontends/tensorflow.py`` unchanged (see :mod:`.importer`); the split into
loader, importer, rewrites and per-family converters follows.
"""

from polyml.frontends.tensorflow.importer import LAYOUTS, from_graphdef, load_graphdef, optimize, tensor_to_numpy

__all__ = ["from_graphdef", "load_graphdef", "tensor_to_numpy", "optimize", "LAYOUTS"]
