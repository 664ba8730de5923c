#!/usr/bin/env bash
# The README's two quick-start commands on a fresh Debian bookworm system:
# a minimal root file system (debootstrap --variant=minbase: no compiler,
# no git, no CMake, no CUDA) with a clone of this repository's HEAD in
# /root/actorgraph, entered with chroot, where `bash scripts/dev.sh demo`
# (its stdin empty: the demo script, then the prompt sees end of input) and
# then `bash scripts/dev.sh test` run as root, as on a new machine. Each
# prints its seconds and exit status, and the script fails when either does.
#
#   sudo bash scripts/fresh-bookworm.sh [DIR]     # DIR: where the root goes (default: a new /tmp/ag-fresh.XXXX)
#   AG_FRESH_STEPS=demo sudo bash scripts/fresh-bookworm.sh   # the first command only
#
# Not part of CI (.ci/run): it downloads about 1 GB of Debian packages and
# takes as long as CI itself plus the installs (docs/TESTING.md). Needs root,
# network access to deb.debian.org (or AG_FRESH_MIRROR), and debootstrap
# (installed with apt when missing). The root is left in place for a look
# inside; the script unmounts what it mounted there, so `rm -rf DIR` is safe
# once it has finished.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ "$(id -u)" = 0 ] || { echo "fresh-bookworm.sh: run as root (debootstrap and chroot need it)" >&2; exit 2; }
root="${1:-$(mktemp -d /tmp/ag-fresh.XXXX)}"
mirror="${AG_FRESH_MIRROR:-http://deb.debian.org/debian}"
steps="${AG_FRESH_STEPS:-demo test}"

if ! command -v debootstrap >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi
if [ ! -x "$root/bin/bash" ]; then
  echo "== debootstrap --variant=minbase bookworm $root"
  debootstrap --variant=minbase bookworm "$root" "$mirror" >"$root.debootstrap.log" 2>&1 || {
    tail -20 "$root.debootstrap.log"
    exit 1
  }
fi
rm -rf "$root/root/actorgraph"
git clone -q "$here" "$root/root/actorgraph"
echo "== cloned $(git -C "$root/root/actorgraph" log -1 --format='%h %s' | cut -c1-80)"
cp /etc/resolv.conf "$root/etc/resolv.conf"

# Mounted for apt and the builds; unmounted on every exit, before anything
# could remove the root (a recursive delete through a bind of /dev would reach
# the host's devices).
mounted=()
cleanup() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -R "${mounted[i]}" 2>/dev/null || umount -lR "${mounted[i]}"; done
}
trap cleanup EXIT
mount -t proc proc "$root/proc" && mounted+=("$root/proc")
mount --rbind /sys "$root/sys" && mounted+=("$root/sys")
mount --rbind /dev "$root/dev" && mounted+=("$root/dev")

status=0
for step in $steps; do
  echo "== bash scripts/dev.sh $step (in the fresh root; log: $root.$step.log)"
  start=$(date +%s)
  set +e
  env -i HOME=/root TERM=dumb PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    chroot "$root" /bin/bash -c "cd /root/actorgraph && bash scripts/dev.sh $step" </dev/null >"$root.$step.log" 2>&1
  rc=$?
  set -e
  seconds=$(($(date +%s) - start))
  tail -5 "$root.$step.log"
  echo "fresh_bookworm_${step}_seconds: $seconds"
  echo "fresh_bookworm_${step}_exit: $rc"
  ((rc == 0)) || status=1
done
exit "$status"
