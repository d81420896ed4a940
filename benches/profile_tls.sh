#!/usr/bin/env bash
# Where TLS's produce cost goes: profiles the release broker with perf while
# librdkafka's rdkafka_performance produces RECORDS records of 100 bytes
# (acks=1) through PLAINTEXT, then through SASL_SSL with SCRAM-SHA-512, and
# prints each profile's heaviest symbols with their sample counts (perf
# samples at 999 Hz: samples / 999 / GB is CPU s/GB).
#
#   cargo build --release && cargo bench --bench security -- --only quotas --runs 1 --records 1000
#   benches/profile_tls.sh [RECORDS]     # needs perf and openssl
#
# (the bench run builds target/rdkafka_performance-ssl). Ports 29092/29094
# and an admin and REST port must be free; the broker and its data live in
# a temporary directory, removed at the end.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
records=${1:-10000000}
bin=$root/target/release/canopy
perf_tool=$root/target/rdkafka_performance-ssl
for t in "$bin" "$perf_tool"; do [ -x "$t" ] || { echo "missing $t (see the header)" >&2; exit 1; }; done
work=$(mktemp -d)
pid=
trap 'if [ -n "$pid" ]; then kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; fi; rm -rf "$work"' EXIT
cd "$work"
openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj "/CN=127.0.0.1" -addext "subjectAltName=IP:127.0.0.1" -keyout key.pem -out cert.pem >/dev/null 2>&1
printf 'pw\n' | "$bin" user --data-dir data --name bench --password-file - --iterations 4096 >/dev/null
"$bin" serve --data-dir data --kafka-listener 127.0.0.1:29092 --listeners "PLAINTEXT://127.0.0.1:29092,SASL_SSL://127.0.0.1:29094" \
    --ssl-cert-file cert.pem --ssl-key-file key.pem --flush always --admin-listener 127.0.0.1:29644 --rest-listener 127.0.0.1:29082 >broker.log 2>&1 &
pid=$!
sleep 2
for arm in plain tls; do
    if [ $arm = plain ]; then
        extra=(-b 127.0.0.1:29092)
    else
        extra=(-b 127.0.0.1:29094 -X security.protocol=SASL_SSL -X sasl.mechanisms=SCRAM-SHA-512 -X sasl.username=bench -X sasl.password=pw -X ssl.ca.location=cert.pem)
    fi
    "$perf_tool" -P -t "warm-$arm" -p 0 -s 100 -c 500000 -X acks=1 -X linger.ms=5 -q "${extra[@]}" >/dev/null 2>&1
    perf record -F 999 -g -p "$pid" -o "perf-$arm.data" >/dev/null 2>&1 &
    rec=$!
    "$perf_tool" -P -t "t-$arm" -p 0 -s 100 -c "$records" -X acks=1 -X linger.ms=5 -q "${extra[@]}" >/dev/null 2>&1
    kill -INT "$rec"; wait "$rec" || true
done
# The reports read only the heads of perf's output.
set +o pipefail
for arm in plain tls; do
    echo "==== $arm: $records records of 100 bytes"
    perf report -i "perf-$arm.data" --no-children --sort dso --stdio --show-nr-samples 2>/dev/null | grep -E "^ +[0-9]|Samples" | head -5
    perf report -i "perf-$arm.data" --no-children --sort symbol --stdio --show-nr-samples 2>/dev/null | grep -E "^ +[0-9]" | head -25 | awk '{print $1, $2, $4}'
done
