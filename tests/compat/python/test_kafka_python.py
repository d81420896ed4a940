"""kafka-python (pure-Python client) against Canopy.

Covers: KafkaAdminClient.create_topics / describe_topics / describe_cluster,
KafkaProducer (keys + headers, acks=all, idempotent: InitProducerId and
sequence numbers; and with each of gzip, snappy, lz4, zstd), KafkaConsumer by explicit assign() + seek_to_beginning(),
beginning/end offsets (ListOffsets) and metadata; and consumer groups: two
subscribed members share a topic and commit, one leaves and the other resumes
from its commits (conftest.group_scenario), then the admin API's view of the
group (list_groups, describe_groups, list_group_offsets through the
multi-group OffsetFetch, delete_groups); and security: a group over SASL_SSL
(SCRAM-SHA-512, SCRAM-SHA-256, PLAIN) and mutual TLS, and a wrong password;
and fetch sessions (KIP-227): a consumer of 1,000 partitions, checked on the
wire through a decoding proxy in front of a broker of the test's own.
"""
import time
import uuid

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition

from conftest import (CODEC_RECORDS, CODECS, N_PARTITIONS, N_RECORDS, check_acks, check_read_back, stream_scenario,
                      finish_member, group_scenario, record, unique_topic)


@pytest.fixture(scope="module")
def admin(bootstrap):
    a = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="compat-kafka-python-admin",
                         request_timeout_ms=20000)
    yield a
    a.close()


@pytest.fixture(scope="module")
def topic(admin):
    name = unique_topic("kafka_python")
    result = admin.create_topics({name: {"num_partitions": N_PARTITIONS, "replication_factor": 1}},
                                 timeout_ms=10000, wait_for_metadata=True)
    [t] = result["topics"]
    assert t["name"] == name and t["error_code"] == 0, result
    return name


