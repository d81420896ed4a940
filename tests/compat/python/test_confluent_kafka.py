"""confluent-kafka (librdkafka) against Canopy.

Covers: AdminClient.create_topics / list_topics / describe_cluster, Producer
(keys + headers, acks=all, enable.idempotence=True: InitProducerId and
sequence numbers; and with each of gzip, snappy, lz4, zstd), Consumer by explicit assign() at OFFSET_BEGINNING,
get_watermark_offsets (ListOffsets) and metadata; and consumer groups: two
subscribed members share a topic and commit, one leaves and the other resumes
from its commits (conftest.group_scenario), then list_consumer_groups,
describe_consumer_groups, list_consumer_group_offsets and
delete_consumer_groups; and transactions: a committed transaction with a
group's offsets, an aborted one, read_committed / read_uncommitted readers,
and a zombie fenced by a newer producer of the same transactional.id; and
security: a group over SASL_SSL (SCRAM-SHA-512, PLAIN) and mutual TLS, a
wrong password, SCRAM credentials created, described, rotated and deleted
through the AdminClient by a super user and refused to anyone else.

The assign()-only consumer still needs a group.id (librdkafka insists); it
never subscribes or commits, so that group is never touched.
"""
import os
import time

import pytest
from confluent_kafka import (OFFSET_BEGINNING, Consumer, ConsumerGroupState, ConsumerGroupTopicPartitions, KafkaError,
                             KafkaException, Producer, TopicCollection, TopicPartition)
from confluent_kafka.admin import AdminClient, NewTopic

from conftest import (CODEC_RECORDS, CODECS, N_PARTITIONS, N_RECORDS, check_acks, check_read_back,
                      finish_member, group_scenario, record, stream_scenario, unique_topic)


@pytest.fixture(scope="module")
def admin(bootstrap):
    return AdminClient({"bootstrap.servers": bootstrap, "client.id": "compat-confluent-admin"})


@pytest.fixture(scope="module")
def topic(admin):
    name = unique_topic("confluent_kafka")
    futures = admin.create_topics([NewTopic(name, num_partitions=N_PARTITIONS, replication_factor=1)],
                                  operation_timeout=10, request_timeout=20)
    futures[name].result(timeout=30)  # raises KafkaException on a topic error
    # Wait until the topic shows all its partitions in metadata.
    deadline = time.monotonic() + 10
    while True:
        md = admin.list_topics(topic=name, timeout=10)
        t = md.topics.get(name)
        if t is not None and t.error is None and len(t.partitions) == N_PARTITIONS:
            return name
        assert time.monotonic() < deadline, f"topic {name} not ready: {t and (t.error, t.partitions)}"
        time.sleep(0.1)


