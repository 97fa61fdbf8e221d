#!/usr/bin/env bash
# Fetch Redis's own test suite (the tests/ of its source) into .ci/cache/ and
# install tclsh, for tests/e2e/test_redis_tcl_suite.py.
#
# Redis's source is third-party code: it is never committed here. It comes
# from Debian's source package of the version below (`apt-get source`), the
# newest Debian has: 8.6.3 in experimental (bookworm has 7.0.15, trixie
# 8.0.2, sid 8.0.6). This adds a deb-src entry for that suite (a file of its
# own under /etc/apt/sources.list.d/), downloads the source package without
# building anything, and unpacks only its tests/ into
# .ci/cache/redis-src-<version>/tests/ (gitignored). Runs as root on a
# Debian machine (.ci/run calls it); idempotent: does nothing when that
# version's tests are already there.
#
# Usage: .ci/fetch_redis_tcl_tests.sh
set -euo pipefail

cd "$(dirname "$0")/.."

REDIS_VERSION="8.6.3"          # must match tests/e2e/test_redis_tcl_suite.py
DEBIAN_VERSION="5:8.6.3-1"     # the source package of it
DEBIAN_SUITE="experimental"
DEST=".ci/cache/redis-src-$REDIS_VERSION"

export DEBIAN_FRONTEND=noninteractive
if ! command -v tclsh >/dev/null 2>&1; then
    apt-get update -q
    apt-get install -y -q --no-install-recommends tcl
fi

if [ -f "$DEST/tests/test_helper.tcl" ]; then
    echo "Redis $REDIS_VERSION's tests: $DEST/tests"
    exit 0
fi

SOURCES=/etc/apt/sources.list.d/partita-redis-src.sources
if ! apt-cache showsrc redis 2>/dev/null | grep -q "^Version: $DEBIAN_VERSION\$"; then
    # The machine's own Debian archive (the first URIs of its deb822 list,
    # the main archive; not the security one), for source packages.
    ARCHIVE="$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)"
    if [ -z "$ARCHIVE" ]; then
        ARCHIVE="$(awk '/^deb / {print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)"
    fi
    [ -n "$ARCHIVE" ] || { echo "no Debian archive configured in apt's sources" >&2; exit 1; }
    cat > "$SOURCES" <<SRC
Types: deb-src
URIs: $ARCHIVE
Suites: $DEBIAN_SUITE
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
    apt-get update -q
fi

mkdir -p .ci/cache
TMP="$(mktemp -d .ci/cache/redis-src.XXXXXX)"
trap 'rm -rf "$TMP"' EXIT
# --download-only: the .dsc and the tarballs, checked against the signed
# index; nothing is unpacked or built by apt.
(cd "$TMP" && apt-get source -q --download-only "redis=$DEBIAN_VERSION")
ORIG="$(ls "$TMP"/redis_"$REDIS_VERSION".orig.tar.* | head -n 1)"
mkdir "$TMP/unpacked"
tar -xf "$ORIG" -C "$TMP/unpacked" --wildcards "redis-$REDIS_VERSION/tests/*"
test -f "$TMP/unpacked/redis-$REDIS_VERSION/tests/test_helper.tcl"
# One rename: a run that died half-way leaves no half suite behind.
rm -rf "$DEST"
mv "$TMP/unpacked/redis-$REDIS_VERSION" "$DEST"
echo "Redis $REDIS_VERSION's tests: $DEST/tests"