def produce(bootstrap, topic, start=0, n=N_RECORDS, compression=None):
    """Produce record(start) .. record(start + n - 1); returns {key: (partition, offset)}."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, client_id="compat-kafka-python-producer",
                             acks="all", enable_idempotence=True, linger_ms=5, compression_type=compression,
                             max_in_flight_requests_per_connection=1, request_timeout_ms=20000)
    try:
        futures = []
        for i in range(start, start + n):
            key, value, headers = record(i)
            futures.append((key, producer.send(topic, key=key, value=value, headers=headers)))
        producer.flush(timeout=60)
        acks = {}
        for key, fut in futures:
            md = fut.get(timeout=30)
            assert md.topic == topic
            acks[key] = (md.partition, md.offset)
        return acks
    finally:
        producer.close(timeout=10)


@pytest.fixture(scope="module")
def delivered(bootstrap, topic):
    """N_RECORDS keyed records with headers; {key: (partition, offset)}."""
    return produce(bootstrap, topic)


def test_create_topic_visible(admin, topic):
    [t] = admin.describe_topics([topic])
    assert t["name"] == topic and t["error_code"] == 0, t
    assert sorted(p["partition_index"] for p in t["partitions"]) == list(range(N_PARTITIONS)), t
    assert topic in admin.list_topics()


def test_produce_acks(delivered):
    check_acks(delivered)


def read_back(bootstrap, topic, n):
    """{partition: [(offset, key, value, headers)]} of the first n records, by assignment."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                             auto_offset_reset="earliest", fetch_max_wait_ms=200)
    try:
        tps = [TopicPartition(topic, p) for p in range(N_PARTITIONS)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        per_partition = {p: [] for p in range(N_PARTITIONS)}
        deadline = time.monotonic() + 60
        while sum(len(v) for v in per_partition.values()) < n:
            assert time.monotonic() < deadline, f"read {[len(v) for v in per_partition.values()]} of {n}"
            for tp, msgs in consumer.poll(timeout_ms=500).items():
                for m in msgs:
                    per_partition[tp.partition].append((m.offset, m.key, m.value, list(m.headers)))
        return per_partition
    finally:
        consumer.close(autocommit=False)


@pytest.mark.parametrize("codec", CODECS)
def test_compressed_produce_round_trips(bootstrap, admin, codec):
    topic = unique_topic(f"kafka_python_{codec}")
    admin.create_topics({topic: {"num_partitions": N_PARTITIONS, "replication_factor": 1}},
                        timeout_ms=10000, wait_for_metadata=True)
    delivered = produce(bootstrap, topic, 0, CODEC_RECORDS, compression=codec)
    check_read_back(read_back(bootstrap, topic, CODEC_RECORDS), delivered, n=CODEC_RECORDS)


def test_read_back_by_assignment(bootstrap, topic, delivered):
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, client_id="compat-kafka-python-consumer",
                             group_id=None, enable_auto_commit=False, auto_offset_reset="earliest",
                             request_timeout_ms=30000, fetch_max_wait_ms=200)
    try:
        tps = [TopicPartition(topic, p) for p in range(N_PARTITIONS)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        begin = consumer.beginning_offsets(tps)
        end = consumer.end_offsets(tps)
        assert all(begin[tp] == 0 for tp in tps), begin
        assert sum(end.values()) == N_RECORDS, end
        per_partition = {p: [] for p in range(N_PARTITIONS)}
        deadline = time.monotonic() + 120
        while sum(len(v) for v in per_partition.values()) < N_RECORDS:
            assert time.monotonic() < deadline, (
                f"timed out: read {[len(v) for v in per_partition.values()]} of end offsets {end}")
            for tp, msgs in consumer.poll(timeout_ms=1000).items():
                assert tp.topic == topic
                for m in msgs:
                    per_partition[tp.partition].append((m.offset, m.key, m.value, list(m.headers)))
        # Nothing beyond the end offsets.
        extra = consumer.poll(timeout_ms=500)
        assert not any(extra.values()), f"records past the end offsets: {extra}"
        for tp in tps:
            assert len(per_partition[tp.partition]) == end[tp], (tp, end[tp])
            assert consumer.position(tp) == end[tp]
        check_read_back(per_partition, delivered)
    finally:
        consumer.close(autocommit=False)


def test_metadata(bootstrap, admin, topic):
    cluster = admin.describe_cluster()
    brokers = cluster["brokers"]
    assert brokers, cluster
    host, port = bootstrap.rsplit(":", 1)
    assert any(b["host"] == host and b["port"] == int(port) for b in brokers), brokers

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    try:
        assert topic in consumer.topics()
        assert consumer.partitions_for_topic(topic) == set(range(N_PARTITIONS))
    finally:
        consumer.close(autocommit=False)


class GroupClient:
    """conftest.group_scenario's adapter for a subscribed KafkaConsumer."""

    def __init__(self, bootstrap, topic, group, name):
        self.c = KafkaConsumer(topic, bootstrap_servers=bootstrap, client_id=name, group_id=group,
                               enable_auto_commit=False, auto_offset_reset="earliest",
                               session_timeout_ms=10000, heartbeat_interval_ms=500,
                               fetch_max_wait_ms=100, request_timeout_ms=30000)

    def poll(self):
        return [(tp.partition, m.offset, m.key) for tp, msgs in self.c.poll(timeout_ms=100).items() for m in msgs]

    def assigned(self):
        return {tp.partition for tp in self.c.assignment()}

    def commit(self):
        self.c.commit()

    def close(self):
        self.c.close(autocommit=False)


def test_group_members_share_commit_and_hand_over(bootstrap, admin):
    topic = unique_topic("kafka_python_group")
    admin.create_topics({topic: {"num_partitions": N_PARTITIONS, "replication_factor": 1}},
                        timeout_ms=10000, wait_for_metadata=True)
    group = topic + ".group"
    survivor = group_scenario(topic, lambda start, n: produce(bootstrap, topic, start, n),
                              lambda name: GroupClient(bootstrap, topic, group, name))
    try:
        # The group as the admin API sees it: listed, one Stable member, and
        # its commits at the end of every partition.
        listed = admin.list_groups()
        assert group in [g["group_id"] for g in listed], listed
        desc = admin.describe_groups([group])[group]
        assert desc["group_state"] == "Stable", desc
        assert [m["client_id"] for m in desc["members"]] == ["member-b"], desc
        committed = admin.list_group_offsets({group: None})[group]
        assert {tp.partition: om.offset for tp, om in committed.items() if tp.topic == topic} == \
            {p: n for p, n in enumerate(partition_counts(bootstrap, topic))}
    finally:
        finish_member(survivor)
    desc = admin.describe_groups([group])[group]
    assert desc["group_state"] == "Empty" and not desc["members"], desc
    # DeleteGroups removes the group and its offsets.
    deleted = admin.delete_groups([group])
    assert list(deleted) == [group] and getattr(deleted[group], "errno", 0) == 0, deleted
    assert not admin.list_group_offsets({group: None})[group]


def partition_counts(bootstrap, topic):
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    try:
        tps = [TopicPartition(topic, p) for p in range(N_PARTITIONS)]
        end = consumer.end_offsets(tps)
        return [end[tp] for tp in tps]
    finally:
        consumer.close(autocommit=False)


def test_subtree_stream_in_arrival_order(bootstrap):
    """`<prefix>.__all` through a kafka-python group consumer, committed."""
    prefix = unique_topic("stream_kp")
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0)

    def send(topic, value):
        md = producer.send(topic, value=value, partition=0).get(timeout=30)
        return md.partition, md.offset

    consumer = None

    def read(stream, n):
        nonlocal consumer
        consumer = KafkaConsumer(stream, bootstrap_servers=bootstrap, group_id=f"{prefix}-g",
                                 auto_offset_reset="earliest", enable_auto_commit=False)
        got, deadline = [], time.monotonic() + 60
        while len(got) < n:
            assert time.monotonic() < deadline, f"read {len(got)} of {n}"
            for msgs in consumer.poll(timeout_ms=500).values():
                got.extend((m.offset, m.value, dict(m.headers)) for m in msgs)
        return got

    try:
        last = stream_scenario(prefix, send, read)
        # Sparse offsets: the consumer still gets to the end (the broker
        # closes a complete read with a control batch it steps past).
        tp = TopicPartition(f"{prefix}.__all", 0)
        end = consumer.end_offsets([tp])[tp]
        deadline = time.monotonic() + 20
        while consumer.position(tp) != end:
            assert time.monotonic() < deadline, f"position {consumer.position(tp)}, end {end}"
            assert not consumer.poll(timeout_ms=200), "nothing past the produced records"
        consumer.commit()
        assert consumer.committed(tp) == end > last
    finally:
        producer.close(timeout=10)
        if consumer is not None:
            consumer.close()


