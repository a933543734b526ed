#!/usr/bin/env bash
# Write the lock files requirements/test.txt and requirements/runtime.txt from pyproject.toml's
# ranges with uv (in the test extra: `make setup` installs it): exact versions and the sha256 of
# every file on the index for them, for CPython 3.11 on x86_64 Linux (Debian bookworm's Python,
# docker/'s image). Versions already in a lock are kept; UPGRADE=1 takes the newest the ranges allow.
#   scripts/lock.sh                 (make lock)
#   UPGRADE=1 scripts/lock.sh       (make lock UPGRADE=1)
# Environment: UV (default .venv/bin/uv), UV_INDEX_URL for another index than PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."
UV=${UV:-.venv/bin/uv}
if ! [ -x "$UV" ] && ! command -v "$UV" >/dev/null; then
  echo "lock.sh: $UV not found: run make setup (uv is in the test extra) or set UV=/path/to/uv" >&2
  exit 2
fi
upgrade=(); [ -z "${UPGRADE:-}" ] || upgrade=(--upgrade)
common=(--quiet --generate-hashes --python-version 3.11 --python-platform x86_64-unknown-linux-gnu
        --native-tls --no-annotate "${upgrade[@]}")
# test: runtime + test + bench + plot extras + the build backend; runtime: the same pins, runtime only
"$UV" pip compile "${common[@]}" --extra test --extra bench --extra plot pyproject.toml requirements/build.in \
  --custom-compile-command "make lock" -o requirements/test.txt "$@"
"$UV" pip compile "${common[@]}" pyproject.toml -c requirements/test.txt \
  --custom-compile-command "make lock" -o requirements/runtime.txt "$@"
echo "lock.sh: requirements/test.txt $(sha256sum requirements/test.txt | cut -c1-12)," \
     "requirements/runtime.txt $(sha256sum requirements/runtime.txt | cut -c1-12)"
