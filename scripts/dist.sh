#!/usr/bin/env bash
# Build polyml's sdist and, from that sdist, its wheel into OUT (default dist/): what a user gets
# from `pip install polyml-*.whl`, or from the sdist. Built from a copy of the working tree (the
# files git tracks or would add, so nothing is written into the checkout) with the venv's locked
# setuptools: no download, the same backend as `make setup`. The same sources give the same
# wheel, byte for byte (SOURCE_DATE_EPOCH: the last commit's time).
#   scripts/dist.sh [OUT]          (make dist)
# Environment: PYTHON (default .venv/bin/python, which `make setup` makes).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=$(realpath -m "${1:-dist}")
PY=${PYTHON:-.venv/bin/python}
[[ "$PY" != */* || "$PY" == /* ]] || PY=$PWD/$PY  # the build runs in a copy elsewhere
fail() { echo "dist.sh: $*" >&2; exit 2; }
[ -x "$PY" ] || command -v "$PY" >/dev/null || fail "$PY not found: run make setup first"
"$PY" - <<'PYEOF' || fail "setuptools>=68 missing in $PY: run make setup (requirements/test.txt locks it)"
import sys
from importlib.metadata import version
sys.exit(int(version("setuptools").split(".")[0]) < 68)
PYEOF

# reproducible archives: file times in the wheel are the last commit's, not the build's
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 315532800)}
export SOURCE_DATE_EPOCH
tmp=$(mktemp -d /tmp/polyml-dist.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/src"
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  git ls-files -z -co --exclude-standard \
    | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done \
    | tar --null -T - -cf - | tar -xf - -C "$tmp/src"
else  # an unpacked sdist or a copy: everything but environments and build outputs
  tar --exclude=./.venv --exclude=./build --exclude=./dist --exclude='*.egg-info' --exclude=__pycache__ \
      --exclude=./.git -cf - . | tar -xf - -C "$tmp/src"
fi
mkdir -p "$OUT"
sdist=$(cd "$tmp/src" && "$PY" -c 'import sys; from setuptools import build_meta as b; print(b.build_sdist(sys.argv[1]))' "$tmp/sdist" 2>"$tmp/sdist.log" | tail -1) \
  || { cat "$tmp/sdist.log" >&2; fail "building the sdist failed"; }
cp "$tmp/sdist/$sdist" "$OUT/"
"$PY" -m pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation --no-index -w "$OUT" "$OUT/$sdist" \
  || fail "building the wheel from $sdist failed"
echo "dist.sh: $OUT/$sdist"
ls "$OUT"/polyml-*.whl | sed 's/^/dist.sh: /'
