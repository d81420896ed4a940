#!/usr/bin/env bash
# Client compatibility suite: real Kafka clients against a real Canopy broker.
#
#   tests/compat/run.sh path/to/canopy
#
# Starts the broker on free loopback ports with a fresh data directory, waits
# for GET /ready on the admin listener, then runs each client test with
# BOOTSTRAP=127.0.0.1:PORT:
#
#   kafka-python     tests/compat/python/test_kafka_python.py   (pytest)
#   confluent-kafka  tests/compat/python/test_confluent_kafka.py (pytest)
#   kafkajs          tests/compat/node/compat.test.js            (node --test)
#   kcat             tests/compat/kcat.sh
#   java             tests/compat/java/Compat.java (the Java AdminClient and
#                    producer, kafka-clients 4.1.0; jars by java/fetch.py)
#
# The broker also serves SASL_SSL (SCRAM-SHA-512/256, PLAIN; users made with
# `canopy user` first) and SSL with required client certificates (from
# openssl); each client test also runs over those (SASL_BOOTSTRAP,
# SSL_BOOTSTRAP, CA_PEM, CLIENT_CERT, CLIENT_KEY, SASL_USER, ... in the
# environment). The authorizer is on, open where no ACL names a resource
# (allow_everyone_if_no_acl_found), so every test also runs through it and
# the ACL tests name resources of their own. Segments roll at 2 MiB and
# retention runs every second, so a retention change shows within a test. Then the broker is stopped with SIGTERM and must exit 0. A client that
# is not installed is a failure, never a skip. Prints `N passed, N failed` as
# its last line and exits non-zero if anything failed.
#
# Environment:
#   COMPAT_ONLY="kcat kafkajs"  run only these (names as above)
#   COMPAT_TIMEOUT=300          seconds allowed per client test
#   COMPAT_KEEP=1               keep the temp dir (data + broker.log)
#   RUST_LOG                    broker log filter (default info)
#   PYTHON, NODE, KCAT, JAVA    interpreters/tools to use (JAVAC beside JAVA)
# Installing the clients: pip install -r tests/compat/python/requirements.txt,
# (cd tests/compat/node && npm ci), apt-get install kcat. .ci/run does this.
set -uo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PYTHON=${PYTHON:-python3}
NODE=${NODE:-node}
KCAT=${KCAT:-kcat}
export KCAT
JAVA=${JAVA:-java}
JAVAC=${JAVAC:-javac}
TIMEOUT=${COMPAT_TIMEOUT:-300}
ALL_TESTS="kafka-python confluent-kafka kafkajs kcat rest java"
TESTS=${COMPAT_ONLY:-$ALL_TESTS}

