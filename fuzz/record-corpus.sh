#!/usr/bin/env bash
# Records fuzz seeds from real client traffic: starts a release broker that
# advertises a recording proxy (fuzz/record.py), runs the compatibility
# clients (kafka-python, confluent-kafka, kafkajs, kcat) through it, and
# keeps each distinct request frame in fuzz/corpus/request.
#
#   fuzz/record-corpus.sh target/release/canopy
#
# Needs what tests/compat needs (.ci/run installs it): PYTHON pointing at a
# Python with kafka-python, confluent-kafka and pytest; node with kafkajs
# in tests/compat/node; kcat.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$here/..
broker=$1
PYTHON=${PYTHON:-python3}
work=$(mktemp -d)
port() { "$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
kport=$(port); pport=$(port); aport=$(port); rport=$(port)
"$broker" serve --data-dir "$work/data" --kafka-listener "127.0.0.1:$kport" --advertised-listener "127.0.0.1:$pport" \
    --admin-listener "127.0.0.1:$aport" --rest-listener "127.0.0.1:$rport" --group-initial-rebalance-delay-ms 0 >"$work/broker.log" 2>&1 &
bpid=$!
"$PYTHON" "$here/record.py" "$pport" "127.0.0.1:$kport" "$work/frames" &
ppid=$!
trap 'kill $bpid $ppid 2>/dev/null || true' EXIT
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$aport/ready" >/dev/null && break; sleep 0.2; done
export BOOTSTRAP=127.0.0.1:$pport REST=http://127.0.0.1:$rport
(cd "$root/tests/compat/python" && timeout 300 "$PYTHON" -m pytest -p no:cacheprovider -q test_kafka_python.py test_confluent_kafka.py) || echo "record: some Python client tests failed (seeds are kept anyway)"
(cd "$root/tests/compat/node" && timeout 300 node --test compat.test.js >/dev/null 2>&1) || echo "record: some kafkajs tests failed (seeds are kept anyway)"
KCAT=${KCAT:-kcat} timeout 120 bash "$root/tests/compat/kcat.sh" >/dev/null 2>&1 || echo "record: kcat tests failed (seeds are kept anyway)"
mkdir -p "$here/corpus/request"
# Keep seeds small: frames over 64 KiB are left out (the fuzzer grows its own).
find "$work/frames" -type f -size -64k -exec cp {} "$here/corpus/request/" \;
echo "record: $(ls "$here/corpus/request" | wc -l) request seeds in fuzz/corpus/request"
rm -rf "$work"