# ---- security: SASL_SSL with SCRAM and PLAIN, SSL with client certificates --

def secure_config(security, how):
    if how == "ssl-cert":
        return dict(bootstrap_servers=security["ssl_bootstrap"], security_protocol="SSL",
                    ssl_cafile=security["ca_pem"], ssl_certfile=security["client_cert"],
                    ssl_keyfile=security["client_key"])
    return dict(bootstrap_servers=security["sasl_bootstrap"], security_protocol="SASL_SSL",
                ssl_cafile=security["ca_pem"], sasl_mechanism=how,
                sasl_plain_username=security["sasl_user"], sasl_plain_password=security["sasl_password"])


@pytest.mark.parametrize("how", ["SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN", "ssl-cert"])
def test_secured_listeners_produce_consume_and_commit(security, how):
    from conftest import secure_round_trip
    cfg = secure_config(security, how)
    topic = unique_topic("kafka_python_secure_" + how.replace("-", "_").lower())

    def produce_all(values):
        p = KafkaProducer(acks="all", linger_ms=5, request_timeout_ms=20000, **cfg)
        try:
            futures = [p.send(topic, value=v) for v in values]
            p.flush(timeout=60)
            for f in futures:
                f.get(timeout=30)
        finally:
            p.close(timeout=10)

    def read_group(n):
        c = KafkaConsumer(topic, group_id=topic + ".g", auto_offset_reset="earliest", enable_auto_commit=False, **cfg)
        try:
            got, deadline = [], time.monotonic() + 60
            while len(got) < n:
                assert time.monotonic() < deadline, f"read {len(got)} of {n}"
                for recs in c.poll(timeout_ms=500).values():
                    got.extend(r.value for r in recs)
            c.commit()
            assert sum(c.committed(TopicPartition(topic, p)) or 0 for p in range(N_PARTITIONS)) == n
            return got
        finally:
            c.close(autocommit=False)

    secure_round_trip(produce_all, read_group)


