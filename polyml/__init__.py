"""polyml: a polyhedral compiler for neural-network models around LLVM's opt/Polly.

Pipeline (one package or folder per stage): ``polyml.frontends`` (ONNX, TensorFlow) → graph IR
(``polyml.graph``) → ``polyml.kernels`` (op lowerings to affine loop nests in LLVM IR) →
``polyml.passes`` (islpy transforms of Polly's JSCoP) → ``polyml.driver`` (opt/Polly, llc, link)
→ ``polyml.runtime`` (native code called from Python).
"""

from polyml._version import __version__
from polyml.compiler import compile, load

__all__ = ["compile", "load", "__version__"]
