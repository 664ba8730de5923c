#!/usr/bin/env bash
# Builds libcaf_core 0.17.6 from Debian's source package with
# -fsanitize=thread and installs it into a cache prefix outside the clone, so
# that ThreadSanitizer sees inside the actors (Debian's libcaf is not
# instrumented: ../shared/CAF-NOTES.md). Prints the prefix on its last line.
#
#   bash scripts/caf-tsan.sh            # build if the prefix is not there yet
#   AG_CAF_TSAN_CACHE=/some/dir bash scripts/caf-tsan.sh
#
# The prefix is keyed by the CAF version, the compiler and the flags
# (/var/cache/actorgraph/caf-0.17.6-tsan-<key>), so a machine that has it does
# not build again; a change of compiler or flags builds a new one. Only
# libcaf_core is built: actorgraph links nothing else of CAF (cmake/FindCAF.cmake
# still finds Debian's libcaf_io, which no target links).
#
# Source: `apt-get source libcaf-dev` (source package actor-framework). If
# deb-src is not configured, a deb-src entry for bookworm main is added in
# /etc/apt/sources.list.d/actorgraph-deb-src.sources. Debian's packaging
# tarball (debian/ patches) is not needed: the build uses upstream's orig
# tarball, checked against the SHA-256 in the .dsc; the packaging only adds
# Debian's install layout. Built like Debian's package: shared library,
# exceptions on, log level QUIET.
#
# Use it: cmake -DCAF_ROOT=<prefix> -DACTORGRAPH_SANITIZER=thread ...
# (scripts/tsan.sh does all of this). Needs: build-essential, cmake, ninja,
# dpkg-dev (dpkg-source), curl or apt's downloader.
set -euo pipefail

version=0.17.6
cxx="${CXX:-c++}"
flags="-O2 -g1 -fsanitize=thread -fno-omit-frame-pointer"
compiler_id="$("$cxx" --version | head -1)"
key="$(printf '%s|%s|%s' "$version" "$compiler_id" "$flags" | sha256sum | cut -c1-12)"
cache="${AG_CAF_TSAN_CACHE:-/var/cache/actorgraph}"
prefix="$cache/caf-$version-tsan-$key"
jobs="${AG_BUILD_JOBS:-$(nproc)}"

if [ -f "$prefix/.complete" ]; then
  echo "== CAF $version (TSan) already built: $prefix" >&2
  echo "$prefix"
  exit 0
fi

sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"

if ! apt-cache showsrc libcaf-dev 2>/dev/null | grep -q '^Package: actor-framework'; then
  echo "== enabling deb-src for bookworm main (apt-get source)" >&2
  $sudo tee /etc/apt/sources.list.d/actorgraph-deb-src.sources >/dev/null <<'EOF'
# Added by actorgraph scripts/caf-tsan.sh: source packages (apt-get source)
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
  $sudo apt-get update -qq
fi

echo "== apt-get source libcaf-dev (actor-framework $version)" >&2
# A mirror may lack the small debian.tar.xz; the orig tarball is what we build.
apt-get source --download-only -qq libcaf-dev >&2 || true
dsc="$(ls actor-framework_"$version"-*.dsc 2>/dev/null | head -1 || true)"
orig="actor-framework_$version.orig.tar.gz"
if [ -z "$dsc" ] || [ ! -f "$orig" ]; then
  echo "caf-tsan: could not download the actor-framework $version source package" >&2
  exit 1
fi
want="$(awk '/^Checksums-Sha256:/{f=1;next} /^[^ ]/{f=0} f && $3=="'"$orig"'"{print $1}' "$dsc")"
have="$(sha256sum "$orig" | cut -d' ' -f1)"
if [ -z "$want" ] || [ "$want" != "$have" ]; then
  echo "caf-tsan: $orig does not match the SHA-256 in $dsc ($have vs '$want')" >&2
  exit 1
fi
tar xzf "$orig"
src="$work/actor-framework-$version"

echo "== building libcaf_core $version with: $flags (compiler: $compiler_id)" >&2
start=$(date +%s)
cmake -S "$src" -B "$work/build" -G Ninja \
  -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_BUILD_TYPE=None \
  -DCMAKE_CXX_FLAGS="$flags" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=thread" \
  -DCMAKE_INSTALL_PREFIX="$prefix" \
  -DCMAKE_INSTALL_LIBDIR=lib \
  -DCAF_NO_IO=yes -DCAF_NO_OPENSSL=yes -DCAF_NO_OPENCL=yes -DCAF_NO_PYTHON=yes \
  -DCAF_NO_TOOLS=yes -DCAF_NO_EXAMPLES=yes -DCAF_NO_UNIT_TESTS=yes -DCAF_NO_SUMMARY=yes \
  -DCAF_LOG_LEVEL=QUIET >"$work/configure.log" 2>&1 || {
  cat "$work/configure.log" >&2
  exit 1
}
cmake --build "$work/build" -j "$jobs" --target libcaf_core_shared >&2
$sudo mkdir -p "$cache"
$sudo rm -rf "$prefix.tmp"
$sudo cmake --install "$work/build" --prefix "$prefix.tmp" >/dev/null
printf 'version=%s\ncompiler=%s\nflags=%s\nbuild_seconds=%s\n' \
  "$version" "$compiler_id" "$flags" "$(( $(date +%s) - start ))" | $sudo tee "$prefix.tmp/.complete" >/dev/null
$sudo rm -rf "$prefix"
$sudo mv "$prefix.tmp" "$prefix"
echo "== CAF $version (TSan) built in $(( $(date +%s) - start )) s: $prefix" >&2
echo "$prefix"
