# encore-processor: build on the official Swift image, run on slim Debian as a non-root user.
FROM swift:6.1-bookworm AS build
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends librdkafka-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Package.swift ./
COPY Sources ./Sources
COPY Tests ./Tests
RUN swift build -c release --product encore-processor --static-swift-stdlib \
    && install -m 0755 "$(swift build -c release --show-bin-path)/encore-processor" /usr/local/bin/encore-processor

FROM debian:bookworm-slim
# librdkafka1 is the Kafka client; libcurl4 backs the http controller.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends librdkafka1 libcurl4 ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin encore
COPY --from=build /usr/local/bin/encore-processor /usr/local/bin/encore-processor
USER 10001
ENTRYPOINT ["/usr/local/bin/encore-processor"]
CMD ["run", "--help"]
