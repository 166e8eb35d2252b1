#!/usr/bin/env bash
# The Debian packages that hold the shared libraries a binary links (ldd), one
# per line: what a runtime image must install for the binary to start.
# dpkg records a library under one spelling of its path: the link or its
# target, with or without /usr (Debian 12 merged /lib into /usr/lib).
set -euo pipefail
bin=${1:?usage: tools/runtime_packages.sh BINARY}
for lib in $(ldd "$bin" | awk '$3 ~ /^\// { print $3 }'); do
  real=$(readlink -f "$lib")
  pkg=
  for path in "$lib" "$real" "${lib#/usr}" "${real#/usr}" "/usr$lib" "/usr$real"; do
    pkg=$(dpkg -S "$path" 2>/dev/null | head -1 | cut -d: -f1) && [[ -n $pkg ]] && break
  done
  [[ -n $pkg ]] || { echo "runtime_packages: no Debian package holds $lib" >&2; exit 1; }
  echo "$pkg"
done | sort -u