def produce(bootstrap, topic, start=0, n=N_RECORDS, compression="none"):
    """Produce record(start) .. record(start + n - 1); returns {key: (partition, offset)}."""
    producer = Producer({
        "bootstrap.servers": bootstrap,
        "client.id": "compat-confluent-producer",
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": 5,
        "compression.type": compression,
        "max.in.flight.requests.per.connection": 1,
        "message.timeout.ms": 60000,
    })
    acks, errors = {}, []

    def on_delivery(err, msg):
        if err is not None:
            errors.append((msg.key(), err))
        else:
            acks[msg.key()] = (msg.partition(), msg.offset())

    for i in range(start, start + n):
        key, value, headers = record(i)
        while True:
            try:
                producer.produce(topic, key=key, value=value, headers=headers, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    remaining = producer.flush(60)
    assert remaining == 0, f"{remaining} records not delivered after 60 s"
    assert not errors, f"{len(errors)} delivery errors, first: {errors[:3]}"
    return acks


@pytest.fixture(scope="module")
def delivered(bootstrap, topic):
    """N_RECORDS keyed records with headers; {key: (partition, offset)}."""
    return produce(bootstrap, topic)


def test_create_topic_visible(admin, topic):
    # Metadata for this one topic, and AdminClient.describe_topics.
    md = admin.list_topics(topic=topic, timeout=10)
    t = md.topics[topic]
    assert t.error is None, t.error
    assert sorted(t.partitions) == list(range(N_PARTITIONS))
    [(name, fut)] = admin.describe_topics(TopicCollection([topic]), request_timeout=10).items()
    d = fut.result(timeout=20)
    assert name == topic and d.name == topic
    assert sorted(p.id for p in d.partitions) == list(range(N_PARTITIONS))


def test_produce_acks(delivered):
    check_acks(delivered)


def read_back(bootstrap, topic, n):
    """{partition: [(offset, key, value, headers)]} of the first n records, by assignment."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "compat-confluent-unused",
                         "enable.auto.commit": False, "enable.auto.offset.store": False, "fetch.wait.max.ms": 200})
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(N_PARTITIONS)])
        per_partition = {p: [] for p in range(N_PARTITIONS)}
        deadline = time.monotonic() + 60
        while sum(len(v) for v in per_partition.values()) < n:
            assert time.monotonic() < deadline, f"read {[len(v) for v in per_partition.values()]} of {n}"
            for m in consumer.consume(num_messages=500, timeout=0.5):
                if m.error():
                    raise KafkaException(m.error())
                per_partition[m.partition()].append((m.offset(), m.key(), m.value(), m.headers() or []))
        return per_partition
    finally:
        consumer.close()


@pytest.mark.parametrize("codec", CODECS)
def test_compressed_produce_round_trips(bootstrap, admin, codec):
    topic = unique_topic(f"confluent_kafka_{codec}")
    admin.create_topics([NewTopic(topic, num_partitions=N_PARTITIONS, replication_factor=1)])[topic].result(timeout=30)
    delivered = produce(bootstrap, topic, 0, CODEC_RECORDS, compression=codec)
    check_read_back(read_back(bootstrap, topic, CODEC_RECORDS), delivered, n=CODEC_RECORDS)


def test_read_back_by_assignment(bootstrap, topic, delivered):
    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "client.id": "compat-confluent-consumer",
        "group.id": "compat-confluent-unused",  # required by librdkafka; never used (no subscribe/commit)
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "error",  # an out-of-range start must fail the test, not silently skip
        "enable.partition.eof": True,
        "fetch.wait.max.ms": 200,
    })
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(N_PARTITIONS)])
        per_partition = {p: [] for p in range(N_PARTITIONS)}
        eof = set()
        deadline = time.monotonic() + 120
        while len(eof) < N_PARTITIONS or sum(len(v) for v in per_partition.values()) < N_RECORDS:
            assert time.monotonic() < deadline, (
                f"timed out: read {[len(v) for v in per_partition.values()]}, eof {sorted(eof)}")
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    eof.add(msg.partition())
                    continue
                pytest.fail(f"consumer error: {msg.error()}")
            assert msg.topic() == topic
            per_partition[msg.partition()].append(
                (msg.offset(), msg.key(), msg.value(), msg.headers() or []))
        for p in range(N_PARTITIONS):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            assert low == 0, (p, low)
            assert high == len(per_partition[p]), (p, high, len(per_partition[p]))
        check_read_back(per_partition, delivered)
    finally:
        consumer.close()


def test_metadata(bootstrap, admin, topic):
    # Metadata for all topics (librdkafka sends Metadata v12 with a null topic array).
    md = admin.list_topics(timeout=10)
    assert md.brokers, "no brokers in metadata"
    host, port = bootstrap.rsplit(":", 1)
    assert any(b.host == host and b.port == int(port) for b in md.brokers.values()), md.brokers
    t = md.topics[topic]
    assert sorted(t.partitions) == list(range(N_PARTITIONS))
    for p in t.partitions.values():
        assert p.leader in md.brokers, (p.id, p.leader)
        assert p.error is None, (p.id, p.error)

    cluster = admin.describe_cluster(request_timeout=10).result(timeout=20)
    assert cluster.nodes, cluster
    assert any(n.host == host and n.port == int(port) for n in cluster.nodes), cluster.nodes


class GroupClient:
    """conftest.group_scenario's adapter for a subscribed Consumer."""

    def __init__(self, bootstrap, topic, group, name, protocol="classic"):
        conf = {
            "bootstrap.servers": bootstrap,
            "client.id": name,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 100,
        }
        if protocol == "classic":
            conf.update({"session.timeout.ms": 10000, "heartbeat.interval.ms": 500})
        else:
            # KIP-848: timeouts and intervals are the broker's.
            conf["group.protocol"] = "consumer"
        self.c = Consumer(conf)
        self.c.subscribe([topic])

    def poll(self):
        out = []
        for m in self.c.consume(num_messages=500, timeout=0.1):
            if m.error():
                raise KafkaException(m.error())
            out.append((m.partition(), m.offset(), m.key()))
        return out

    def assigned(self):
        return {tp.partition for tp in self.c.assignment()}

    def commit(self):
        self.c.commit(asynchronous=False)

    def close(self):
        self.c.close()


def test_group_members_share_commit_and_hand_over(bootstrap, admin):
    topic = unique_topic("confluent_kafka_group")
    admin.create_topics([NewTopic(topic, num_partitions=N_PARTITIONS, replication_factor=1)])[topic].result(timeout=30)
    group = topic + ".group"
    survivor = group_scenario(topic, lambda start, n: produce(bootstrap, topic, start, n),
                              lambda name: GroupClient(bootstrap, topic, group, name))
    try:
        # The group through the admin API: listed, one Stable member, and its
        # commits at the end of every partition.
        listed = admin.list_consumer_groups(request_timeout=10).result(timeout=20)
        assert group in [g.group_id for g in listed.valid], listed.valid
        check_survivor_and_commits(bootstrap, admin, topic, group)
    finally:
        finish_member(survivor)
    desc = admin.describe_consumer_groups([group], request_timeout=10)[group].result(timeout=20)
    assert desc.state == ConsumerGroupState.EMPTY and not desc.members, desc
    admin.delete_consumer_groups([group], request_timeout=10)[group].result(timeout=20)
    listed = admin.list_consumer_groups(request_timeout=10).result(timeout=20)
    assert group not in [g.group_id for g in listed.valid]


def test_consumer_protocol_group_members_share_commit_and_hand_over(bootstrap, admin):
    """The same two-member scenario with KIP-848's protocol
    (group.protocol=consumer): the broker assigns, members share, commit,
    one leaves and the other resumes from its commits; the admin API lists
    it as a consumer group and describes its member."""
    from confluent_kafka import ConsumerGroupType
    topic = unique_topic("confluent_kafka_kip848")
    admin.create_topics([NewTopic(topic, num_partitions=N_PARTITIONS, replication_factor=1)])[topic].result(timeout=30)
    group = topic + ".group"
    survivor = group_scenario(topic, lambda start, n: produce(bootstrap, topic, start, n),
                              lambda name: GroupClient(bootstrap, topic, group, name, protocol="consumer"))
    try:
        listed = admin.list_consumer_groups(request_timeout=10).result(timeout=20)
        [g] = [g for g in listed.valid if g.group_id == group]
        assert g.type == ConsumerGroupType.CONSUMER, g.type
        desc = check_survivor_and_commits(bootstrap, admin, topic, group)
        assert {tp.partition for tp in desc.members[0].assignment.topic_partitions} == set(range(N_PARTITIONS))
    finally:
        finish_member(survivor)


def check_survivor_and_commits(bootstrap, admin, topic, group):
    """After group_scenario: one Stable member (member-b), and the group's
    commits at the end of every partition. Returns the description."""
    desc = admin.describe_consumer_groups([group], request_timeout=10)[group].result(timeout=20)
    assert desc.state == ConsumerGroupState.STABLE, desc.state
    assert [m.client_id for m in desc.members] == ["member-b"], desc.members
    committed = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(timeout=20)
    offsets = {tp.partition: tp.offset for tp in committed.topic_partitions if tp.topic == topic}
    ends = {p: admin_watermark(bootstrap, topic, p) for p in range(N_PARTITIONS)}
    assert offsets == ends, (offsets, ends)
    return desc


def admin_watermark(bootstrap, topic, partition):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "compat-confluent-unused"})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)[1]
    finally:
        c.close()


