# Canopy: a two-stage build. The runtime image holds the binary only,
# runs as an unprivileged user, keeps its data in a volume, and reports
# healthy once /ready answers 200 (storage recovered, listeners serving).
FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src src
# Declared bench targets must exist for cargo to read the manifest.
COPY benches benches
# FEATURES=cluster builds cluster mode (docker compose --profile cluster),
# whose etcd client needs protoc.
ARG FEATURES=""
RUN if [ -n "$FEATURES" ]; then apt-get update -qq && apt-get install -y -qq --no-install-recommends protobuf-compiler; fi \
    && cargo build --release --locked --bin canopy --features "$FEATURES" \
    && strip target/release/canopy

FROM debian:bookworm-slim
RUN useradd --system --uid 10001 --home-dir /var/lib/canopy --shell /usr/sbin/nologin canopy \
    && mkdir -p /var/lib/canopy \
    && chown canopy:canopy /var/lib/canopy
COPY --from=build /src/target/release/canopy /usr/local/bin/canopy
USER canopy
VOLUME /var/lib/canopy
ENV CANOPY_DATA_DIR=/var/lib/canopy \
    CANOPY_KAFKA_LISTENER=0.0.0.0:9092 \
    CANOPY_REST_LISTENER=0.0.0.0:8082 \
    CANOPY_ADMIN_LISTENER=0.0.0.0:9644 \
    CANOPY_LOG_FORMAT=json
EXPOSE 9092 8082 9644
# No curl in the slim image: bash's /dev/tcp asks /ready.
HEALTHCHECK --interval=5s --timeout=3s --start-period=30s --retries=3 \
    CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/9644 && printf 'GET /ready HTTP/1.0\\r\\n\\r\\n' >&3 && head -n1 <&3 | grep -q ' 200 '"]
ENTRYPOINT ["canopy"]
CMD ["serve"]
