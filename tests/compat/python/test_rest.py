"""The REST bridge with Python `requests` and `curl`, read back by a
confluent-kafka consumer: REST Proxy v2 JSON and binary, gzip bodies, v3
single records, NDJSON through /ingest, and a few refusals.

The broker is started by run.sh, which passes REST=http://host:port.
"""
import base64
import gzip
import json
import os
import subprocess

import pytest
import requests
from confluent_kafka import Consumer, TopicPartition

from conftest import unique_topic

JSON = "application/vnd.kafka.json.v2+json"
BINARY = "application/vnd.kafka.binary.v2+json"


@pytest.fixture(scope="module")
def rest():
    url = os.environ.get("REST")
    if not url:
        pytest.fail("REST=http://host:port is not set (run via tests/compat/run.sh)")
    return url


def read_all(bootstrap, topic, partitions, n):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "compat-rest", "enable.auto.commit": False, "enable.partition.eof": False})
    c.assign([TopicPartition(topic, p, 0) for p in partitions])
    out = []
    for _ in range(600):
        m = c.poll(0.1)
        if m is not None and m.error() is None:
            out.append(m)
        if len(out) >= n:
            break
    assert c.poll(0.5) is None
    c.close()
    assert len(out) == n, f"read {len(out)} of {n}"
    return out


def test_v2_json_binary_and_gzip(rest, bootstrap):
    topic = unique_topic("rest")
    r = requests.post(f"{rest}/topics/{topic}", headers={"Content-Type": JSON}, data=json.dumps({"records": [{"value": {"i": i}, "partition": 0} for i in range(5)]}))
    assert r.status_code == 200, r.text
    assert [o["offset"] for o in r.json()["offsets"]] == [0, 1, 2, 3, 4]
    body = json.dumps({"records": [{"key": base64.b64encode(b"k").decode(), "value": base64.b64encode(b"\x00bin").decode(), "partition": 0}]}).encode()
    r = requests.post(f"{rest}/topics/{topic}", headers={"Content-Type": BINARY, "Content-Encoding": "gzip"}, data=gzip.compress(body))
    assert r.status_code == 200, r.text
    msgs = read_all(bootstrap, topic, [0], 6)
    assert [m.value() for m in msgs[:5]] == [json.dumps({"i": i}, separators=(",", ":")).encode() for i in range(5)]
    assert (msgs[5].key(), msgs[5].value()) == (b"k", b"\x00bin")


def test_refusals(rest):
    topic = unique_topic("rest")
    r = requests.post(f"{rest}/topics/{topic}", headers={"Content-Type": JSON}, data=b"{not json")
    assert (r.status_code, r.json()["error_code"]) == (400, 400)
    r = requests.post(f"{rest}/topics/{topic}", headers={"Content-Type": "application/vnd.kafka.avro.v2+json"}, data=b"{}")
    assert (r.status_code, r.json()["error_code"]) == (415, 415)
    r = requests.post(f"{rest}/topics/{topic}", headers={"Content-Type": BINARY}, data=json.dumps({"records": [{"value": "!!"}]}))
    assert (r.status_code, r.json()["error_code"]) == (422, 42206)
    assert "record 0" in r.json()["message"]


def test_v3_and_ndjson_with_curl(rest, bootstrap):
    topic = unique_topic("rest")
    cluster = requests.get(f"{rest}/v3/clusters").json()["data"][0]["cluster_id"]
    r = requests.post(f"{rest}/v3/clusters/{cluster}/topics/{topic}/records", json={"partition_id": 1, "value": {"type": "STRING", "data": "v3"}})
    assert (r.status_code, r.json()["offset"]) == (200, 0), r.text
    ndjson = "".join(json.dumps({"n": i}) + "\n" for i in range(100))
    out = subprocess.run(
        ["curl", "-sS", "-X", "POST", "-H", "Content-Type: application/x-ndjson", "--data-binary", "@-", f"{rest}/ingest/{topic.replace('.', '/')}"],
        input=ndjson.encode(), capture_output=True, check=True, timeout=60,
    )
    answer = json.loads(out.stdout)
    assert answer["count"] == 100 and answer["topic"] == topic, answer
    msgs = read_all(bootstrap, topic, [0, 1, 2], 101)
    values = sorted(m.value() for m in msgs)
    assert values == sorted([b"v3"] + [json.dumps({"n": i}).encode() for i in range(100)])