def read_values(bootstrap, topic, isolation, n, partitions=N_PARTITIONS):
    """Values of `topic` from the start with this isolation level: exactly n (and nothing more in 1.5 s)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "compat-confluent-unused",
                         "isolation.level": isolation, "enable.auto.commit": False,
                         "enable.auto.offset.store": False, "fetch.wait.max.ms": 100})
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        values, deadline = [], time.monotonic() + 60
        while len(values) < n:
            assert time.monotonic() < deadline, f"{isolation}: read {len(values)} of {n}: {values}"
            for m in consumer.consume(num_messages=500, timeout=0.5):
                if m.error():
                    raise KafkaException(m.error())
                values.append(m.value().decode())
        quiet = time.monotonic() + 1.5
        while time.monotonic() < quiet:
            extra = [m.value() for m in consumer.consume(num_messages=10, timeout=0.2) if not m.error()]
            assert not extra, f"{isolation}: more than {n} records: {extra}"
        return values
    finally:
        consumer.close()


def test_transactions_commit_abort_offsets_and_fencing(bootstrap, admin):
    """A transactional producer commits one transaction (with a group's offsets) and aborts another across
    three partitions; read_committed sees exactly the committed records, read_uncommitted all of them, the
    group's committed offset is the committed transaction's; a second producer with the same transactional.id
    fences the first."""
    topic = unique_topic("confluent_kafka_txn")
    source = unique_topic("confluent_kafka_txn_src")
    for t, n in ((topic, N_PARTITIONS), (source, 1)):
        admin.create_topics([NewTopic(t, num_partitions=n, replication_factor=1)])[t].result(timeout=30)
    conf = {"bootstrap.servers": bootstrap, "transactional.id": f"compat-{topic}", "linger.ms": 5}
    producer = Producer(conf)
    producer.init_transactions(30)
    group = f"{topic}.group"
    member = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        for outcome, offset in (("commit", 5), ("abort", 9)):
            producer.begin_transaction()
            for i in range(30):
                producer.produce(topic, value=f"{outcome}-{i}".encode(), partition=i % N_PARTITIONS)
            producer.send_offsets_to_transaction([TopicPartition(source, 0, offset)], member.consumer_group_metadata(), 30)
            if outcome == "commit":
                producer.commit_transaction(30)
            else:
                producer.flush(30)
                producer.abort_transaction(30)
        committed = member.committed([TopicPartition(source, 0)], timeout=10)
        assert committed[0].offset == 5, f"the aborted transaction's offset leaked: {committed}"
    finally:
        member.close()
    seen = read_values(bootstrap, topic, "read_committed", 30)
    assert sorted(seen) == sorted(f"commit-{i}" for i in range(30))
    everything = read_values(bootstrap, topic, "read_uncommitted", 60)
    assert sum(v.startswith("abort-") for v in everything) == 30

    newer = Producer(conf)
    newer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, value=b"zombie", partition=0)
    with pytest.raises(KafkaException) as failed:
        producer.commit_transaction(30)
    assert failed.value.args[0].fatal(), failed.value
    newer.begin_transaction()
    newer.produce(topic, value=b"newer", partition=0)
    newer.commit_transaction(30)
    assert sorted(read_values(bootstrap, topic, "read_committed", 31)) == sorted([f"commit-{i}" for i in range(30)] + ["newer"])


def test_subtree_stream_in_arrival_order(bootstrap):
    """`<prefix>.__all` through a librdkafka group consumer, committed."""
    prefix = unique_topic("stream_ck")
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})

    def send(topic, value):
        acked = []
        producer.produce(topic, value=value, partition=0, on_delivery=lambda err, m: acked.append((err, m)))
        producer.flush(30)
        (err, m), = acked
        assert err is None, err
        return m.partition(), m.offset()

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{prefix}-g",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})

    def read(stream, n):
        consumer.subscribe([stream])
        got, deadline = [], time.monotonic() + 60
        while len(got) < n:
            assert time.monotonic() < deadline, f"read {len(got)} of {n}"
            m = consumer.poll(0.5)
            if m is None:
                continue
            assert m.error() is None, m.error()
            got.append((m.offset(), m.value(), dict(m.headers())))
        return got

    try:
        last = stream_scenario(prefix, send, read)
        # Sparse offsets: the consumer still gets to the end (the broker
        # closes a complete read with a control batch it steps past).
        _, end = consumer.get_watermark_offsets(TopicPartition(f"{prefix}.__all", 0), timeout=10)
        deadline = time.monotonic() + 20
        while consumer.position([TopicPartition(f"{prefix}.__all", 0)])[0].offset != end:
            assert time.monotonic() < deadline, "the position never reached the end"
            m = consumer.poll(0.2)
            assert m is None or m.error() is not None and m.error().code() == KafkaError._PARTITION_EOF, m
        consumer.commit(asynchronous=False)
        tp, = consumer.committed([TopicPartition(f"{prefix}.__all", 0)], timeout=10)
        assert last < tp.offset <= end
    finally:
        consumer.close()


# ---- security: SASL_SSL with SCRAM and PLAIN, SSL with client certificates --

import contextlib


@contextlib.contextmanager
def cluster_alter_denied(security, user):
    """A DENY of ALTER on the cluster for `user`, for the length of a test.
    The compat broker's authorizer is open where no ACL names a resource
    (allow_everyone_if_no_acl_found), as Kafka's would be, so without an
    ACL on the cluster anyone may alter it; the DENY is removed after, so
    the other tests still find the cluster unnamed."""
    from confluent_kafka.admin import (AclBinding, AclBindingFilter, AclOperation, AclPermissionType, ResourcePatternType,
                                       ResourceType)
    admin = AdminClient({**secure_config(security, "SCRAM-SHA-512"), "sasl.username": security["admin_user"],
                         "sasl.password": security["admin_password"]})
    deny = AclBinding(ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL, f"User:{user}", "*",
                      AclOperation.ALTER, AclPermissionType.DENY)
    for f in admin.create_acls([deny], request_timeout=30).values():
        f.result(timeout=30)
    try:
        yield
    finally:
        flt = AclBindingFilter(ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL, f"User:{user}", "*",
                               AclOperation.ALTER, AclPermissionType.DENY)
        for f in admin.delete_acls([flt], request_timeout=30).values():
            assert len(f.result(timeout=30)) == 1

def secure_config(security, how):
    if how == "OAUTHBEARER":
        from conftest import jwt
        return {"bootstrap.servers": security["sasl_bootstrap"], "security.protocol": "SASL_SSL",
                "ssl.ca.location": security["ca_pem"], "sasl.mechanisms": "OAUTHBEARER",
                "oauth_cb": lambda _config: (jwt(security["sasl_user"]), time.time() + 3600)}
    if how == "ssl-cert":
        return {"bootstrap.servers": security["ssl_bootstrap"], "security.protocol": "SSL",
                "ssl.ca.location": security["ca_pem"], "ssl.certificate.location": security["client_cert"],
                "ssl.key.location": security["client_key"]}
    return {"bootstrap.servers": security["sasl_bootstrap"], "security.protocol": "SASL_SSL",
            "ssl.ca.location": security["ca_pem"], "sasl.mechanisms": how,
            "sasl.username": security["sasl_user"], "sasl.password": security["sasl_password"]}


@pytest.mark.parametrize("how", ["SCRAM-SHA-512", "PLAIN", "OAUTHBEARER", "ssl-cert"])
def test_secured_listeners_produce_consume_and_commit(security, how):
    from conftest import secure_round_trip
    cfg = secure_config(security, how)
    topic = unique_topic("confluent_secure_" + how.replace("-", "_").lower())

    def produce_all(values):
        p = Producer({**cfg, "acks": "all", "linger.ms": 5})
        errors = []
        for v in values:
            p.produce(topic, value=v, on_delivery=lambda err, msg: err and errors.append(err))
        assert p.flush(60) == 0 and not errors, errors

    def read_group(n):
        c = Consumer({**cfg, "group.id": topic + ".g", "auto.offset.reset": "earliest", "enable.auto.commit": False})
        c.subscribe([topic])
        got, deadline = [], time.monotonic() + 60
        while len(got) < n:
            assert time.monotonic() < deadline, f"read {len(got)} of {n}"
            m = c.poll(0.5)
            if m is not None:
                assert m.error() is None, m.error()
                got.append(m.value())
        c.commit(asynchronous=False)
        committed = c.committed([TopicPartition(topic, p) for p in range(N_PARTITIONS)], timeout=10)
        assert sum(max(tp.offset, 0) for tp in committed) == n, committed
        c.close()
        return got

    secure_round_trip(produce_all, read_group)


def test_wrong_password_fails_with_an_authentication_error(security):
    errors = []
    c = Consumer({**secure_config(security, "SCRAM-SHA-512"), "sasl.password": "not-it", "group.id": "x",
                  "error_cb": lambda e: errors.append(e)})
    deadline = time.monotonic() + 30
    while not any(e.code() == KafkaError._AUTHENTICATION for e in errors):
        assert time.monotonic() < deadline, errors
        c.poll(0.2)
    assert any("invalid credentials" in e.str() for e in errors), [e.str() for e in errors]
    c.close()


def test_scram_credentials_created_described_rotated_and_deleted(security):
    from confluent_kafka.admin import (ScramCredentialInfo, ScramMechanism, UserScramCredentialDeletion,
                                       UserScramCredentialUpsertion)
    admin = AdminClient({**secure_config(security, "SCRAM-SHA-512"), "sasl.username": security["admin_user"],
                         "sasl.password": security["admin_password"]})
    user = "rotated-" + unique_topic("u").rsplit(".", 1)[1]
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192)

    def upsert(password):
        futures = admin.alter_user_scram_credentials([UserScramCredentialUpsertion(user, info, password.encode())])
        futures[user].result(timeout=30)

    def can_login(password):
        errors = []
        p = Producer({**secure_config(security, "SCRAM-SHA-512"), "sasl.username": user, "sasl.password": password,
                      "error_cb": lambda e: errors.append(e)})
        md = None
        try:
            md = p.list_topics(timeout=10)
        except KafkaException:
            pass
        return md is not None and not any(e.code() == KafkaError._AUTHENTICATION for e in errors)

    upsert("first-password")
    described = admin.describe_user_scram_credentials([user])[user].result(timeout=30)
    assert [(i.mechanism, i.iterations) for i in described.scram_credential_infos] == [(ScramMechanism.SCRAM_SHA_512, 8192)]
    assert can_login("first-password")
    upsert("second-password")
    assert can_login("second-password") and not can_login("first-password")
    # Iterations under Kafka's minimum are refused.
    weak = admin.alter_user_scram_credentials([UserScramCredentialUpsertion(
        user, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 100), b"x")])
    with pytest.raises(KafkaException) as e:
        weak[user].result(timeout=30)
    assert e.value.args[0].code() == KafkaError.UNACCEPTABLE_CREDENTIAL
    # A user refused ALTER on the cluster may not alter credentials.
    with cluster_alter_denied(security, security["sasl_user"]):
        plain_admin = AdminClient(secure_config(security, "SCRAM-SHA-512"))
        denied = plain_admin.alter_user_scram_credentials([UserScramCredentialUpsertion(user, info, b"taken-over")])
        with pytest.raises(KafkaException) as e:
            denied[user].result(timeout=30)
        assert e.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
    assert can_login("second-password")
    deleted = admin.alter_user_scram_credentials([UserScramCredentialDeletion(user, ScramMechanism.SCRAM_SHA_512)])
    deleted[user].result(timeout=30)
    assert not can_login("second-password")


def test_acls_created_described_enforced_and_deleted(security):
    """ACLs through the AdminClient: a topic granted to one user is refused
    to another (TOPIC_AUTHORIZATION_FAILED) and nothing is written; a
    prefixed grant covers a branch; the ACLs are described with filters and
    deleted."""
    from confluent_kafka.admin import (AclBinding, AclBindingFilter, AclOperation, AclPermissionType, ResourcePatternType,
                                       ResourceType)
    admin = AdminClient({**secure_config(security, "SCRAM-SHA-512"), "sasl.username": security["admin_user"],
                         "sasl.password": security["admin_password"]})
    branch = unique_topic("acl") + "."
    topic = branch + "granted"
    alice = f"User:{security['sasl_user']}"
    bindings = [
        AclBinding(ResourceType.TOPIC, branch, ResourcePatternType.PREFIXED, alice, "*", AclOperation.WRITE, AclPermissionType.ALLOW),
        AclBinding(ResourceType.TOPIC, branch, ResourcePatternType.PREFIXED, alice, "*", AclOperation.CREATE, AclPermissionType.ALLOW),
        AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, alice, "*", AclOperation.READ, AclPermissionType.ALLOW),
    ]
    for f in admin.create_acls(bindings, request_timeout=30).values():
        f.result(timeout=30)

    def produce_as(user, password):
        errors = []
        p = Producer({**secure_config(security, "SCRAM-SHA-512"), "sasl.username": user, "sasl.password": password,
                      "acks": "all", "message.timeout.ms": 15000})
        # Partition 0 named: the watermark below reads that partition.
        p.produce(topic, value=b"v", partition=0, on_delivery=lambda err, msg: errors.append(err))
        p.flush(30)
        return errors[0] if errors else "no delivery report"

    assert produce_as(security["sasl_user"], security["sasl_password"]) is None
    refused = produce_as(security["other_user"], security["other_password"])
    assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, refused
    lo, hi = Consumer({**secure_config(security, "SCRAM-SHA-512"), "group.id": "x"}).get_watermark_offsets(
        TopicPartition(topic, 0), timeout=10)
    assert hi == 1, "only alice's record was written"

    described = admin.describe_acls(AclBindingFilter(ResourceType.TOPIC, topic, ResourcePatternType.MATCH, None, None,
                                                     AclOperation.ANY, AclPermissionType.ANY), request_timeout=30).result(timeout=30)
    assert sorted((b.name, b.resource_pattern_type, b.operation) for b in described) == sorted(
        (b.name, b.resource_pattern_type, b.operation) for b in bindings)
    deleted = admin.delete_acls([AclBindingFilter(ResourceType.TOPIC, None, ResourcePatternType.ANY, alice, None,
                                                  AclOperation.ANY, AclPermissionType.ANY)], request_timeout=30)
    gone = list(deleted.values())[0].result(timeout=30)
    assert len([b for b in gone if b.name in (branch, topic)]) == 3
    assert not admin.describe_acls(AclBindingFilter(ResourceType.TOPIC, topic, ResourcePatternType.MATCH, None, None,
                                                    AclOperation.ANY, AclPermissionType.ANY),
                                   request_timeout=30).result(timeout=30)
    # A user refused ALTER on the cluster may not create ACLs.
    with cluster_alter_denied(security, security["sasl_user"]):
        plain_admin = AdminClient(secure_config(security, "SCRAM-SHA-512"))
        with pytest.raises(KafkaException) as e:
            list(plain_admin.create_acls(bindings[:1], request_timeout=30).values())[0].result(timeout=30)
        assert e.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED


@pytest.mark.parametrize("what", ["expired", "forged"])
def test_oauthbearer_refuses_expired_and_forged_tokens(security, what, tmp_path):
    """An expired token, and one signed by a key the broker's JWKS does not
    hold, fail with the error librdkafka expects (the broker's RFC 7628
    error document), and nothing is served."""
    import subprocess
    from conftest import jwt
    if what == "expired":
        token = jwt(security["sasl_user"], lifetime_s=-3600)
    else:
        forger = tmp_path / "forger.key"
        subprocess.run(["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", str(forger)],
                       capture_output=True, check=True)
        token = jwt(security["sasl_user"], key=str(forger))
    errors = []
    cfg = {**secure_config(security, "OAUTHBEARER"), "oauth_cb": lambda _config: (token, time.time() + 3600),
           "error_cb": lambda e: errors.append(e)}
    admin = AdminClient(cfg)
    deadline = time.monotonic() + 30
    while not any(e.code() == KafkaError._AUTHENTICATION for e in errors):
        assert time.monotonic() < deadline, f"no authentication error; saw {errors}"
        admin.poll(0.2)
    failure = next(e for e in errors if e.code() == KafkaError._AUTHENTICATION)
    assert "invalid_token" in failure.str(), failure
    with pytest.raises(Exception):
        admin.list_topics(timeout=2)


def test_configs_retention_and_delete_records(bootstrap, admin):
    """incremental_alter_configs of retention.ms is visible in
    describe_configs as a dynamic topic config and takes effect without a
    restart (the broker runs retention every second in the suite: old data
    in sealed segments goes); bad input gets Kafka's errors; delete_records
    and list_offsets(max_timestamp) behave as in Kafka; a null key on a
    compacted topic is INVALID_RECORD for that record."""
    from confluent_kafka.admin import (AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource, OffsetSpec,
                                       ResourceType)
    name = unique_topic("ck_cfg")
    for f in admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1)],
                                 operation_timeout=10).values():
        f.result()
    resource = ConfigResource(ResourceType.TOPIC, name, incremental_configs=[
        ConfigEntry("retention.ms", "3600000", incremental_operation=AlterConfigOpType.SET)])
    for f in admin.incremental_alter_configs([resource]).values():
        f.result(timeout=20)
    [described] = admin.describe_configs([ConfigResource(ResourceType.TOPIC, name)]).values()
    entry = described.result(timeout=20)["retention.ms"]
    assert entry.value == "3600000" and entry.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value, entry

    # Bad input: each refused with Kafka's error, nothing changed.
    for key, value, code in [("retention.ms", "soon", KafkaError.INVALID_CONFIG),
                             ("no.such.config", "1", KafkaError.INVALID_CONFIG)]:
        bad = ConfigResource(ResourceType.TOPIC, name, incremental_configs=[
            ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)])
        with pytest.raises(KafkaException) as e:
            for f in admin.incremental_alter_configs([bad]).values():
                f.result(timeout=20)
        assert e.value.args[0].code() == code, (key, e.value)
    append = ConfigResource(ResourceType.TOPIC, name, incremental_configs=[
        ConfigEntry("retention.ms", "5", incremental_operation=AlterConfigOpType.APPEND)])
    with pytest.raises(KafkaException):
        for f in admin.incremental_alter_configs([append]).values():
            f.result(timeout=20)

    # Two hours old: kept by a day's retention, deleted by an hour's.
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "batch.size": 65536})
    old = int(time.time() * 1000) - 2 * 3600 * 1000
    for i in range(3000):
        producer.produce(name, key=b"k", value=b"x" * 1000, partition=0, timestamp=old + i)
    producer.flush(30)
    now = int(time.time() * 1000)
    for ts in (now, now + 5000, now + 1000):
        producer.produce(name, key=b"k", value=b"y", partition=0, timestamp=ts)
    producer.flush(30)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "ck-cfg-reader"})
    deadline = time.time() + 30
    low = 0
    while time.time() < deadline:
        low, high = consumer.get_watermark_offsets(TopicPartition(name, 0), timeout=10)
        if low > 0:
            break
        time.sleep(0.2)
    assert 0 < low < 3003, f"retention took the sealed old data: log start {low}"

    tp = TopicPartition(name, 0)
    [f] = admin.list_offsets({tp: OffsetSpec.max_timestamp()}).values()
    got = f.result(timeout=20)
    assert (got.offset, got.timestamp) == (3001, now + 5000), got

    [f] = admin.delete_records([TopicPartition(name, 0, 3002)]).values()
    assert f.result(timeout=20).low_watermark == 3002
    [f] = admin.delete_records([TopicPartition(name, 0, 9000)]).values()
    with pytest.raises(KafkaException) as e:
        f.result(timeout=20)
    assert e.value.args[0].code() == KafkaError.OFFSET_OUT_OF_RANGE, e.value
    assert consumer.get_watermark_offsets(tp, timeout=10)[0] == 3002
    consumer.close()

    compacted = unique_topic("ck_compacted")
    for f in admin.create_topics([NewTopic(compacted, num_partitions=1, replication_factor=1,
                                           config={"cleanup.policy": "compact"})], operation_timeout=10).values():
        f.result()
    reports = []
    producer.produce(compacted, value=b"no key", partition=0, on_delivery=lambda err, msg: reports.append(err))
    producer.flush(30)
    assert [r.code() if r else None for r in reports] == [KafkaError.INVALID_RECORD], reports
    producer.produce(compacted, key=b"k", value=b"keyed", partition=0, on_delivery=lambda err, msg: reports.append(err))
    producer.flush(30)
    assert reports[-1] is None


def _read_committed_from_zero(bootstrap, topic, partitions):
    """Every record of `topic` from offset 0 to its high watermark,
    read_committed: sorted (partition, offset, key, value)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique_topic("ck_clean_reader"),
                  "isolation.level": "read_committed", "enable.auto.commit": False,
                  "enable.partition.eof": True})
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        out, at_end = [], set()
        deadline = time.time() + 60
        while len(at_end) < partitions:
            assert time.time() < deadline, f"{topic}: no end of partitions"
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
                at_end.add(m.partition())
                continue
            out.append((m.partition(), m.offset(), m.key(), m.value()))
        return sorted(out)
    finally:
        c.close()


