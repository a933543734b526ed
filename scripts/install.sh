#!/usr/bin/env bash
# Install what polyml needs, idempotently: Debian's LLVM 19 with Polly (apt) and a virtual
# environment with the locked Python packages and polyml (pip). Quick when all is there.
# Used by `make setup`, CI (.ci/run → make test) and docker/Dockerfile.
#   scripts/install.sh [VENV]      (default .venv; VENV=- installs into the current Python)
# Python packages come from the lock files (exact versions and sha256, pip --require-hashes):
# requirements/test.txt for the test, bench and plot extras, requirements/runtime.txt for none
# (POLYML_EXTRAS=""). Then polyml itself, without dependencies: editable from this checkout, or
# from the wheelhouse's polyml wheel. Extras outside the lock (cuda, tf) are resolved by pip
# from pyproject.toml's ranges on top, unpinned.
# Environment (all optional):
#   POLYML_EXTRAS=test,bench                   pip extras (default test)
#   POLYML_WHEELHOUSE=DIR                      install offline from DIR (--no-index): the locked
#                                              wheels and polyml-*.whl (docker/build.sh makes it)
#   POLYML_LLVM_APT_VERSION=1:19.1.7-3~deb12u1 exact apt version of llvm-19 clang-19 libpolly-19-dev
#   POLYML_PYTHON_APT_VERSION=3.11.2-1+b1      exact apt version of python3 python3-venv, installed
#                                              only when the Python found has no working venv
#   POLYML_INSTALL_STEPS=apt,python            only these steps (docker/Dockerfile: apt, then python,
#                                              so that a new wheelhouse leaves the apt layer cached)
#   POLYML_INSTALL_DRY_RUN=1                   print what would be installed, change nothing
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv}
LLVM=19
EXTRAS=${POLYML_EXTRAS-test}
WHEELHOUSE=${POLYML_WHEELHOUSE:-}
PY=${PYTHON:-python3}
LLVM_PIN=${POLYML_LLVM_APT_VERSION:-}
PY_PIN=${POLYML_PYTHON_APT_VERSION:-}
DRY=${POLYML_INSTALL_DRY_RUN:-}
STEPS=,${POLYML_INSTALL_STEPS:-apt,python},

run() {  # run a command, or only show it in a dry run
  if [ -n "$DRY" ]; then echo "install.sh: would run: $*"; else "$@"; fi
}

if [[ "$STEPS" == *,apt,* ]]; then
  want=("llvm-$LLVM" "clang-$LLVM" "libpolly-$LLVM-dev")
  pins=("$LLVM_PIN" "$LLVM_PIN" "$LLVM_PIN")
  if [ "$VENV" != "-" ] && ! "$PY" -c "import ensurepip, venv" 2>/dev/null; then
    want+=(python3 python3-venv); pins+=("$PY_PIN" "$PY_PIN"); PY=python3
  fi
  need_apt=()
  for i in "${!want[@]}"; do
    pkg=${want[$i]}; pin=${pins[$i]}
    have=$(dpkg-query -W -f='${Status} ${Version}' "$pkg" 2>/dev/null || true)
    if [[ "$have" == "install ok installed "* ]] && { [ -z "$pin" ] || [ "$have" = "install ok installed $pin" ]; }; then
      continue
    fi
    need_apt+=("$pkg${pin:+=$pin}")
  done
  if [ ${#need_apt[@]} -gt 0 ]; then
    echo "install.sh: apt-get install ${need_apt[*]}"
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    run $SUDO apt-get update -qq
    run $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_apt[@]}"
  fi
  # Polly's parallel code calls GNU OpenMP: libgomp must be linkable.
  if [ -z "$DRY" ] && ! "clang-$LLVM" -print-file-name=libgomp.so | grep -q /; then
    echo "install.sh: warning: libgomp.so not found by clang-$LLVM (install libgcc-12-dev or gcc)" >&2
  fi
fi

if [[ "$STEPS" != *,python,* ]]; then exit 0; fi
if [ "$VENV" = "-" ]; then
  PIP=("$PY" -m pip)
  stamp=".polyml-installed"
else
  [ -x "$VENV/bin/python" ] || run "$PY" -m venv "$VENV"
  PIP=("$VENV/bin/python" -m pip)
  stamp="$VENV/.polyml-installed"
fi
PIP+=(install -q --disable-pip-version-check)

# which lock: test.txt covers the test, bench and plot extras, runtime.txt none; other extras go unlocked
LOCK=requirements/runtime.txt
unlocked=()
IFS=, read -r -a extras <<< "$EXTRAS"
for e in "${extras[@]}"; do
  case "$e" in
    "") ;;
    test|bench|plot) LOCK=requirements/test.txt ;;
    *) unlocked+=("$e") ;;
  esac
done
[ -f "$LOCK" ] || { echo "install.sh: $LOCK missing (make lock writes it)" >&2; exit 2; }
offline=()
polyml=(-e .)
if [ -n "$WHEELHOUSE" ]; then
  offline=(--no-index --find-links "$WHEELHOUSE")
  whl=$(find "$WHEELHOUSE" -maxdepth 1 -name 'polyml-*.whl' | head -1)
  [ -n "$whl" ] || { echo "install.sh: no polyml-*.whl in $WHEELHOUSE" >&2; exit 2; }
  polyml=("$whl")
fi
# reinstall when the lock, pyproject.toml, setup.py (packages), the extras or the source of polyml changed
want="$EXTRAS $(sha256sum "$LOCK" | cut -c1-64) ${polyml[*]}"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ setup.py -nt "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "install.sh: pip install --require-hashes -r $LOCK${WHEELHOUSE:+ (offline, from $WHEELHOUSE)}"
  run "${PIP[@]}" "${offline[@]}" --require-hashes -r "$LOCK"
  # polyml itself; the locked setuptools builds it (no download of a build environment)
  run "${PIP[@]}" "${offline[@]}" --no-deps --no-build-isolation "${polyml[@]}"
  if [ ${#unlocked[@]} -gt 0 ]; then
    spec=$(IFS=,; echo "${unlocked[*]}")
    echo "install.sh: extras not in the lock, resolved from pyproject.toml's ranges: $spec"
    if [ -n "$WHEELHOUSE" ]; then
      run "${PIP[@]}" "${offline[@]}" "polyml[$spec] @ file://$(realpath "${polyml[0]}")"
    else
      run "${PIP[@]}" -e ".[$spec]"
    fi
  fi
  [ -n "$DRY" ] || echo "$want" > "$stamp"
fi
