#!/usr/bin/env bash
# kcat (librdkafka's command-line client) against a running Canopy broker.
#
#   BOOTSTRAP=127.0.0.1:9092 tests/compat/kcat.sh
#
# kcat has no admin API, so the topic is auto-created by the broker on first
# Metadata/Produce; run.sh starts the broker with --auto-create-topics true
# --num-partitions 3. Checks:
#   * produce 10,000 keyed lines (-K:) with headers (-H), acks=all, idempotence off;
#   * `kcat -L` lists the broker and the topic with 3 partitions;
#   * each partition read back from the beginning by explicit partition
#     (-C -o beginning -e -p N): offsets dense from 0, every key/value/header
#     exactly once, and the per-partition order equal to the produce order
#     (the keys carry a sequence number, so order within a partition must be
#     strictly increasing);
#   * the same records through a consumer group (kcat -G): read once, and a
#     second run of the group resumes from the offsets committed on close.
set -euo pipefail

: "${BOOTSTRAP:?BOOTSTRAP=host:port must be set}"
N=${N:-10000}
PARTS=3
TOPIC=${KCAT_TOPIC:-compat.kcat.t$$.$(date +%s)}
KCAT=${KCAT:-kcat}

command -v "$KCAT" >/dev/null || { echo "FAIL: kcat not installed" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

common=(-b "$BOOTSTRAP" -X socket.timeout.ms=20000)

# Make sure the topic exists (auto-created on the Metadata request for it) and
# wait until it shows all its partitions.
for i in $(seq 1 50); do
    if "$KCAT" "${common[@]}" -L -t "$TOPIC" -J -m 5 2>/dev/null >"$work/meta.json" &&
        python3 - "$work/meta.json" "$TOPIC" "$PARTS" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))
t = [t for t in m.get("topics", []) if t["topic"] == sys.argv[2] and not t.get("err")]
sys.exit(0 if t and len(t[0]["partitions"]) == int(sys.argv[3]) else 1)
EOF
    then break; fi
    [ "$i" = 50 ] && fail "topic $TOPIC did not appear with $PARTS partitions: $(cat "$work/meta.json" 2>/dev/null)"
    sleep 0.2
done

# 10,000 lines "k-00042:v-00042"; the key decides the partition (murmur2, as
# the Java client, so the spread is deterministic) and carries the sequence.
python3 -c "
import sys
for i in range($N): sys.stdout.write('k-%05d:v-%05d-payload\n' % (i, i))
" >"$work/in.txt"

"$KCAT" "${common[@]}" -P -t "$TOPIC" -K: -z none \
    -X enable.idempotence=false -X partitioner=murmur2_random -X acks=all -X linger.ms=5 \
    -H src=kcat -H run="$$" \
    -l "$work/in.txt" 2>"$work/produce.err" || fail "produce failed: $(cat "$work/produce.err")"

# Metadata: broker list and topic with 3 partitions.
"$KCAT" "${common[@]}" -L -J >"$work/meta.json" 2>"$work/meta.err" || fail "kcat -L failed: $(cat "$work/meta.err")"
python3 - "$work/meta.json" "$TOPIC" "$PARTS" "$BOOTSTRAP" <<'EOF' || fail "metadata check failed"
import json, sys
m = json.load(open(sys.argv[1]))
topic, parts, bootstrap = sys.argv[2], int(sys.argv[3]), sys.argv[4]
brokers = m.get("brokers", [])
assert brokers, f"no brokers in metadata: {m}"
host, port = bootstrap.rsplit(":", 1)
assert any(b["name"] == f"{host}:{port}" for b in brokers), f"bootstrap broker {bootstrap} not listed: {brokers}"
t = [t for t in m["topics"] if t["topic"] == topic]
assert len(t) == 1, f"topic {topic} not in metadata: {[x['topic'] for x in m['topics']]}"
t = t[0]
assert not t.get("err"), f"topic error: {t['err']}"
assert sorted(p["partition"] for p in t["partitions"]) == list(range(parts)), t["partitions"]
ids = {b["id"] for b in brokers}
for p in t["partitions"]:
    assert p["leader"] in ids, f"partition {p} leader not a listed broker"
print(f"kcat: metadata ok ({len(brokers)} broker(s), {topic} has {parts} partitions)")
EOF

# Read each partition back, from the beginning to the end (-e), by explicit
# partition. One JSON object per message (-J) gives offsets, keys and headers.
for p in $(seq 0 $((PARTS - 1))); do
    "$KCAT" "${common[@]}" -C -t "$TOPIC" -p "$p" -o beginning -e -J -q \
        >"$work/p$p.jsonl" 2>"$work/consume$p.err" || fail "consume p$p failed: $(cat "$work/consume$p.err")"
done

