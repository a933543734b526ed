#!/usr/bin/env bash
# Get a Docker engine answering on a Debian machine without one (as root): install Debian's
# docker.io (dockerd 20.10, legacy builder) and debootstrap (docker/make-base.sh) when missing,
# then start dockerd in the background when `docker info` gets no answer; its log goes to
# /var/log/dockerd.log. With systemd, `systemctl start docker` is the usual way instead.
#   docker/start-engine.sh          (then: make docker, or the slow tests of tests/test_docker.py)
set -euo pipefail
fail() { echo "start-engine.sh: $*" >&2; exit 2; }
[ "$(id -u)" = 0 ] || fail "run as root (apt-get install, dockerd)"
if docker info >/dev/null 2>&1; then
  echo "start-engine.sh: a Docker engine already answers"
  exit 0
fi
missing=()
command -v dockerd >/dev/null || missing+=(docker.io)
command -v debootstrap >/dev/null || missing+=(debootstrap)
if [ ${#missing[@]} -gt 0 ]; then
  echo "start-engine.sh: apt-get install ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
echo "start-engine.sh: starting dockerd (log: /var/log/dockerd.log)"
nohup dockerd > /var/log/dockerd.log 2>&1 &
for _ in $(seq 60); do
  docker info >/dev/null 2>&1 && { echo "start-engine.sh: dockerd answers"; exit 0; }
  sleep 1
done
tail -20 /var/log/dockerd.log >&2
fail "dockerd did not answer within 60 s (log above)"