def test_wrong_password_is_refused(security, caplog):
    """kafka-python reports a refused bootstrap as a timeout; the reason it
    logs is the broker's SASL_AUTHENTICATION_FAILED answer."""
    from kafka.errors import KafkaError as KE
    cfg = secure_config(security, "SCRAM-SHA-512")
    cfg["sasl_plain_password"] = "not-it"
    with pytest.raises(KE):
        KafkaProducer(request_timeout_ms=5000, max_block_ms=5000, **cfg).partitions_for("anything")
    assert any("SaslAuthenticationFailedError" in r.getMessage() and "invalid credentials" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records][-5:]


def test_acls_through_the_admin_client(security):
    """kafka-python's KafkaAdminClient creates, describes and deletes ACLs;
    a group granted to nobody else refuses another user."""
    from kafka.admin import (ACL, ACLFilter, ACLOperation, ACLPermissionType, ACLResourcePatternType, ResourcePattern,
                             ResourcePatternFilter, ResourceType)
    cfg = secure_config(security, "SCRAM-SHA-512")
    cfg.update(sasl_plain_username=security["admin_user"], sasl_plain_password=security["admin_password"])
    admin = KafkaAdminClient(request_timeout_ms=20000, **cfg)
    try:
        group = unique_topic("kp_acl_group")
        acl = ACL(f"User:{security['sasl_user']}", "*", ACLOperation.READ, ACLPermissionType.ALLOW,
                  ResourcePattern(ResourceType.GROUP, group, ACLResourcePatternType.LITERAL))
        result = admin.create_acls([acl])
        assert not result["failed"] and len(result["succeeded"]) == 1, result
        flt = ACLFilter(None, None, ACLOperation.ANY, ACLPermissionType.ANY,
                        ResourcePatternFilter(ResourceType.GROUP, group, ACLResourcePatternType.MATCH))
        acls, error = admin.describe_acls(flt)
        assert error.errno == 0 and [(a.principal, a.operation) for a in acls] == [(acl.principal, ACLOperation.READ)]
        # bob may not join alice's group.
        other = secure_config(security, "SCRAM-SHA-512")
        other.update(sasl_plain_username=security["other_user"], sasl_plain_password=security["other_password"])
        c = KafkaConsumer(group_id=group, enable_auto_commit=False, **other)
        try:
            from kafka.errors import GroupAuthorizationFailedError
            with pytest.raises(GroupAuthorizationFailedError):
                c.subscribe([unique_topic("kp_acl_t")])
                for _ in range(20):
                    c.poll(timeout_ms=500)
        finally:
            c.close(autocommit=False)
        deleted = admin.delete_acls([flt])
        [(_, matched, err)] = deleted
        assert err.errno == 0 and len(matched) == 1, deleted
        acls, error = admin.describe_acls(flt)
        assert not acls
    finally:
        admin.close()