python3 - "$work" "$TOPIC" "$PARTS" "$N" <<'EOF' || fail "read-back check failed"
import json, sys, os
work, topic, parts, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
seen = {}
for p in range(parts):
    recs = [json.loads(l) for l in open(os.path.join(work, f"p{p}.jsonl")) if l.strip()]
    offs = [r["offset"] for r in recs]
    assert offs == list(range(len(recs))), f"p{p}: offsets not dense from 0: first {offs[:5]} ... ({len(offs)} records)"
    seqs = []
    for r in recs:
        assert r["topic"] == topic and r["partition"] == p, r
        k, v = r["key"], r["payload"]
        assert k.startswith("k-"), r
        i = int(k[2:])
        assert v == "v-%05d-payload" % i, f"p{p} off {r['offset']}: value {v!r} for key {k!r}"
        hdrs = r.get("headers") or []
        assert hdrs[:2] == ["src", "kcat"], f"p{p} off {r['offset']}: headers {hdrs!r}"
        assert k not in seen, f"duplicate key {k} (p{seen[k]} and p{p})"
        seen[k] = p
        seqs.append(i)
    assert seqs == sorted(seqs), f"p{p}: keys not in produce order"
    print(f"kcat: p{p}: {len(recs)} records, offsets 0..{len(recs) - 1}")
    assert recs, f"p{p}: empty (10,000 keys should spread over all partitions)"
missing = n - len(seen)
assert missing == 0 and set(seen) == {"k-%05d" % i for i in range(n)}, f"{missing} keys missing"
print(f"kcat: read back all {n} records")
EOF

# The same records through a consumer group (-G: JoinGroup/SyncGroup,
# committed offsets): one member reads everything once; a second run of the
# same group resumes from the offsets the first committed on close and
# finds nothing left.
GROUP="compat-kcat-$$"
"$KCAT" "${common[@]}" -G "$GROUP" -o beginning -e -J -q -X enable.auto.commit=true "$TOPIC" \
    >"$work/group.jsonl" 2>"$work/group.err" || fail "group consume failed: $(cat "$work/group.err")"
# (-o stored: kcat -G applies -o to every assigned partition, overriding commits.)
"$KCAT" "${common[@]}" -G "$GROUP" -o stored -e -J -q "$TOPIC" \
    >"$work/group2.jsonl" 2>"$work/group2.err" || fail "second group consume failed: $(cat "$work/group2.err")"
python3 - "$work" "$N" <<'EOF' || fail "group read-back check failed"
import json, sys, os
work, n = sys.argv[1], int(sys.argv[2])
recs = [json.loads(l) for l in open(os.path.join(work, "group.jsonl")) if l.strip()]
keys = [r["key"] for r in recs]
assert len(keys) == n and len(set(keys)) == n, f"group read {len(keys)} records, {len(set(keys))} distinct, want {n}"
again = [l for l in open(os.path.join(work, "group2.jsonl")) if l.strip()]
assert not again, f"second run of the group re-read {len(again)} records: offsets were not committed"
print(f"kcat: group read all {n} records once; the group resumed from its commits")
EOF

# The secured listeners (run.sh starts them): SASL_SSL with SCRAM-SHA-512
# and PLAIN, and SSL with a client certificate. Each: 200 lines produced,
# then read once through a group that commits; a wrong password fails.
if [ -n "${SASL_BOOTSTRAP:-}" ]; then
    for how in SCRAM-SHA-512 PLAIN ssl-cert; do
        if [ "$how" = ssl-cert ]; then
            sec=(-b "$SSL_BOOTSTRAP" -X security.protocol=SSL -X "ssl.ca.location=$CA_PEM"
                 -X "ssl.certificate.location=$CLIENT_CERT" -X "ssl.key.location=$CLIENT_KEY")
        else
            sec=(-b "$SASL_BOOTSTRAP" -X security.protocol=SASL_SSL -X "ssl.ca.location=$CA_PEM"
                 -X "sasl.mechanisms=$how" -X "sasl.username=$SASL_USER" -X "sasl.password=$SASL_PASSWORD")
        fi
        stopic="compat.kcat_secure_${how//-/_}.$$"
        seq -f 'secure-%04g' 0 199 | "$KCAT" "${sec[@]}" -P -t "$stopic" -X acks=all 2>"$work/sp.err" \
            || fail "$how: produce failed: $(cat "$work/sp.err")"
        "$KCAT" "${sec[@]}" -G "$stopic.g" -o beginning -e -q -X enable.auto.commit=true "$stopic" \
            >"$work/sc.txt" 2>"$work/sc.err" || fail "$how: group consume failed: $(cat "$work/sc.err")"
        [ "$(sort "$work/sc.txt")" = "$(seq -f 'secure-%04g' 0 199)" ] || fail "$how: read back $(wc -l <"$work/sc.txt") lines, not the 200 produced"
        echo "kcat: $how: 200 records produced and read back through a group"
    done
    if "$KCAT" -b "$SASL_BOOTSTRAP" -X security.protocol=SASL_SSL -X "ssl.ca.location=$CA_PEM" -X sasl.mechanisms=SCRAM-SHA-512 \
        -X "sasl.username=$SASL_USER" -X sasl.password=not-it -L -m 5 >"$work/wrong.out" 2>&1; then
        fail "a wrong password listed metadata"
    fi
    grep -q "invalid credentials" "$work/wrong.out" || fail "a wrong password: no authentication error in $(cat "$work/wrong.out")"
    echo "kcat: a wrong password is refused with the broker's reason"
else
    fail "SASL_BOOTSTRAP is not set (run via tests/compat/run.sh)"
fi

echo "kcat: PASS ($TOPIC)"
