#!/usr/bin/env bash
# Observability check against a release binary, with a real Prometheus:
#   tests/observability/run.sh target/release/canopy
# Starts Canopy and a Prometheus scraping it every second, drives Kafka
# (produce, group consume, commit, an out-of-range fetch) and REST traffic
# (accepted and refused), then evaluates every PromQL query of
# grafana/dashboards/canopy.json through Prometheus's HTTP API and fails
# if any returns no series. Also runs `promtool check metrics` on a scrape.
#
# Needs: prometheus and promtool on PATH, PYTHON with kafka-python.
set -euo pipefail
bin=$(realpath "$1")
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
py=${PYTHON:-python3}
work=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

free_port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
kafka=$(free_port); admin=$(free_port); rest=$(free_port); prom=$(free_port)

"$bin" serve --data-dir "$work/data" --kafka-listener 127.0.0.1:$kafka --admin-listener 127.0.0.1:$admin \
    --rest-listener 127.0.0.1:$rest --rest-max-body-bytes 1024 --log-format json >"$work/canopy.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do curl -fs "http://127.0.0.1:$admin/ready" >/dev/null && break; sleep 0.1; done
curl -fs "http://127.0.0.1:$admin/ready" >/dev/null || { cat "$work/canopy.log"; echo "canopy did not become ready" >&2; exit 1; }

cat >"$work/prometheus.yml" <<CFG
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: canopy
    static_configs:
      - targets: ["127.0.0.1:$admin"]
CFG
promtool check config "$work/prometheus.yml" >/dev/null
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
    --web.listen-address=127.0.0.1:$prom >"$work/prometheus.log" 2>&1 &
pids+=($!)

KAFKA=127.0.0.1:$kafka REST=http://127.0.0.1:$rest "$py" "$root/tests/observability/traffic.py"

curl -fs "http://127.0.0.1:$admin/metrics" >"$work/scrape.txt"
echo "scrape: $(wc -c <"$work/scrape.txt") bytes, $(grep -vc '^#' "$work/scrape.txt") samples"
promtool check metrics <"$work/scrape.txt"

PROM=http://127.0.0.1:$prom "$py" "$root/tests/observability/check_dashboard.py" "$root/grafana/dashboards/canopy.json"