def test_client_quotas_altered_described_and_enforced(security, caplog):
    """Client quotas through kafka-python's own codec for AlterClientQuotas
    and DescribeClientQuotas (its admin client sends them as kafka-configs
    does); a producer over its byte rate is held to it and kafka-python
    logs the throttle time the broker asked for."""
    from kafka.protocol.admin.client_quotas import AlterClientQuotasRequest, DescribeClientQuotasRequest
    cfg = secure_config(security, "SCRAM-SHA-512")
    cfg.update(sasl_plain_username=security["admin_user"], sasl_plain_password=security["admin_password"])
    admin = KafkaAdminClient(request_timeout_ms=20000, **cfg)
    user = security["other_user"]
    client_id = f"kp-quota-{uuid.uuid4().hex[:8]}"
    entity = [("user", user), ("client-id", client_id)]

    def alter(ops, validate_only=False):
        r = admin._manager.run(admin._manager.send, AlterClientQuotasRequest(entries=[(entity, ops)], validate_only=validate_only))
        return [(e.error_code, e.error_message) for e in r.entries]

    def describe():
        r = admin._manager.run(admin._manager.send, DescribeClientQuotasRequest(
            components=[("user", 0, user), ("client-id", 0, client_id)], strict=True))
        assert r.error_code == 0, r
        return {v.key: v.value for e in r.entries for v in e.values}

    try:
        assert alter([("producer_byte_rate", 1.5, False)])[0][0] == 42, "byte rates are whole: INVALID_REQUEST"
        assert alter([("producer_byte_rate", 50000.0, False)], validate_only=True) == [(0, None)]
        assert describe() == {}
        assert alter([("producer_byte_rate", 50000.0, False), ("request_percentage", 200.0, False)]) == [(0, None)]
        assert describe() == {"producer_byte_rate": 50000.0, "request_percentage": 200.0}

        other = secure_config(security, "SCRAM-SHA-512")
        other.update(sasl_plain_username=user, sasl_plain_password=security["other_password"])
        producer = KafkaProducer(client_id=client_id, acks=1, linger_ms=5, batch_size=16384, **other)
        try:
            topic = unique_topic("kp_quota")
            start = time.monotonic()
            for _ in range(100):
                producer.send(topic, b"q" * 2000)
            producer.flush(timeout=60)
            took = time.monotonic() - start
        finally:
            producer.close()
        # 200 kB at 50 kB/s after a 50 kB burst: about 3 s.
        assert took >= 2.0, f"200 kB in {took:.2f} s at 50 kB/s"
        assert any("ProduceResponse" in r.getMessage() and "throttled by broker" in r.getMessage() for r in caplog.records), \
            [r.getMessage() for r in caplog.records][-5:]

        assert alter([("producer_byte_rate", 0.0, True), ("request_percentage", 0.0, True)]) == [(0, None)]
        assert describe() == {}
    finally:
        admin.close()


def test_operator_surface(bootstrap, admin):
    """Kafka's operator APIs through kafka-python's admin client:
    IncrementalAlterConfigs of retention.ms, seen by DescribeConfigs with
    its source and synonyms; a bad value refused; ListOffsets max
    timestamp; DeleteRecords (and an offset past the end refused);
    DescribeLogDirs; DescribeProducers after an idempotent producer;
    DescribeTopicPartitions paged by its cursor."""
    from kafka.admin import ConfigResource, ConfigResourceType
    from kafka.admin._partitions import OffsetSpec
    import kafka.errors as Errors
    name = unique_topic("kp_ops")
    admin.create_topics({name: {"num_partitions": 2, "replication_factor": 1}}, timeout_ms=10000, wait_for_metadata=True)
    tp = TopicPartition(name, 0)

    def retention():
        d = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, name)], include_synonyms=True)
        return d["topic"][name]["retention.ms"]

    assert admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, name, configs={"retention.ms": "3600000"})]) \
        == {"topic": {name: "OK"}}
    r = retention()
    assert (r["value"], r["config_source"]) == ("3600000", "DYNAMIC_TOPIC_CONFIG"), r
    assert [s["source"] for s in r["synonyms"]] == ["DYNAMIC_TOPIC_CONFIG", "DEFAULT_CONFIG"], r
    bad = admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, name, configs={"retention.ms": "soon"})])
    assert "InvalidConfigurationError" in str(bad["topic"][name]), bad
    assert retention()["value"] == "3600000", "unchanged"

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=0,
                             max_in_flight_requests_per_connection=1)
    try:
        for ts in (5000, 9000, 7000, 9000, 1000):
            producer.send(name, key=b"k", value=b"v", partition=0, timestamp_ms=ts).get(timeout=30)
    finally:
        producer.close(timeout=10)
    offsets = admin.list_partition_offsets({tp: OffsetSpec.MAX_TIMESTAMP})
    assert offsets[tp].offset == 1 and offsets[tp].timestamp == 9000, offsets

    producers = admin.describe_producers([tp])
    [p] = producers[tp].active_producers
    assert (p.last_sequence, p.last_timestamp, p.current_transaction_start_offset) == (4, 1000, -1), producers

    deleted = admin.delete_records({tp: 2}, timeout_ms=10000)
    assert (deleted[tp]["low_watermark"], deleted[tp]["error_code"]) == (2, 0), deleted
    with pytest.raises(Errors.OffsetOutOfRangeError):
        admin.delete_records({tp: 99}, timeout_ms=10000)
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        assert consumer.beginning_offsets([tp])[tp] == 2
    finally:
        consumer.close()

    dirs = admin.describe_log_dirs({name: [0, 1]})
    [broker] = dirs
    [log_dir] = broker["log_dirs"]
    sizes = {(t["name"], p["partition_index"]): p["partition_size"] for t in log_dir["topics"] for p in t["partitions"]}
    assert sizes[(name, 0)] > 0 and sizes[(name, 1)] == 0, log_dir

    page = admin.describe_topic_partitions([name], response_partition_limit=1)
    assert [p["partition_index"] for p in page["topics"][0]["partitions"]] == [0], page
    assert page["next_cursor"]["partition_index"] == 1, page
    admin.delete_topics([name])


