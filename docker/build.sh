#!/usr/bin/env bash
# `make docker`: build docker/Dockerfile's image and run the smoke test in it.
#   docker/build.sh [--no-test | --context-only]
# 1. A Docker engine must answer; 2. the base image (docker/Dockerfile's FROM) is used when
# present, else pulled, else made by docker/make-base.sh (debootstrap) where no registry answers;
# 3. the build context build/docker-context/ is prepared: the Dockerfile, scripts/install.sh,
# requirements/, docker/smoke.py and wheelhouse/ (every wheel of requirements/test.txt, fetched
# with pip download --require-hashes, and polyml's wheel built from its sdist by scripts/dist.sh),
# and nothing else: no .venv, build outputs or caches, whatever builder (the legacy one of
# Debian's docker.io 20.10 included) and whatever .dockerignore; 4. docker build; 5. the smoke
# test: docker/smoke.py in a container with a host folder mounted at /models (doctor, a bundled
# CNN built, run and compared with onnxruntime, the rebuild from its manifest), then
# `polyml build --from-manifest` again in a second, fresh container: the same artifact_sha256.
# --context-only stops after 3 (no engine needed). Environment:
#              POLYML_IMAGE (default polyml:VERSION, also tagged polyml:latest),
#              POLYML_DOCKER_CONTEXT (default build/docker-context),
#              PYTHON (default .venv/bin/python: pip and setuptools of `make setup`),
#              SMOKE_DIR (where the smoke test's files stay; default a temporary folder).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
fail() { echo "docker/build.sh: $*" >&2; exit 2; }
say() { echo "docker/build.sh: $*"; }
test_too=1
context_only=
case "${1:-}" in
  "") ;;
  --no-test) test_too= ;;
  --context-only) context_only=1 ;;
  *) fail "unknown argument $1 (--no-test, --context-only)" ;;
esac
PY=${PYTHON:-.venv/bin/python}
[[ "$PY" != */* || "$PY" == /* ]] || PY=$root/$PY
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE=${POLYML_IMAGE:-polyml:$VERSION}
CTX=${POLYML_DOCKER_CONTEXT:-build/docker-context}
start=$SECONDS

# 1. the engine (and 2. the base image), unless only the context is wanted
if [ -z "$context_only" ]; then
if ! command -v docker >/dev/null; then
  fail "no docker command. On Debian: apt-get install docker.io, then start the engine (systemctl start docker,
or where there is no systemd: dockerd > /var/log/dockerd.log 2>&1 &); docker/start-engine.sh does both, as root.
See docker/README.md."
fi
if ! docker info >/dev/null 2>&1; then
  fail "no Docker engine answers (docker info failed). Start it: systemctl start docker, or as root where there
is no systemd: dockerd > /var/log/dockerd.log 2>&1 & (Debian's package: apt-get install docker.io);
docker/start-engine.sh does both, as root. See docker/README.md."
fi

# 2. the base image
BASE=$(awk 'toupper($1) == "FROM" { print $2; exit }' docker/Dockerfile)
if ! docker image inspect "$BASE" >/dev/null 2>&1; then
  say "pulling $BASE"
  if ! docker pull "$BASE"; then
    command -v debootstrap >/dev/null || fail "$BASE cannot be pulled and debootstrap is missing to make it:
apt-get install debootstrap, then docker/make-base.sh (see docker/README.md)"
    say "no registry answers: making $BASE with docker/make-base.sh (debootstrap)"
    docker/make-base.sh "$BASE"
  fi
fi
fi

[ -x "$PY" ] || command -v "$PY" >/dev/null || fail "$PY not found: run make setup first"

# 3. the build context: only what the Dockerfile copies
say "preparing $CTX"
rm -rf "$CTX"
mkdir -p "$CTX/scripts" "$CTX/requirements" "$CTX/docker" "$CTX/wheelhouse"
cp docker/Dockerfile "$CTX/Dockerfile"
cp scripts/install.sh "$CTX/scripts/"
cp requirements/runtime.txt requirements/test.txt "$CTX/requirements/"
cp docker/smoke.py "$CTX/docker/"
scripts/dist.sh "$CTX/dist" >/dev/null
mv "$CTX"/dist/polyml-*.whl "$CTX/wheelhouse/"
rm -rf "$CTX/dist"
# wheels for the image's Python (CPython 3.11, glibc 2.36, x86_64) whatever the host; this pip
# takes only the platform tags it is given, so every manylinux tag up to glibc 2.36 is named
platforms=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64)
for glibc in $(seq 5 36); do platforms+=(--platform "manylinux_2_${glibc}_x86_64"); done
"$PY" -m pip download -q --disable-pip-version-check --require-hashes --no-deps --only-binary=:all: \
  "${platforms[@]}" --python-version 3.11 --implementation cp --abi cp311 \
  -d "$CTX/wheelhouse" -r requirements/test.txt 2> >(grep -v "is ignored: it is neither" >&2) \
  || fail "pip download of requirements/test.txt failed (a package index must be reachable from the host)"
say "wheelhouse: $(find "$CTX/wheelhouse" -name '*.whl' | wc -l) wheels, $(du -sm "$CTX/wheelhouse" | cut -f1) MB"
[ -z "$context_only" ] || exit 0

# 4. the image
docker buildx version >/dev/null 2>&1 || export DOCKER_BUILDKIT=0  # the legacy builder (docker.io 20.10)
say "docker build -t $IMAGE${DOCKER_BUILDKIT:+ (DOCKER_BUILDKIT=$DOCKER_BUILDKIT)}"
t0=$SECONDS
previous=$(docker image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)
docker build -t "$IMAGE" -t polyml:latest "$CTX"
# the image this build replaced lost its tags: remove it (1.8 GB each) unless a container uses it
current=$(docker image inspect --format '{{.Id}}' "$IMAGE")
if [ -n "$previous" ] && [ "$previous" != "$current" ]; then
  docker rmi "$previous" >/dev/null 2>&1 && say "removed the image it replaced (${previous:7:12})" || true
fi
say "built $IMAGE in $((SECONDS - t0)) s ($(docker image inspect --format '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1 / 1e6}'))"
[ -n "$test_too" ] || exit 0

# 5. the smoke test, in a folder of the host mounted at /models, as the host's user
work=${SMOKE_DIR:-$(mktemp -d /tmp/polyml-smoke.XXXXXX)}
mkdir -p "$work"
user=(--user "$(id -u):$(id -g)")
t0=$SECONDS
docker run --rm "${user[@]}" -v "$work:/models" --entrypoint python "$IMAGE" /opt/polyml/docker/smoke.py /models \
  || fail "smoke test failed (its files: $work)"
sha=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["artifact_sha256"])' "$work/smoke.json")
say "rebuilding squeezenet.polyml from its manifest in a fresh container"
rm -rf "$work/squeezenet.fresh"
docker run --rm "${user[@]}" -v "$work:/models" "$IMAGE" \
    build --from-manifest squeezenet.polyml/manifest.json -o squeezenet.fresh \
  || fail "the rebuild in a fresh container differs (files: $work)"
again=$("$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["artifact_sha256"])' "$work/squeezenet.fresh/manifest.json")
[ "$again" = "$sha" ] || fail "the fresh container's rebuild has artifact_sha256 $again, not $sha"
say "smoke test passed in $((SECONDS - t0)) s: artifact_sha256 $sha rebuilt identically; files in $work"
say "done in $((SECONDS - start)) s"
