"""Shared helpers for the Python client compatibility tests.

The broker is started by tests/compat/run.sh, which passes its Kafka address
in BOOTSTRAP=host:port. Without it the tests fail (never skip): a compat run
that silently tested nothing would look green.
"""
import os
import threading
import time
import uuid

import pytest

N_RECORDS = 10_000
N_PARTITIONS = 3


@pytest.fixture(scope="session")
def bootstrap():
    addr = os.environ.get("BOOTSTRAP")
    if not addr:
        pytest.fail("BOOTSTRAP=host:port is not set (run via tests/compat/run.sh)")
    return addr


def unique_topic(prefix):
    return f"compat.{prefix}.{int(time.time())}.{uuid.uuid4().hex[:8]}"


def record(i):
    """Key, value and headers of record number i (the key carries i)."""
    key = b"k-%05d" % i
    value = b"v-%05d-" % i + b"x" * (i % 97)
    headers = [("seq", b"%d" % i), ("src", b"compat")]
    return key, value, headers


def seq_of(key):
    assert key is not None and key.startswith(b"k-"), key
    return int(key[2:])


def check_acks(delivered, n=N_RECORDS, partitions=N_PARTITIONS):
    """Every record acked, on every partition, with dense offsets from 0."""
    assert len(delivered) == n
    parts = {p for p, _ in delivered.values()}
    assert parts == set(range(partitions)), parts
    for p in range(partitions):
        offs = sorted(o for q, o in delivered.values() if q == p)
        assert offs == list(range(len(offs))), f"p{p}: acked offsets not dense from 0"


def check_read_back(per_partition, delivered, n=N_RECORDS, partitions=N_PARTITIONS, check_headers=True):
    """Assert what was read back equals what was produced.

    per_partition: {partition: [(offset, key, value, headers)]} as consumed.
    delivered: {key: (partition, offset)} from the producer's acks.
    """
    assert sorted(per_partition) == list(range(partitions)), sorted(per_partition)
    seen = set()
    for p, recs in per_partition.items():
        offsets = [r[0] for r in recs]
        assert offsets == list(range(len(recs))), (
            f"p{p}: offsets not dense from 0 (first {offsets[:5]}, {len(offsets)} records)")
        assert recs, f"p{p} is empty: {n} keyed records should reach every partition"
        seqs = []
        for off, key, value, headers in recs:
            i = seq_of(key)
            exp_key, exp_value, exp_headers = record(i)
            assert value == exp_value, f"p{p}@{off}: value {value!r} != {exp_value!r}"
            if check_headers:
                assert list(headers) == exp_headers, f"p{p}@{off}: headers {headers!r} != {exp_headers!r}"
            assert key not in seen, f"duplicate key {key!r} at p{p}@{off}"
            seen.add(key)
            assert delivered[key] == (p, off), (
                f"{key!r} acked at p{delivered[key][0]}@{delivered[key][1]} but read at p{p}@{off}")
            seqs.append(i)
        assert seqs == sorted(seqs), f"p{p}: records not in produce order"
    assert len(seen) == n, f"read back {len(seen)} distinct keys, produced {n}"


GROUP_RECORDS = 3_000


class _Member(threading.Thread):
    """One group member, polled on its own thread (clients are not
    thread-safe, and a member must keep polling to take part in rebalances).

    `client` is a small adapter: poll() -> [(partition, offset, key)],
    assigned() -> set of partitions, commit(), close().
    """

    def __init__(self, name, make_client, seen, lock):
        super().__init__(name=name, daemon=True)
        self.make_client, self.seen, self.lock = make_client, seen, lock
        self.assigned = set()
        self.stop = threading.Event()
        self.error = None

    def run(self):
        try:
            client = self.make_client(self.name)
            try:
                while not self.stop.is_set():
                    records = client.poll()
                    with self.lock:
                        for p, off, key in records:
                            self.seen.setdefault((p, off), []).append((self.name, key))
                    if records:
                        client.commit()
                    self.assigned = client.assigned()
            finally:
                client.close()
        except BaseException as e:  # reported by the test thread
            self.error = e