if [ $# -ne 1 ]; then
    echo "usage: $0 BROKER_BINARY" >&2
    exit 2
fi
broker=$1
case $broker in /*) ;; *) broker=$PWD/$broker ;; esac
if [ ! -x "$broker" ]; then
    echo "compat: broker binary $broker not found or not executable" >&2
    echo "0 passed, 1 failed"
    exit 1
fi
if ! command -v "$PYTHON" >/dev/null; then
    echo "compat: $PYTHON not found (needed to pick ports and for the Python clients)" >&2
    echo "0 passed, 1 failed"
    exit 1
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/canopy-compat.XXXXXX")
broker_pid=
cleanup() {
    if [ -n "$broker_pid" ] && kill -0 "$broker_pid" 2>/dev/null; then
        kill -TERM "$broker_pid" 2>/dev/null
        for _ in $(seq 1 50); do kill -0 "$broker_pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$broker_pid" 2>/dev/null
    fi
    if [ "${COMPAT_KEEP:-0}" = 1 ]; then
        echo "compat: kept $work" >&2
    else
        rm -rf "$work"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Five free loopback ports: bind port 0, read the port, close. All are
# held open together so they differ.
read -r kport aport rport sport tport < <("$PYTHON" -c '
import socket
s = [socket.socket() for _ in range(5)]
for x in s: x.bind(("127.0.0.1", 0))
print(*(x.getsockname()[1] for x in s))
for x in s: x.close()
')
BOOTSTRAP=127.0.0.1:$kport
ADMIN=127.0.0.1:$aport
REST=http://127.0.0.1:$rport
export BOOTSTRAP REST
# Tests that need a broker of their own (advertising something else) start
# this binary.
CANOPY_BIN=$broker
export CANOPY_BIN

# Security: the broker also listens with SASL_SSL (SCRAM and PLAIN) and
# with SSL requiring client certificates. A CA, a server certificate for
# 127.0.0.1 and a client certificate (CN=writer,O=canopy) from openssl;
# users made with `canopy user` before the broker starts.
if ! command -v openssl >/dev/null; then
    echo "compat: openssl not found (needed for the TLS certificates)" >&2
    echo "0 passed, 1 failed"
    exit 1
fi
pki=$work/pki
mkdir -p "$pki"
(
    cd "$pki"
    openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=canopy compat CA" -keyout ca.key -out ca.pem
    openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" -keyout server.key -out server.csr
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' >server.ext
    openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile server.ext -out server.pem
    openssl req -newkey rsa:2048 -nodes -subj "/O=canopy/CN=writer" -keyout client.key -out client.csr
    printf 'extendedKeyUsage=clientAuth\n' >client.ext
    openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile client.ext -out client.pem
    # An identity provider's signing key and its JWKS, for OAUTHBEARER:
    # the clients sign their own RS256 tokens with it.
    openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out idp.key
    openssl rsa -in idp.key -noout -modulus | "$PYTHON" -c '
import base64, json, sys
n = bytes.fromhex(sys.stdin.read().strip().split("=", 1)[1])
b64 = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()
json.dump({"keys": [{"kty": "RSA", "kid": "compat-idp", "alg": "RS256", "use": "sig", "n": b64(n), "e": "AQAB"}]}, open("jwks.json", "w"))'
) >"$work/pki.log" 2>&1 || { echo "compat: making certificates failed:" >&2; cat "$work/pki.log" >&2; echo "0 passed, 1 failed"; exit 1; }
SASL_BOOTSTRAP=127.0.0.1:$sport
SSL_BOOTSTRAP=127.0.0.1:$tport
CA_PEM=$pki/ca.pem
CLIENT_CERT=$pki/client.pem
CLIENT_KEY=$pki/client.key
SASL_USER=alice
SASL_PASSWORD=alice-secret
ADMIN_USER=admin
ADMIN_PASSWORD=admin-secret
OTHER_USER=bob
OTHER_PASSWORD=bob-secret
IDP_KEY=$pki/idp.key
IDP_KID=compat-idp
IDP_AUDIENCE=canopy-compat
export SASL_BOOTSTRAP SSL_BOOTSTRAP CA_PEM CLIENT_CERT CLIENT_KEY SASL_USER SASL_PASSWORD ADMIN_USER ADMIN_PASSWORD OTHER_USER OTHER_PASSWORD
export IDP_KEY IDP_KID IDP_AUDIENCE
for u in "$SASL_USER:$SASL_PASSWORD" "$ADMIN_USER:$ADMIN_PASSWORD" "$OTHER_USER:$OTHER_PASSWORD"; do
    printf '%s\n' "${u#*:}" | "$broker" user --data-dir "$work/data" --name "${u%%:*}" --password-file - \
        || { echo "compat: canopy user failed" >&2; echo "0 passed, 1 failed"; exit 1; }
done

echo "compat: starting $broker (kafka $BOOTSTRAP, SASL_SSL $SASL_BOOTSTRAP, SSL $SSL_BOOTSTRAP, admin $ADMIN, data $work/data)"
RUST_LOG=${RUST_LOG:-info} "$broker" serve \
    --data-dir "$work/data" \
    --kafka-listener "$BOOTSTRAP" \
    --listeners "PLAINTEXT://$BOOTSTRAP,SASL_SSL://$SASL_BOOTSTRAP,SSL://$SSL_BOOTSTRAP" \
    --ssl-cert-file "$pki/server.pem" --ssl-key-file "$pki/server.key" --ssl-ca-file "$CA_PEM" \
    --listener-ssl-client-auth SSL:required \
    --sasl-enabled-mechanisms SCRAM-SHA-512,SCRAM-SHA-256,PLAIN,OAUTHBEARER \
    --sasl-oauthbearer-jwks-file "$pki/jwks.json" --sasl-oauthbearer-expected-audience "$IDP_AUDIENCE" \
    --super-users "User:$ADMIN_USER" \
    --authorizer-enabled true --allow-everyone-if-no-acl-found true \
    --admin-listener "$ADMIN" \
    --group-consumer-heartbeat-interval-ms 500 \
    --rest-listener "127.0.0.1:$rport" \
    --auto-create-topics true \
    --num-partitions 3 \
    --segment-bytes 2097152 --retention-check-interval-ms 1000 \
    --compaction-lag-ms 2000 --compaction-interval-ms 1000 \
    >"$work/broker.log" 2>&1 &
broker_pid=$!

broker_log_tail() {
    echo "---- last 40 lines of broker.log ----" >&2
    tail -n 40 "$work/broker.log" >&2
    echo "-------------------------------------" >&2
}

ready=0
for _ in $(seq 1 300); do
    if ! kill -0 "$broker_pid" 2>/dev/null; then
        wait "$broker_pid"; rc=$?
        echo "compat: broker exited with $rc before it was ready" >&2
        broker_log_tail
        broker_pid=
        echo "0 passed, 1 failed"
        exit 1
    fi
    if "$PYTHON" -c '
import sys, urllib.request
try:
    sys.exit(0 if urllib.request.urlopen("http://" + sys.argv[1] + "/ready", timeout=1).status == 200 else 1)
except Exception:
    sys.exit(1)
' "$ADMIN"; then ready=1; break; fi
    sleep 0.1
done
if [ $ready != 1 ]; then
    echo "compat: broker not ready after 30 s" >&2
    broker_log_tail
    echo "0 passed, 1 failed"
    exit 1
fi
echo "compat: broker ready (pid $broker_pid)"

passed=0
failed=0
failures=()
pass() { passed=$((passed + 1)); echo "compat: PASS $1"; }
fail() { failed=$((failed + 1)); failures+=("$1"); echo "compat: FAIL $1${2:+: $2}"; }

have_py_module() { "$PYTHON" -c "import $1" 2>/dev/null; }

run_pytest() { # name module file
    local name=$1 module=$2 file=$3
    if ! have_py_module "$module"; then
        fail "$name" "Python module '$module' not installed (pip install -r tests/compat/python/requirements.txt)"
        return
    fi
    if ! have_py_module pytest; then
        fail "$name" "pytest not installed (pip install -r tests/compat/python/requirements.txt)"
        return
    fi
    local rc=0
    (cd "$here/python" && PYTHONDONTWRITEBYTECODE=1 timeout "$TIMEOUT" \
        "$PYTHON" -m pytest -p no:cacheprovider -q "$file") || rc=$?
    # pytest: 0 all passed; 5 no tests collected (a failure here); others fail.
    case $rc in
        0) pass "$name" ;;
        5) fail "$name" "pytest collected no tests" ;;
        124) fail "$name" "timed out after ${TIMEOUT}s" ;;
        *) fail "$name" "pytest exit $rc" ;;
    esac
}

run_kafkajs() {
    if ! command -v "$NODE" >/dev/null; then
        fail kafkajs "node not installed"; return
    fi
    if [ ! -f "$here/node/node_modules/kafkajs/package.json" ]; then
        fail kafkajs "kafkajs not installed (cd tests/compat/node && npm ci)"; return
    fi
    local rc=0 out="$work/kafkajs.out"
    (cd "$here/node" && timeout "$TIMEOUT" "$NODE" --test --test-reporter=spec compat.test.js) 2>&1 | tee "$out"
    rc=${PIPESTATUS[0]}
    # Require that tests actually ran: the spec reporter ends with "ℹ pass N".
    local npass
    npass=$(sed -n 's/^ℹ pass \([0-9][0-9]*\)$/\1/p' "$out" | tail -n 1)
    if [ "$rc" = 124 ]; then
        fail kafkajs "timed out after ${TIMEOUT}s"
    elif [ "$rc" != 0 ]; then
        fail kafkajs "node --test exit $rc"
    elif [ -z "$npass" ] || [ "$npass" = 0 ]; then
        fail kafkajs "node --test ran no test"
    else
        pass kafkajs
    fi
}

run_kcat() {
    if ! command -v "$KCAT" >/dev/null; then
        fail kcat "kcat not installed (apt-get install kcat)"; return
    fi
    local rc=0
    timeout "$TIMEOUT" bash "$here/kcat.sh" || rc=$?
    case $rc in
        0) pass kcat ;;
        124) fail kcat "timed out after ${TIMEOUT}s" ;;
        *) fail kcat "exit $rc" ;;
    esac
}

run_java() {
    if ! command -v "$JAVAC" >/dev/null || ! command -v "$JAVA" >/dev/null; then
        fail java "a JDK (java, javac) is not installed (apt-get install default-jdk-headless)"; return
    fi
    local cp rc=0 out="$work/java.out"
    if ! cp=$("$PYTHON" "$here/java/fetch.py"); then
        fail java "could not fetch the kafka-clients jars"; return
    fi
    mkdir -p "$work/java"
    if ! "$JAVAC" -cp "$cp" -d "$work/java" "$here/java/Compat.java"; then
        fail java "javac failed"; return
    fi
    timeout "$TIMEOUT" "$JAVA" -cp "$cp:$work/java" Compat 2>&1 | tee "$out"
    rc=${PIPESTATUS[0]}
    if [ "$rc" = 124 ]; then
        fail java "timed out after ${TIMEOUT}s"
    elif [ "$rc" != 0 ]; then
        fail java "exit $rc"
    elif ! grep -q '^ok ' "$out"; then
        fail java "ran no check"
    else
        pass java
    fi
}

for t in $TESTS; do
    echo
    echo "==== $t ===="
    case $t in
        kafka-python) run_pytest kafka-python kafka test_kafka_python.py ;;
        confluent-kafka) run_pytest confluent-kafka confluent_kafka test_confluent_kafka.py ;;
        kafkajs) run_kafkajs ;;
        kcat) run_kcat ;;
        rest) if command -v curl >/dev/null; then run_pytest rest requests test_rest.py; else fail rest "curl not installed"; fi ;;
        java) run_java ;;
        *) fail "$t" "unknown test (known: $ALL_TESTS)" ;;
    esac
    if ! kill -0 "$broker_pid" 2>/dev/null; then
        fail "broker-alive" "broker died during the $t test"
        break
    fi
done

echo
echo "==== broker shutdown ===="
if kill -0 "$broker_pid" 2>/dev/null; then
    kill -TERM "$broker_pid"
    stopped=0
    for _ in $(seq 1 300); do
        kill -0 "$broker_pid" 2>/dev/null || { stopped=1; break; }
        sleep 0.1
    done
    if [ $stopped = 1 ]; then
        wait "$broker_pid"; rc=$?
        broker_pid=
        if [ "$rc" = 0 ]; then pass "broker-sigterm-exit-0"; else fail "broker-sigterm-exit-0" "broker exited $rc"; fi
    else
        fail "broker-sigterm-exit-0" "broker still running 30 s after SIGTERM"
    fi
else
    wait "$broker_pid" 2>/dev/null; rc=$?
    broker_pid=
    fail "broker-sigterm-exit-0" "broker was not running at the end (exit $rc)"
fi

if [ "$failed" != 0 ]; then
    broker_log_tail
    echo
    echo "compat: failed: ${failures[*]}"
fi
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
