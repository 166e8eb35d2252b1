# pagellm serving the default model (Gemma 3 270M Q4_K_M) on the CPU.
#   docker build -t pagellm .
#   docker run --rm -p 8000:8000 pagellm
# Stage 1 builds the binary and assembles the model exactly as `make build`
# does on a fresh Debian 12 machine; stage 2 carries only the binary, the
# model file and the shared libraries the binary links.
FROM debian:12 AS build
WORKDIR /src
COPY . .
RUN rm -rf build .venv .deps \
 && apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends make ca-certificates \
 && make build \
 && mkdir -p /out/models \
 && cp build/pagellm /out/ \
 && cp "$(cat build/default-model.txt)" /out/models/model.gguf

FROM debian:12-slim
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      libyaml-cpp0.7 libcpp-httplib0.11 zlib1g libpcre2-8-0 libspdlog1.10 libfmt9 libssl3 libbrotli1 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 pagellm
COPY --from=build /out/pagellm /usr/local/bin/pagellm
COPY --from=build /out/models/model.gguf /models/model.gguf
USER 10001
EXPOSE 8000
# Flags after the image name on `docker run` (or `args:` in Kubernetes) are
# appended: --kv-cache-memory, --max-num-seqs, --metrics-prefix, ...
ENTRYPOINT ["pagellm", "serve", "--model", "/models/model.gguf", "--host", "0.0.0.0", "--port", "8000"]
