"""kafka-python (pure-Python client) against Canopy.

Covers: KafkaAdminClient.create_topics / describe_topics / describe_cluster,
KafkaProducer (keys + headers, acks=all, idempotence off: Canopy has no
InitProducerId yet), KafkaConsumer by explicit assign() + seek_to_beginning()
(no group: Canopy has no group coordinator yet; group_id=None, so no offset
commits), beginning/end offsets (ListOffsets) and metadata.
"""
import time

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition

from conftest import N_PARTITIONS, N_RECORDS, check_acks, check_read_back, record, unique_topic


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


@pytest.fixture(scope="module")
def delivered(bootstrap, topic):
    """Produce N_RECORDS keyed records with headers; returns {key: (partition, offset)}."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, client_id="compat-kafka-python-producer",
                             acks="all", enable_idempotence=False, linger_ms=5,
                             max_in_flight_requests_per_connection=1, request_timeout_ms=20000)
    try:
        futures = []
        for i in range(N_RECORDS):
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


def test_create_topic_visible(admin, topic):
    [t] = admin.describe_topics([topic])
    assert t["name"] == topic and t["error_code"] == 0, t
    assert sorted(p["partition_index"] for p in t["partitions"]) == list(range(N_PARTITIONS)), t
    assert topic in admin.list_topics()


def test_produce_acks(delivered):
    check_acks(delivered)


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
