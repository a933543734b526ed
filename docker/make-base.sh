#!/usr/bin/env bash
# Make the base image docker/Dockerfile starts FROM (debian:12.11-slim) where no registry can be
# reached: a minimal Debian bookworm root file system made by debootstrap from Debian's archive
# and imported with `docker import` under the same tag. The same release, the same apt sources
# (bookworm, bookworm-updates, bookworm-security in /etc/apt/sources.list.d/debian.sources) and,
# like the official slim image, no documentation or man pages. docker/build.sh (make docker) runs
# it when the tag is neither present nor pullable.
#   docker/make-base.sh [TAG]          default: the FROM line of docker/Dockerfile
# Needs root, debootstrap (apt-get install debootstrap) and a running Docker engine. Environment:
#   DEBIAN_MIRROR=http://deb.debian.org/debian    where debootstrap downloads from
#   DEBIAN_SNAPSHOT=20250601T000000Z              the archive as it was then (snapshot.debian.org),
#                                                 for a tag of an older point release
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
TAG=${1:-$(awk 'toupper($1) == "FROM" { print $2; exit }' "$here/Dockerfile")}
SUITE=bookworm
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY=http://deb.debian.org/debian-security
if [ -n "${DEBIAN_SNAPSHOT:-}" ]; then
  MIRROR=http://snapshot.debian.org/archive/debian/$DEBIAN_SNAPSHOT
  SECURITY=http://snapshot.debian.org/archive/debian-security/$DEBIAN_SNAPSHOT
fi
fail() { echo "make-base.sh: $*" >&2; exit 2; }

[[ "$TAG" =~ ^debian:(12\.[0-9]+)-slim$ ]] || fail "$TAG: expected debian:12.N-slim (Debian bookworm)"
want=${BASH_REMATCH[1]}
[ "$(id -u)" = 0 ] || fail "debootstrap needs root: sudo $0 $*"
command -v debootstrap >/dev/null || fail "debootstrap not found: apt-get install debootstrap"
docker info >/dev/null 2>&1 || fail "no Docker engine answers (docker info): see docker/README.md"

root=$(mktemp -d /tmp/polyml-base.XXXXXX)
trap 'rm -rf "$root"' EXIT
echo "make-base.sh: debootstrap --variant=minbase $SUITE from $MIRROR (a few minutes)"
debootstrap --variant=minbase "$SUITE" "$root" "$MIRROR" > "$root.log" 2>&1 \
  || { tail -20 "$root.log" >&2; fail "debootstrap failed (whole log: $root.log)"; }
rm -f "$root.log"
have=$(cat "$root/etc/debian_version")
if [ "$have" != "$want" ]; then
  fail "the archive has Debian $have, not the $want of $TAG: set DEBIAN_SNAPSHOT to a time when $want was current, or change FROM in docker/Dockerfile (and its pinned versions) to debian:$have-slim"
fi

# apt sources as in Debian's own images (deb822), updates and security included
rm -f "$root/etc/apt/sources.list"
cat > "$root/etc/apt/sources.list.d/debian.sources" <<EOF
Types: deb
URIs: $MIRROR
Suites: $SUITE $SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: $SECURITY
Suites: $SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
# slim: no docs, man pages or translations from later installs; apt keeps no downloaded packages
cat > "$root/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/lintian/*
EOF
cat > "$root/etc/apt/apt.conf.d/docker-clean" <<'EOF'
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
EOF
find "$root/usr/share/doc" -mindepth 2 ! -name copyright -delete 2>/dev/null || true
find "$root/usr/share/doc" -mindepth 1 -type d -empty -delete 2>/dev/null || true
rm -rf "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/* \
       "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/var/log/* "$root"/tmp/*
echo "make-base.sh: docker import as $TAG"
tar --numeric-owner -C "$root" -c . \
  | docker import --change 'CMD ["bash"]' --message "debootstrap --variant=minbase $SUITE ($have)" - "$TAG"
docker image inspect --format "make-base.sh: $TAG is {{.Id}} ({{.Size}} bytes)" "$TAG"
