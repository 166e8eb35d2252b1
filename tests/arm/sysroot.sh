#!/usr/bin/env bash
# Unpacks the arm64 Debian packages that the aarch64 cross build links
# against, and the C/C++ runtime that qemu-aarch64-static -L runs it with,
# into DIR (default build-arm/sysroot). Nothing is installed on the host:
# some of these -dev packages (yaml-cpp) cannot sit beside their amd64 twins.
set -euo pipefail
dest=$(realpath -m "${1:-build-arm/sysroot}")
[ -f "$dest/.complete" ] && exit 0
PACKAGES=(
  libc6 libstdc++6 libgcc-s1
  libfmt-dev libfmt9 libspdlog-dev libspdlog1.10 libpcre2-dev libpcre2-8-0 zlib1g-dev zlib1g
  libyaml-cpp-dev libyaml-cpp0.7 libcpp-httplib-dev libcpp-httplib0.11 libssl-dev libssl3 libbrotli-dev libbrotli1
  libgtest-dev libgmock-dev
)
ALL_PACKAGES=(nlohmann-json3-dev libcli11-dev)  # headers only, architecture "all"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  echo "arm: adding the arm64 architecture to apt (for its package lists only)"
  $SUDO dpkg --add-architecture arm64
fi
if ! apt-cache show libfmt9:arm64 > /dev/null 2>&1; then $SUDO apt-get update -qq; fi
rm -rf "$dest" "$dest.debs"
mkdir -p "$dest.debs"
(cd "$dest.debs" && apt-get download -qq -o APT::Sandbox::User="$(id -un)" "${PACKAGES[@]/%/:arm64}" "${ALL_PACKAGES[@]}")
for deb in "$dest.debs"/*.deb; do dpkg-deb -x "$deb" "$dest"; done
rm -rf "$dest.debs"
touch "$dest/.complete"
