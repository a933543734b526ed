"""Package discovery (everything else is in pyproject.toml).

polyml's stages live in ``polyml/``; its op kernels and JSCoP passes live at the top of the tree
(``kernels/``, ``passes/``, one file per op family / pass) and install as ``polyml.kernels`` and
``polyml.passes``.  Packages are found, not listed, so a new sub-package is always in the wheel.
The emulator's C runtime (``polyml/gpu/emulate/runtime.c``) is package data too.  The lock files ``requirements/*.txt`` install as data under ``polyml/requirements/`` (read by
``polyml.lockfile``: ``polyml doctor`` and every manifest record the lock's sha256).
"""

from setuptools import find_packages, setup

REMAPPED = ("kernels", "passes")  # top-level folders installed under polyml.

packages = find_packages(include=["polyml", "polyml.*"])
package_dir = {"polyml": "polyml"}
for top in REMAPPED:
    package_dir[f"polyml.{top}"] = top
    packages += [f"polyml.{top}", *(f"polyml.{top}.{sub}" for sub in find_packages(top))]
# data only (no __init__.py): the locks
packages.append("polyml.requirements")
package_dir["polyml.requirements"] = "requirements"

setup(packages=packages, package_dir=package_dir,
      package_data={"polyml.requirements": ["runtime.txt", "test.txt"],
                    # the CUDA emulator's grid runtime, compiled with clang at first use
                    "polyml.gpu.emulate": ["runtime.c"]})
