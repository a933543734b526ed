"""Package discovery (everything else is in pyproject.toml).

Every stage is a sub-package of ``polyml/`` (``polyml.kernels`` one file per op family,
``polyml.passes`` one file per pass), found rather than listed, so a new sub-package is always in
the wheel.  The emulator's C runtime (``polyml/gpu/emulate/runtime.c``) is package data too.  The
lock files ``requirements/*.txt`` install as data under ``polyml/requirements/`` (read by
``polyml.lockfile``: ``polyml doctor`` and every manifest record the lock's sha256).
"""

from setuptools import find_packages, setup

packages = find_packages(include=["polyml", "polyml.*"])
package_dir = {"polyml": "polyml"}
# data only (no __init__.py): the locks
packages.append("polyml.requirements")
package_dir["polyml.requirements"] = "requirements"

setup(packages=packages, package_dir=package_dir,
      package_data={"polyml.requirements": ["runtime.txt", "test.txt"],
                    # the CUDA emulator's grid runtime, compiled with clang at first use
                    "polyml.gpu.emulate": ["runtime.c"]})
