#!/usr/bin/env bash
# The aarch64 cross build (make arm-test): Debian's cross compiler and qemu,
# the arm64 libraries (tests/arm/sysroot.sh), xgrammar's core cross-built from
# the source tools/build_xgrammar.sh fetched, then pagellm and
# pagellm_kernel_tests into ARM_DIR/build.
set -euo pipefail
cd "$(dirname "$0")/../.."
ARM_DIR=${ARM_DIR:-build-arm}
JOBS=${JOBS:-$(nproc)}
mkdir -p "$ARM_DIR"
ARM_DIR=$(realpath "$ARM_DIR")
toolchain=$PWD/cmake/aarch64-linux-gnu.cmake

missing=()
for p in g++-aarch64-linux-gnu qemu-user-static; do
  dpkg-query -W -f='${Status}' "$p" 2> /dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "arm: installing ${missing[*]}"
  $SUDO apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" > /dev/null
fi
tests/arm/sysroot.sh "$ARM_DIR/sysroot"

# xgrammar: the same pinned source as the host build (tools/build_xgrammar.sh).
tools/build_xgrammar.sh
if [ ! -f "$ARM_DIR/xgrammar/.complete" ]; then
  echo "arm: cross-building xgrammar"
  rm -rf "$ARM_DIR/xgrammar-build" "$ARM_DIR/xgrammar"
  mkdir -p "$ARM_DIR/xgrammar-build"
  printf 'set(%s OFF)\n' XGRAMMAR_BUILD_PYTHON_BINDINGS XGRAMMAR_BUILD_CXX_TESTS XGRAMMAR_ENABLE_CPPTRACE \
    XGRAMMAR_ENABLE_COVERAGE XGRAMMAR_ENABLE_INTERNAL_CHECK > "$ARM_DIR/xgrammar-build/config.cmake"
  cmake -S .deps/src/xgrammar -B "$ARM_DIR/xgrammar-build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_TOOLCHAIN_FILE="$toolchain" -DCMAKE_CXX_FLAGS="-Wno-error -fno-lto" \
    -DCMAKE_INSTALL_PREFIX="$ARM_DIR/xgrammar" > "$ARM_DIR/xgrammar-build.log"
  cmake --build "$ARM_DIR/xgrammar-build" -j "$JOBS" >> "$ARM_DIR/xgrammar-build.log"
  cmake --install "$ARM_DIR/xgrammar-build" >> "$ARM_DIR/xgrammar-build.log"
  touch "$ARM_DIR/xgrammar/.complete"
fi

# No OpenCL plugin (no arm64 ICD here) and no ccache by default (CI starts cold).
cmake -S . -B "$ARM_DIR/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_TOOLCHAIN_FILE="$toolchain" \
  -DPAGELLM_ARM_SYSROOT="$ARM_DIR/sysroot" -DPAGELLM_XGRAMMAR_DIR="$ARM_DIR/xgrammar" -DPAGELLM_OPENCL=OFF \
  -DPAGELLM_CCACHE="${PAGELLM_ARM_CCACHE:-OFF}" > "$ARM_DIR/configure.log"
cmake --build "$ARM_DIR/build" -j "$JOBS" --target pagellm pagellm_kernel_tests
