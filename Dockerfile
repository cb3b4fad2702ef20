# kafka-delay image: `docker build -t kafka-delay .` (compose.yaml builds it).
FROM rust:1-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends \
      libclang-dev clang cmake pkg-config libssl-dev zlib1g-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
# The build flags (RocksDB with the CPU's CRC instructions on x86-64).
COPY .cargo ./.cargo
COPY crates ./crates
COPY schemas ./schemas
# The broker's manifest names its test suites, which live at the top of the repository.
COPY tests ./tests
RUN cargo build --release --locked -p kafka-delay --bin kafka-delay

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates libssl3 zlib1g \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --home /var/lib/kafka-delay kafka-delay \
    && mkdir -p /var/lib/kafka-delay && chown kafka-delay /var/lib/kafka-delay
COPY --from=build /src/target/release/kafka-delay /usr/local/bin/kafka-delay
USER kafka-delay
ENV KAFKA_DELAY_DATA_DIR=/var/lib/kafka-delay KAFKA_DELAY_HTTP_ADDR=0.0.0.0:9464
EXPOSE 9464
VOLUME /var/lib/kafka-delay
HEALTHCHECK --interval=10s --timeout=3s CMD ["/bin/bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/9464"]
ENTRYPOINT ["kafka-delay"]
CMD ["run"]
