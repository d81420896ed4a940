"""Shared helpers for the Python client compatibility tests.

The broker is started by tests/compat/run.sh, which passes its Kafka address
in BOOTSTRAP=host:port. Without it the tests fail (never skip): a compat run
that silently tested nothing would look green.
"""
import os
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