class FetchRecorder:
    """A TCP proxy that forwards bytes unchanged and records, for every
    Fetch request a client sends through it, (session id, epoch, partitions
    named, partitions forgotten), decoded from the request bytes."""

    def __init__(self):
        import socket
        import threading
        self.upstream = None
        self.fetches = []
        self.lock = threading.Lock()
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(16)
        self.port = self.server.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        import socket
        import threading
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            up = socket.create_connection(("127.0.0.1", self.upstream))
            threading.Thread(target=self._pipe, args=(up, client, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(client, up, True), daemon=True).start()

    def _pipe(self, src, dst, requests):
        buf = b""
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data:
                for s in (src, dst):
                    try:
                        s.close()
                    except OSError:
                        pass
                return
            if requests:
                buf += data
                while len(buf) >= 4:
                    n = int.from_bytes(buf[:4], "big", signed=True)
                    if len(buf) < 4 + n:
                        break
                    frame, buf = buf[4:4 + n], buf[4 + n:]
                    key, version = int.from_bytes(frame[0:2], "big"), int.from_bytes(frame[2:4], "big")
                    if key == 1 and version >= 7:
                        with self.lock:
                            self.fetches.append(parse_fetch(frame, version))
            try:
                dst.sendall(data)
            except OSError:
                return

    def close(self):
        self.server.close()


def parse_fetch(frame, version):
    """(session id, epoch, partitions named, partitions forgotten) of a
    Fetch request v7-v12 (header included)."""
    pos = [0]

    def take(n):
        b = frame[pos[0]:pos[0] + n]
        assert len(b) == n, "truncated fetch request"
        pos[0] += n
        return b

    def i(n):
        return int.from_bytes(take(n), "big", signed=True)

    def uvarint():
        shift = value = 0
        while True:
            b = take(1)[0]
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7

    flexible = version >= 12

    def array():
        return uvarint() - 1 if flexible else i(4)

    def string():
        take(uvarint() - 1 if flexible else i(2))

    def tagged():
        for _ in range(uvarint()):
            uvarint()
            take(uvarint())

    i(2), i(2), i(4)  # api key, version, correlation id
    n = i(2)  # client id: a nullable string in every header version
    take(max(n, 0))
    if flexible:
        tagged()
    i(4), i(4), i(4), i(4), i(1)  # replica, max wait, min bytes, max bytes, isolation
    session_id, epoch = i(4), i(4)
    named = 0
    for _ in range(array()):
        string()
        for _ in range(array()):
            i(4)
            if version >= 9:
                i(4)
            i(8)
            if version >= 12:
                i(4)
            i(8), i(4)
            if flexible:
                tagged()
            named += 1
        if flexible:
            tagged()
    forgotten = 0
    for _ in range(array()):
        string()
        k = array()
        take(4 * k)
        forgotten += k
        if flexible:
            tagged()
    return session_id, epoch, named, forgotten


def start_own_broker(tmp_path, advertised_port):
    """A broker of this test's own (the suite's advertises its own address,
    and this one must advertise the recording proxy). Returns (process,
    kafka port)."""
    import os
    import socket
    import subprocess
    binary = os.environ.get("CANOPY_BIN")
    if not binary:
        pytest.fail("CANOPY_BIN is not set (run via tests/compat/run.sh)")
    socks = [socket.socket() for _ in range(2)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    kport, aport = (s.getsockname()[1] for s in socks)
    for s in socks:
        s.close()
    log = open(tmp_path / "broker.log", "w")
    proc = subprocess.Popen([binary, "serve", "--data-dir", str(tmp_path / "data"), "--kafka-listener", f"127.0.0.1:{kport}",
                             "--admin-listener", f"127.0.0.1:{aport}", "--rest-listener", "",
                             "--advertised-listener", f"127.0.0.1:{advertised_port}"], stdout=log, stderr=log)
    deadline = time.time() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", kport), timeout=1).close()
            return proc, kport
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                pytest.fail("the broker did not start: " + open(tmp_path / "broker.log").read()[-2000:])
            time.sleep(0.1)


def test_fetch_sessions_send_only_changed_partitions(tmp_path):
    """KIP-227 with kafka-python's FetchSessionHandler: a consumer assigned
    1,000 partitions names them all in its first fetch, then (through the
    session the broker opened) only the partitions whose position changed,
    while it reads every record produced. Checked on the wire: every Fetch
    goes through a proxy that decodes it."""
    recorder = FetchRecorder()
    proc, kport = start_own_broker(tmp_path, recorder.port)
    recorder.upstream = kport
    bootstrap = f"127.0.0.1:{recorder.port}"
    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=20000)
        name = unique_topic("sessions")
        admin.create_topics({name: {"num_partitions": 1000, "replication_factor": 1}}, timeout_ms=20000, wait_for_metadata=True)
        admin.close()
        producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
        consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, fetch_max_wait_ms=200,
                                 consumer_timeout_ms=100)
        consumer.assign([TopicPartition(name, p) for p in range(1000)])
        consumer.seek_to_beginning()
        got = set()

        def read_until(n):
            deadline = time.time() + 60
            while len(got) < n:
                assert time.time() < deadline, f"read {len(got)} of {n}"
                for batch in consumer.poll(timeout_ms=300).values():
                    got.update((m.partition, m.offset) for m in batch)

        for round_, parts in enumerate([(1, 500, 998), (2, 501, 999), (1, 2, 3)]):
            for p in parts:
                producer.send(name, value=b"v", partition=p).get(timeout=30)
            read_until(3 * (round_ + 1))
            time.sleep(1)  # several empty incremental fetches
            for batch in consumer.poll(timeout_ms=500).values():
                got.update((m.partition, m.offset) for m in batch)
        assert got == {(1, 0), (500, 0), (998, 0), (2, 0), (501, 0), (999, 0), (1, 1), (2, 1), (3, 0)}
        consumer.close()
        producer.close()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except Exception:
            proc.kill()
        recorder.close()
    with recorder.lock:
        fetches = list(recorder.fetches)
    full = [f for f in fetches if f[1] == 0]
    incremental = [f for f in fetches if f[0] != 0 and f[1] > 0]
    assert full and full[0][2] == 1000, f"the first fetch names every partition: {fetches[:3]}"
    assert len(incremental) >= 10, f"few incremental fetches: {fetches}"
    assert len(full) == 1, f"the session lasted (no second full fetch): {[f for f in fetches if f[1] <= 0]}"
    # After the first, a fetch names only partitions whose position moved:
    # at most the three that just returned records.
    assert max(f[2] for f in incremental) <= 3, sorted({f[2] for f in incremental})
    assert sum(f[2] for f in incremental) >= 9, "every moved position was sent"