def group_scenario(topic, produce, make_client, partitions=N_PARTITIONS):
    """Two members of one group share `topic`, consume and commit; one leaves
    and the other takes over from its commits. Every record is consumed
    exactly once. Returns the member still in the group's name.

    produce(start, n) produces record(start) .. record(start + n - 1) and
    returns {key: (partition, offset)}.
    """
    seen, lock = {}, threading.Lock()
    a = _Member("member-a", make_client, seen, lock)
    b = _Member("member-b", make_client, seen, lock)

    def wait(cond, what, timeout=60):
        deadline = time.monotonic() + timeout
        while not cond():
            for m in (a, b):
                if m.error is not None:
                    raise AssertionError(f"{m.name} failed") from m.error
            assert time.monotonic() < deadline, f"timed out waiting for {what}: a={a.assigned} b={b.assigned}"
            time.sleep(0.05)

    a.start()
    b.start()
    try:
        wait(lambda: a.assigned and b.assigned and len(a.assigned) + len(b.assigned) == partitions
             and not a.assigned & b.assigned, "both members to share the partitions")
        delivered = produce(0, GROUP_RECORDS)
        wait(lambda: len(seen) >= GROUP_RECORDS, f"{GROUP_RECORDS} records")
        with lock:
            assert {who[0][0] for who in seen.values()} == {"member-a", "member-b"}, "both members consumed"

        # a leaves (close sends LeaveGroup): b takes every partition and
        # resumes from a's commits.
        a.stop.set()
        a.join(30)
        assert not a.is_alive(), "member-a did not close"
        assert a.error is None, a.error
        wait(lambda: b.assigned == set(range(partitions)), "member-b to take over")
        delivered.update(produce(GROUP_RECORDS, GROUP_RECORDS))
        wait(lambda: len(seen) >= 2 * GROUP_RECORDS, f"{2 * GROUP_RECORDS} records")
        time.sleep(0.5)  # anything read twice would show up now
        with lock:
            dups = {k: v for k, v in seen.items() if len(v) > 1}
            assert not dups, f"records consumed twice: {list(dups.items())[:5]}"
            assert len(seen) == 2 * GROUP_RECORDS
            for (p, off), [(_, key)] in seen.items():
                assert delivered[key] == (p, off), (key, delivered[key], (p, off))
    except BaseException:
        a.stop.set()
        b.stop.set()
        raise
    return b


def finish_member(member):
    member.stop.set()
    member.join(30)
    assert not member.is_alive(), f"{member.name} did not close"
    assert member.error is None, member.error


CODECS = ("gzip", "snappy", "lz4", "zstd")
CODEC_RECORDS = 1_000


STREAM_RECORDS = 40


def stream_scenario(prefix, send, read):
    """An ordered subtree stream: records sent one at a time, alternating
    over two topics of `prefix` and one outside it, come back from
    `<prefix>.__all` in send order with their source in `canopy.*` headers.

    send(topic, value) -> (partition, offset), acked before it returns.
    read(stream, n) -> [(offset, value, {header: bytes})] in delivery order.
    """
    topics = [f"{prefix}.a.x", f"{prefix}.b.y", f"{prefix}-outside"]
    sent = []
    for i in range(STREAM_RECORDS * 3 // 2):
        topic = topics[i % 3]
        value = b"%s#%d" % (topic.encode(), i)
        partition, offset = send(topic, value)
        if topic != topics[2]:
            sent.append((topic, partition, offset, value))
    got = read(f"{prefix}.__all", len(sent))
    offsets = [o for o, _, _ in got]
    assert offsets == sorted(set(offsets)), "stream offsets increase"
    tagged = [(h["canopy.topic"].decode(), int(h["canopy.partition"]), int(h["canopy.offset"]), v) for _, v, h in got]
    assert tagged == sent
    return offsets[-1]


@pytest.fixture(scope="session")
def security():
    """The secured listeners run.sh starts: SASL_SSL (SCRAM-SHA-512,
    SCRAM-SHA-256, PLAIN) and SSL with required client certificates, their
    CA, a client certificate, a user and a super user."""
    keys = ["SASL_BOOTSTRAP", "SSL_BOOTSTRAP", "CA_PEM", "CLIENT_CERT", "CLIENT_KEY", "SASL_USER", "SASL_PASSWORD",
            "ADMIN_USER", "ADMIN_PASSWORD", "OTHER_USER", "OTHER_PASSWORD"]
    missing = [k for k in keys if not os.environ.get(k)]
    if missing:
        pytest.fail(f"{', '.join(missing)} not set (run via tests/compat/run.sh)")
    return {k.lower(): os.environ[k] for k in keys}


def jwt(sub, lifetime_s=3600, key=None):
    """An RS256 token for `sub`, signed with the compat identity provider's
    key (run.sh puts its public half in the broker's JWKS) or `key`."""
    import base64
    import json
    import subprocess
    b64 = lambda b: base64.urlsafe_b64encode(b).rstrip(b"=").decode()
    now = int(time.time())
    header = {"alg": "RS256", "typ": "JWT", "kid": os.environ["IDP_KID"]}
    claims = {"sub": sub, "aud": os.environ["IDP_AUDIENCE"], "iat": now, "exp": now + lifetime_s}
    signing_input = f"{b64(json.dumps(header).encode())}.{b64(json.dumps(claims).encode())}"
    signature = subprocess.run(["openssl", "dgst", "-sha256", "-sign", key or os.environ["IDP_KEY"]],
                               input=signing_input.encode(), capture_output=True, check=True).stdout
    return f"{signing_input}.{b64(signature)}"


SECURE_RECORDS = 300


def secure_round_trip(produce_all, read_group):
    """Records produced over a secured listener come back, each exactly once,
    through a consumer group that commits (the topic has several
    partitions, so only the set is compared; order within a partition is
    checked by the plaintext tests).

    produce_all(values) acks every value; read_group(n) -> [value] read by a
    group member that commits what it read and checks its commit."""
    values = [b"secure-%04d" % i for i in range(SECURE_RECORDS)]
    produce_all(values)
    assert sorted(read_group(len(values))) == values
