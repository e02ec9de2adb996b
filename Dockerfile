# encore-processor: build on the official Swift image, run on slim Debian as a non-root user.
FROM swift:6.1-bookworm AS build
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends librdkafka-dev libssl-dev zlib1g-dev librocksdb-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Package.swift ./
COPY Sources ./Sources
COPY Tests ./Tests
RUN swift build -c release --product encore-processor --static-swift-stdlib \
    && install -m 0755 "$(swift build -c release --show-bin-path)/encore-processor" /usr/local/bin/encore-processor

FROM debian:bookworm-slim
# librdkafka1 is the Kafka client; libcurl4 backs the http controller; curl runs the health check;
# jemalloc replaces glibc's malloc (about 20% less CPU per request in `encore-processor bench`);
# zlib1g compresses `loadtest --hdr` histograms; librocksdb7.8 is the local state store, in /state
# (`run --state-dir /state`, a volume); /reports holds `loadtest` reports (a volume in compose).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends librdkafka1 libcurl4 curl ca-certificates libjemalloc2 zlib1g \
        librocksdb7.8 \
    && rm -rf /var/lib/apt/lists/* \
    && ln -s "/usr/lib/$(uname -m)-linux-gnu/libjemalloc.so.2" /usr/local/lib/libjemalloc.so.2 \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin encore \
    && install -d -o 10001 -g 10001 /reports /state
ENV LD_PRELOAD=/usr/local/lib/libjemalloc.so.2
COPY --from=build /usr/local/bin/encore-processor /usr/local/bin/encore-processor
USER 10001
# `run --http-listen :9464` serves /metrics, /healthz and /readyz there.
EXPOSE 9464
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
    CMD ["curl", "-fsS", "http://127.0.0.1:9464/healthz"]
ENTRYPOINT ["/usr/local/bin/encore-processor"]
CMD ["run", "--help"]
