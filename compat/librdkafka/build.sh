#!/usr/bin/env bash
# Fetches librdkafka's source (with its tests/) and builds the test runner, once per cache.
#
# The source comes from the npm registry: @confluentinc/kafka-javascript bundles librdkafka's
# whole tree (src/, tests/, mklove) under deps/librdkafka. The tarball is pinned by version and
# SHA-256. The build uses the system's libraries (no --install-deps: nothing is downloaded
# besides the tarball) and is kept in the cache directory, reused while its stamp matches.
#
# Prints the source directory on its last line. Environment:
#   ONCELOG_COMPAT_CACHE  cache root (default ~/.cache/oncelog-compat)
#   COMPAT_JOBS           make -j (default: at most 2, the machine is shared)
set -euo pipefail

RDK_VERSION=2.15.1
NPM_PACKAGE=@confluentinc/kafka-javascript
NPM_VERSION=1.10.1
NPM_TARBALL=confluentinc-kafka-javascript-${NPM_VERSION}.tgz
NPM_SHA256=ada7d703bb1d3237e2292bfabf438d663b6160c9f1ac2a2406b5dc4257c81b66
CONFIGURE_ARGS=(--disable-curl --disable-gssapi)

CACHE="${ONCELOG_COMPAT_CACHE:-$HOME/.cache/oncelog-compat}"
SRC="$CACHE/librdkafka-$RDK_VERSION"
STAMP="$SRC/.oncelog-built"
# the build dependencies are part of the stamp: a build without RapidJSON silently skips four tests
DEB_DEPS=(make gcc g++ pkg-config libssl-dev zlib1g-dev libzstd-dev liblz4-dev rapidjson-dev)
STAMP_TEXT="$NPM_SHA256 ${CONFIGURE_ARGS[*]} ${DEB_DEPS[*]}"
nproc_=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)
JOBS="${COMPAT_JOBS:-$(( nproc_ < 2 ? nproc_ : 2 ))}"

say() { echo "compat/librdkafka: $*" >&2; }

if [[ -x "$SRC/tests/test-runner" && -f "$STAMP" && "$(cat "$STAMP")" == "$STAMP_TEXT" ]]; then
    say "using the cached build in $SRC"
    echo "$SRC"
    exit 0
fi

# Build dependencies: Debian's packages when we may install them; otherwise configure
# leaves out whatever is missing (zstd, lz4 fall back to builtin or off; without RapidJSON the
# tests 0053, 0098, 0101 and 0110 skip themselves).
if command -v dpkg-query >/dev/null && command -v apt-get >/dev/null && [[ $(id -u) == 0 ]]; then
    missing=()
    for p in "${DEB_DEPS[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
    done
    if (( ${#missing[@]} )); then
        say "installing ${missing[*]}"
        apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            "${missing[@]}" >&2
    fi
fi
for tool in npm make cc c++ sha256sum tar; do
    command -v "$tool" >/dev/null || { say "needs $tool on PATH"; exit 2; }
done

mkdir -p "$CACHE/dl"
tarball="$CACHE/dl/$NPM_TARBALL"
if [[ ! -f "$tarball" ]] || ! echo "$NPM_SHA256  $tarball" | sha256sum -c --status; then
    say "fetching $NPM_PACKAGE@$NPM_VERSION (bundles librdkafka $RDK_VERSION)"
    rm -f "$tarball"
    (cd "$CACHE/dl" && npm pack --silent "$NPM_PACKAGE@$NPM_VERSION" >&2)
fi
if ! echo "$NPM_SHA256  $tarball" | sha256sum -c --status; then
    say "checksum mismatch for $tarball (expected $NPM_SHA256)"
    exit 2
fi

say "building librdkafka $RDK_VERSION and its test runner in $SRC (make -j$JOBS)"
started=$(date +%s)
# built beside the cached tree and moved into place when done: a run using the old build keeps
# working, and an interrupted build leaves no half-built tree behind a matching stamp
BUILD="$SRC.tmp"
rm -rf "$BUILD"
mkdir -p "$BUILD"
tar -xzf "$tarball" -C "$BUILD" --strip-components=3 package/deps/librdkafka
grep -q "RD_KAFKA_VERSION  *0x020f01ff" "$BUILD/src/rdkafka.h" \
    || { say "the tarball does not hold librdkafka $RDK_VERSION"; exit 2; }
(
    cd "$BUILD"
    nice -n 10 ./configure "${CONFIGURE_ARGS[@]}" >"$BUILD/oncelog-configure.log" 2>&1 \
        || { tail -40 "$BUILD/oncelog-configure.log" >&2; exit 1; }
    nice -n 10 make -j"$JOBS" libs >"$BUILD/oncelog-build.log" 2>&1 \
        || { tail -40 "$BUILD/oncelog-build.log" >&2; exit 1; }
    nice -n 10 make -j"$JOBS" -C tests build >>"$BUILD/oncelog-build.log" 2>&1 \
        || { tail -40 "$BUILD/oncelog-build.log" >&2; exit 1; }
)
grep -q "^WITH_RAPIDJSON=.*y" "$BUILD/Makefile.config" \
    || say "built without RapidJSON: 0053, 0098, 0101 and 0110 will skip themselves"
rm -rf "$SRC.old"
[[ -d "$SRC" ]] && mv "$SRC" "$SRC.old"
mv "$BUILD" "$SRC"
rm -rf "$SRC.old"
echo "$STAMP_TEXT" >"$STAMP"
say "built in $(( $(date +%s) - started )) s"
echo "$SRC"
