"""kafka-python against a Canopy cluster (run by the cluster harness,
tests/it/cluster/clients.rs, not by pytest).

    python cluster_client.py BOOTSTRAP TOPIC COUNT GROUP

Bootstrapping from the one broker it is given, it produces COUNT records
(keys and values `py<i>`) with acks=all, reads them back in consumer
group GROUP from the earliest offset, commits, and reads the commits
back. Prints one JSON line: every record's (partition, offset) as
acknowledged, as read, and the group's committed offsets. Exits non-zero
on any failure.
"""
import json
import sys
import time

from kafka import KafkaConsumer, KafkaProducer, TopicPartition


def main():
    boot, topic, count, group = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    producer = KafkaProducer(bootstrap_servers=boot, acks="all", retries=20, retry_backoff_ms=200, request_timeout_ms=30000)
    futures = [(i, producer.send(topic, key=f"py{i}".encode(), value=f"py{i}".encode())) for i in range(count)]
    acked = {}
    for i, f in futures:
        m = f.get(timeout=60)
        acked[f"py{i}"] = [m.partition, m.offset]
    producer.close()

    consumer = KafkaConsumer(topic, bootstrap_servers=boot, group_id=group, auto_offset_reset="earliest", enable_auto_commit=False)
    read = {}
    deadline = time.time() + 90
    while len(read) < count:
        if time.time() > deadline:
            sys.exit(f"read {len(read)} of {count} records in 90 s")
        for tp, messages in consumer.poll(timeout_ms=500).items():
            for m in messages:
                if m.value.decode().startswith("py"):
                    read[m.value.decode()] = [tp.partition, m.offset]
    consumer.commit()
    committed = {}
    for p in sorted(consumer.partitions_for_topic(topic)):
        committed[str(p)] = consumer.committed(TopicPartition(topic, p))
    consumer.close()
    print(json.dumps({"acked": acked, "read": read, "committed": committed}))


if __name__ == "__main__":
    main()
