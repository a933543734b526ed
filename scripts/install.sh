#!/usr/bin/env bash
# Install what polyml needs, idempotently: Debian's LLVM 19 with Polly (apt) and a virtual
# environment with polyml in editable mode plus its test extras (pip). Quick when all is there.
# Used by `make setup`, CI (.ci/run → make test) and docker/Dockerfile.
#   scripts/install.sh [VENV]      (default .venv; VENV=- installs into the current Python)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv}
LLVM=19
EXTRAS=${POLYML_EXTRAS:-test}
PY=${PYTHON:-python3}

need_apt=()
for pkg in "llvm-$LLVM" "clang-$LLVM" "libpolly-$LLVM-dev"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need_apt+=("$pkg")
done
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "install.sh: apt-get install ${need_apt[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi
# Polly's parallel code calls GNU OpenMP: libgomp must be linkable.
if ! "clang-$LLVM" -print-file-name=libgomp.so | grep -q /; then
  echo "install.sh: warning: libgomp.so not found by clang-$LLVM (install libgcc-12-dev or gcc)" >&2
fi

if [ "$VENV" = "-" ]; then
  PIP=("$PY" -m pip)
else
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  PIP=("$VENV/bin/python" -m pip)
fi
stamp="${VENV/#-/.}/.polyml-installed"
[ "$VENV" = "-" ] && stamp=".polyml-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  "${PIP[@]}" install -q --disable-pip-version-check -e ".[$EXTRAS]"
  touch "$stamp"
fi
