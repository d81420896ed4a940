"""Kafka and REST traffic for the observability check: every dashboard
panel should then have a series. KAFKA and REST name the broker."""
import json
import os
import time
import urllib.error
import urllib.request

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.structs import OffsetAndMetadata

kafka = os.environ["KAFKA"]
rest = os.environ["REST"]

producer = KafkaProducer(bootstrap_servers=kafka, acks="all")
for i in range(200):
    producer.send("obs.kafka", key=b"k%d" % (i % 7), value=b"v%d" % i)
producer.flush()
producer.close()

consumer = KafkaConsumer("obs.kafka", bootstrap_servers=kafka, group_id="obs-group",
                         auto_offset_reset="earliest", enable_auto_commit=False)
seen = 0
deadline = time.time() + 60
while seen < 100 and time.time() < deadline:
    for _, records in consumer.poll(timeout_ms=500).items():
        seen += len(records)
assert seen >= 100, f"consumed {seen}"
# Commit half way, so the group has lag.
consumer.commit({TopicPartition("obs.kafka", 0): OffsetAndMetadata(100, None, -1)})
consumer.close()

# A fetch past the end: OFFSET_OUT_OF_RANGE from the broker.
stray = KafkaConsumer(bootstrap_servers=kafka, auto_offset_reset="earliest", enable_auto_commit=False)
tp = TopicPartition("obs.kafka", 0)
stray.assign([tp])
stray.seek(tp, 10_000)
stray.poll(timeout_ms=2000)
stray.close()


def post(path, body, ctype="application/json"):
    req = urllib.request.Request(rest + path, data=body, headers={"Content-Type": ctype}, method="POST")
    try:
        with urllib.request.urlopen(req) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


for i in range(50):
    assert post("/ingest/obs/rest", json.dumps({"i": i}).encode()) == 200
assert post("/ingest/obs/rest", b"\n".join(b'{"n":%d}' % i for i in range(20)), "application/x-ndjson") == 200
assert post("/ingest/obs/rest", json.dumps({"pad": "x" * 4096}).encode()) == 413
with urllib.request.urlopen(rest + "/topics") as r:
    assert r.status == 200

# Rates need two scrapes after the traffic.
time.sleep(4)
print("traffic done")
