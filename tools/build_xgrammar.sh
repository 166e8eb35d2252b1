#!/usr/bin/env bash
# Builds xgrammar's C++ core from its pinned source package on PyPI into
# .deps/xgrammar (a static library and headers), once. Called by tools/setup.sh,
# and by CMake when the library is missing (pip install . on a set-up machine).
set -euo pipefail
cd "$(dirname "$0")/.."

# No Python at run time; LTO off so that clang (the fuzz build) links it too.
XGRAMMAR_VERSION=0.2.9
XGRAMMAR_SHA256=87b466bca2475e29bb0323abc62c6c33cbcbcff47e5fb800a3e2099ac9620b90
XGRAMMAR_URL=https://files.pythonhosted.org/packages/3a/2f/5bf8e8fa6619cff534932f79b0abc81a417d354bc5093252c1a6081d0a93/xgrammar-$XGRAMMAR_VERSION.tar.gz
XGRAMMAR_PREFIX=.deps/xgrammar
if [ "$(cat "$XGRAMMAR_PREFIX/.version" 2>/dev/null)" != "$XGRAMMAR_VERSION" ]; then
  echo "setup: building xgrammar $XGRAMMAR_VERSION (C++ core) into $XGRAMMAR_PREFIX"
  rm -rf .deps/src/xgrammar .deps/build/xgrammar "$XGRAMMAR_PREFIX"
  mkdir -p .deps/src/xgrammar .deps/build/xgrammar
  tarball=.deps/src/xgrammar-$XGRAMMAR_VERSION.tar.gz
  curl -fsSL --retry 3 -o "$tarball" "$XGRAMMAR_URL"
  echo "$XGRAMMAR_SHA256  $tarball" | sha256sum -c --quiet -
  tar -xzf "$tarball" -C .deps/src/xgrammar --strip-components=1
  # The package's own cmake/config.cmake turns the Python bindings on; a
  # config.cmake in the build folder takes precedence.
  printf 'set(%s OFF)\n' XGRAMMAR_BUILD_PYTHON_BINDINGS XGRAMMAR_BUILD_CXX_TESTS XGRAMMAR_ENABLE_CPPTRACE \
    XGRAMMAR_ENABLE_COVERAGE XGRAMMAR_ENABLE_INTERNAL_CHECK > .deps/build/xgrammar/config.cmake
  cmake -S .deps/src/xgrammar -B .deps/build/xgrammar -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CXX_FLAGS="-Wno-error -fno-lto" -DCMAKE_INSTALL_PREFIX="$PWD/$XGRAMMAR_PREFIX" > .deps/build/xgrammar.log
  cmake --build .deps/build/xgrammar -j "$(nproc)" >> .deps/build/xgrammar.log
  cmake --install .deps/build/xgrammar >> .deps/build/xgrammar.log
  echo "$XGRAMMAR_VERSION" > "$XGRAMMAR_PREFIX/.version"
fi