def test_compacted_topic_keeps_the_latest_value_per_key(bootstrap, admin):
    """100,000 updates over 1,000 keys to a cleanup.policy=compact topic,
    10,000 more in transactions (half of them aborted), then tombstones for
    100 keys; a busy sibling shares the branch. The suite's broker compacts
    and cleans every second: a read_committed reader from offset 0 then
    sees exactly the latest committed value of each live key at its
    original offset, and once delete.retention.ms has passed, no
    tombstone."""
    base = unique_topic("ck_clean")
    keyed, sibling = base + ".state", base + ".events"
    new = [NewTopic(keyed, num_partitions=3, replication_factor=1,
                    config={"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01",
                            "delete.retention.ms": "2000"}),
           NewTopic(sibling, num_partitions=1, replication_factor=1)]
    for f in admin.create_topics(new, operation_timeout=10).values():
        f.result()

    latest = {}  # (partition, key) -> (offset, value or None)

    def note(into):
        def cb(err, msg):
            assert err is None, err
            into[(msg.partition(), msg.key())] = (msg.offset(), msg.value())
        return cb

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "compression.type": "zstd",
                         "enable.idempotence": True})
    key = lambda k: b"key-%04d" % k
    for i in range(100_000):
        k = i % 1000
        producer.produce(keyed, key=key(k), value=b"v%06d" % i, partition=k % 3, on_delivery=note(latest))
        if i % 1000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0

    txn = Producer({"bootstrap.servers": bootstrap, "transactional.id": base + ".txn", "linger.ms": 5})
    txn.init_transactions(30)
    for t in range(10):
        written = {}
        txn.begin_transaction()
        for j in range(1000):
            k = (t * 37 + j * 7) % 1000
            txn.produce(keyed, key=key(k), value=b"txn%d-%d" % (t, j), partition=k % 3, on_delivery=note(written))
        assert txn.flush(30) == 0
        if t % 2 == 0:
            txn.commit_transaction(30)
            latest.update(written)
        else:
            txn.abort_transaction(30)

    for k in range(0, 1000, 10):
        producer.produce(keyed, key=key(k), value=None, partition=k % 3, on_delivery=note(latest))
    assert producer.flush(60) == 0
    # The sibling rolls the branch's 2 MiB segment (with bytes zstd cannot
    # shrink), so every keyed batch lies in a sealed segment the compactor
    # takes.
    filler = [os.urandom(1000) for _ in range(2600)]
    for v in filler:
        producer.produce(sibling, value=v, partition=0)
    assert producer.flush(60) == 0

    with_tombstones = sorted((p, o, k, v) for (p, k), (o, v) in latest.items())
    live = [r for r in with_tombstones if r[3] is not None]
    assert len(live) == 900
    deadline = time.time() + 120
    while True:
        got = _read_committed_from_zero(bootstrap, keyed, 3)
        if got == live:
            break
        # Cleaned once: the tombstones wait for their horizon.
        assert time.time() < deadline, f"not cleaned: {len(got)} records, {len(live)} live keys"
        time.sleep(1)
    # The sibling keeps every record.
    assert [r[3] for r in _read_committed_from_zero(bootstrap, sibling, 1)] == filler
