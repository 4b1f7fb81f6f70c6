#!/usr/bin/env bash
# The shared libraries mooncake's engine.so (the PD KV transfer engine) needs and a bare host may lack:
# libibverbs.so.1 and the libnl-3 it links. Where the system has them (a GPU host with RDMA), nothing is
# done. Otherwise the Debian packages are downloaded and unpacked into build/syslibs/lib, without root
# and without touching the system; harvest puts that folder on the LD_LIBRARY_PATH of what it starts.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(libibverbs1 libnl-3-200 libnl-route-3-200)
out=build/syslibs
if /sbin/ldconfig -p 2>/dev/null | grep -q 'libibverbs\.so\.1 '; then
  exit 0
fi
if [ -e "$out/lib/libibverbs.so.1" ]; then
  exit 0
fi
if ! command -v apt-get >/dev/null || ! command -v dpkg-deb >/dev/null; then
  echo "setup: libibverbs.so.1 is missing and this is not a Debian-like host: install ${packages[*]}" \
       "(or rdma-core) with the system's package manager for the PD transfer engine" >&2
  exit 0
fi
rm -rf "$out" && mkdir -p "$out/debs" "$out/root" "$out/lib"
download() { (cd "$out/debs" && apt-get download -q "${packages[@]}" >/dev/null 2>&1); }
# A fresh host may have empty package lists: refresh them once (as root) and try again.
download || { [ "$(id -u)" = 0 ] && apt-get update -q >/dev/null 2>&1 && download; } || {
  echo "setup: could not download ${packages[*]} (apt-get download); the PD transfer engine will not load" >&2
  exit 0
}
for deb in "$out"/debs/*.deb; do
  dpkg-deb -x "$deb" "$out/root"
done
find "$out/root" -name '*.so*' \( -type f -o -type l \) -exec cp -P {} "$out/lib/" \;
