//! The Fetch response, encoded by hand so record bytes are never copied.
//!
//! Everything but the records is small; the records are whole stored
//! batches, handed over as `Bytes` slices of the buffers storage read them
//! into. The encoder emits a list of parts — header bytes interleaved with
//! those slices — that the connection writes in order. Encoding the response
//! through `kafka-protocol` would copy every fetched byte once more into one
//! contiguous buffer (DESIGN.md: one copy of every fetched byte is
//! affordable, not three).
//!
//! Versions 4–18: topics are named up to 12 and addressed by id from 13
//! (KIP-516). The layout follows the Kafka schema; the test below checks
//! the output is byte-for-byte what `kafka-protocol` encodes for the same
//! response, the KIP-951 tagged fields included: a partition's
//! `CurrentLeader` (v12+, for NOT_LEADER_OR_FOLLOWER) and the response's
//! `NodeEndpoints` (v16+, the leaders it names).

use bytes::{BufMut, Bytes, BytesMut};

pub const MIN_VERSION: i16 = 4;
pub const MAX_VERSION: i16 = 18;

#[derive(Debug, Clone, Default)]
pub struct PartitionOut {
    pub partition: i32,
    pub error_code: i16,
    pub high_watermark: i64,
    pub last_stable_offset: i64,
    pub log_start_offset: i64,
    /// `Some(empty)` for read_committed fetches, `None` otherwise.
    pub aborted_transactions: Option<Vec<(i64, i64)>>,
    /// Concatenated, these are the partition's record bytes.
    pub records: Vec<Bytes>,
    /// (leader id, leader epoch): where the partition is led, for a
    /// NOT_LEADER_OR_FOLLOWER answer (v12+; (-1, -1), Kafka's default, is
    /// not written).
    pub current_leader: Option<(i32, i32)>,
}

/// A broker's address, for the response's `NodeEndpoints` (v16+).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Endpoint {
    pub node_id: i32,
    pub host: Bytes,
    pub port: i32,
    pub rack: Option<Bytes>,
}

#[derive(Debug, Clone, Default)]
pub struct TopicOut {
    /// Written up to v12.
    pub name: Bytes,
    /// Written from v13.
    pub id: [u8; 16],
    pub partitions: Vec<PartitionOut>,
}

/// Builds the framed response (length prefix, response header, body) as a
/// list of parts to write in order.
pub fn encode(correlation_id: i32, version: i16, throttle_ms: i32, error_code: i16, session_id: i32, topics: &[TopicOut]) -> Vec<Bytes> {
    encode_with(correlation_id, version, throttle_ms, error_code, session_id, topics, &[])
}

/// [`encode`], naming `endpoints` in the response (v16+).
pub fn encode_with(correlation_id: i32, version: i16, throttle_ms: i32, error_code: i16, session_id: i32, topics: &[TopicOut], endpoints: &[Endpoint]) -> Vec<Bytes> {
    assert!((MIN_VERSION..=MAX_VERSION).contains(&version), "fetch v{version} is not encoded here");
    let flexible = version >= 12;
    let mut w = Parts { parts: Vec::new(), cur: BytesMut::with_capacity(256) };
    w.cur.put_i32(0); // frame length, patched below
    w.cur.put_i32(correlation_id);
    if flexible {
        w.cur.put_u8(0); // response header tagged fields
    }
    w.cur.put_i32(throttle_ms);
    if version >= 7 {
        w.cur.put_i16(error_code);
        w.cur.put_i32(session_id);
    }
    w.array_len(topics.len(), flexible);
    for t in topics {
        if version >= 13 {
            w.cur.put_slice(&t.id);
        } else {
            w.string(&t.name, flexible);
        }
        w.array_len(t.partitions.len(), flexible);
        for p in &t.partitions {
            w.cur.put_i32(p.partition);
            w.cur.put_i16(p.error_code);
            w.cur.put_i64(p.high_watermark);
            w.cur.put_i64(p.last_stable_offset);
            if version >= 5 {
                w.cur.put_i64(p.log_start_offset);
            }
            match &p.aborted_transactions {
                None if flexible => w.cur.put_u8(0),
                None => w.cur.put_i32(-1),
                Some(list) => {
                    w.array_len(list.len(), flexible);
                    for (producer_id, first_offset) in list {
                        w.cur.put_i64(*producer_id);
                        w.cur.put_i64(*first_offset);
                        if flexible {
                            w.cur.put_u8(0);
                        }
                    }
                }
            }
            if version >= 11 {
                w.cur.put_i32(-1); // preferred_read_replica
            }
            let len: usize = p.records.iter().map(Bytes::len).sum();
            if flexible {
                put_uvarint(&mut w.cur, len as u64 + 1);
            } else {
                w.cur.put_i32(i32::try_from(len).expect("fetch responses stay under 2 GiB"));
            }
            for r in &p.records {
                w.splice(r.clone());
            }
            match p.current_leader.filter(|l| flexible && *l != (-1, -1)) {
                // One tagged field: tag 1, 9 bytes (two int32s, no tags).
                Some((leader, epoch)) => {
                    w.cur.put_slice(&[1, 1, 9]);
                    w.cur.put_i32(leader);
                    w.cur.put_i32(epoch);
                    w.cur.put_u8(0);
                }
                None if flexible => w.cur.put_u8(0),
                None => {}
            }
        }
        if flexible {
            w.cur.put_u8(0);
        }
    }
    if version >= 16 && !endpoints.is_empty() {
        // One tagged field: tag 0, the endpoint array.
        let mut data = BytesMut::new();
        put_uvarint(&mut data, endpoints.len() as u64 + 1);
        for e in endpoints {
            data.put_i32(e.node_id);
            put_uvarint(&mut data, e.host.len() as u64 + 1);
            data.put_slice(&e.host);
            data.put_i32(e.port);
            match &e.rack {
                Some(r) => {
                    put_uvarint(&mut data, r.len() as u64 + 1);
                    data.put_slice(r);
                }
                None => data.put_u8(0),
            }
            data.put_u8(0);
        }
        w.cur.put_slice(&[1, 0]);
        put_uvarint(&mut w.cur, data.len() as u64);
        w.cur.put_slice(&data);
    } else if flexible {
        w.cur.put_u8(0);
    }
    w.finish()
}

struct Parts {
    parts: Vec<Part>,
    cur: BytesMut,
}

enum Part {
    Own(BytesMut),
    Shared(Bytes),
}

impl Parts {
    fn array_len(&mut self, n: usize, flexible: bool) {
        if flexible {
            put_uvarint(&mut self.cur, n as u64 + 1);
        } else {
            self.cur.put_i32(n as i32);
        }
    }

    fn string(&mut self, s: &[u8], flexible: bool) {
        if flexible {
            put_uvarint(&mut self.cur, s.len() as u64 + 1);
        } else {
            self.cur.put_i16(s.len() as i16);
        }
        self.cur.put_slice(s);
    }

    /// Appends shared bytes without copying them. Small slices are copied:
    /// a separate write for a few bytes costs more than the copy.
    fn splice(&mut self, b: Bytes) {
        if b.len() < 4096 {
            self.cur.put_slice(&b);
            return;
        }
        let cur = std::mem::replace(&mut self.cur, BytesMut::with_capacity(128));
        self.parts.push(Part::Own(cur));
        self.parts.push(Part::Shared(b));
    }

    fn finish(mut self) -> Vec<Bytes> {
        let cur = std::mem::take(&mut self.cur);
        self.parts.push(Part::Own(cur));
        let total: usize = self.parts.iter().map(|p| match p { Part::Own(b) => b.len(), Part::Shared(b) => b.len() }).sum();
        let frame_len = i32::try_from(total - 4).expect("fetch responses stay under 2 GiB");
        let mut out = Vec::with_capacity(self.parts.len());
        for (i, p) in self.parts.into_iter().enumerate() {
            match p {
                Part::Own(mut b) => {
                    if i == 0 {
                        b[0..4].copy_from_slice(&frame_len.to_be_bytes());
                    }
                    if !b.is_empty() {
                        out.push(b.freeze());
                    }
                }
                Part::Shared(b) => out.push(b),
            }
        }
        out
    }
}

/// Appends `v` as an unsigned varint (flexible versions' lengths).
pub fn put_uvarint(b: &mut BytesMut, mut v: u64) {
    while v >= 0x80 {
        b.put_u8((v as u8) | 0x80);
        v >>= 7;
    }
    b.put_u8(v as u8);
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::fetch_response::{AbortedTransaction, FetchableTopicResponse, PartitionData};
    use kafka_protocol::messages::{FetchResponse, ResponseHeader, TopicName};
    use kafka_protocol::protocol::{Encodable, StrBytes};
    use proptest::prelude::*;

    fn reference(id: i32, version: i16, throttle_ms: i32, error_code: i16, session_id: i32, topics: &[TopicOut], endpoints: &[Endpoint]) -> Vec<u8> {
        use kafka_protocol::messages::fetch_response::{LeaderIdAndEpoch, NodeEndpoint};
        let text = |b: &Bytes| StrBytes::from_utf8(b.clone()).unwrap();
        let nodes = endpoints.iter().map(|e| NodeEndpoint::default().with_node_id(e.node_id.into()).with_host(text(&e.host)).with_port(e.port).with_rack(e.rack.as_ref().map(text))).collect();
        let resp = FetchResponse::default()
            .with_node_endpoints(if version >= 16 { nodes } else { Vec::new() }).with_throttle_time_ms(throttle_ms).with_error_code(error_code).with_session_id(session_id).with_responses(
            topics
                .iter()
                .map(|t| {
                    FetchableTopicResponse::default()
                        .with_topic(if version >= 13 { TopicName::default() } else { TopicName(StrBytes::from_utf8(t.name.clone()).unwrap()) })
                        .with_topic_id(if version >= 13 { uuid::Uuid::from_bytes(t.id) } else { Default::default() })
                        .with_partitions(
                            t.partitions
                                .iter()
                                .map(|p| {
                                    let mut records = Vec::new();
                                    for r in &p.records {
                                        records.extend_from_slice(r);
                                    }
                                    PartitionData::default()
                                        .with_partition_index(p.partition)
                                        .with_error_code(p.error_code)
                                        .with_high_watermark(p.high_watermark)
                                        .with_last_stable_offset(p.last_stable_offset)
                                        .with_log_start_offset(if version >= 5 { p.log_start_offset } else { -1 })
                                        .with_aborted_transactions(p.aborted_transactions.as_ref().map(|l| {
                                            l.iter().map(|(a, b)| AbortedTransaction::default().with_producer_id((*a).into()).with_first_offset(*b)).collect()
                                        }))
                                        .with_records(Some(Bytes::from(records)))
                                        .with_current_leader(match p.current_leader.filter(|_| version >= 12) {
                                            Some((l, e)) => LeaderIdAndEpoch::default().with_leader_id(l.into()).with_leader_epoch(e),
                                            None => LeaderIdAndEpoch::default(),
                                        })
                                })
                                .collect(),
                        )
                })
                .collect(),
        );
        let mut b = BytesMut::new();
        b.put_i32(0);
        ResponseHeader::default().with_correlation_id(id).encode(&mut b, if version >= 12 { 1 } else { 0 }).unwrap();
        resp.encode(&mut b, version).unwrap();
        let n = (b.len() - 4) as i32;
        b[0..4].copy_from_slice(&n.to_be_bytes());
        b.to_vec()
    }

    fn arb_topics() -> impl Strategy<Value = Vec<TopicOut>> {
        let part = (
            any::<i32>(),
            any::<i16>(),
            any::<i64>(),
            any::<i64>(),
            any::<i64>(),
            proptest::option::of(proptest::collection::vec((any::<i64>(), any::<i64>()), 0..3)),
            proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..6000), 0..3),
            proptest::option::of((-1..5i32, -1..5i32)),
        )
            .prop_map(|(partition, error_code, hw, lso, ls, aborted, recs, current_leader)| PartitionOut {
                partition,
                error_code,
                high_watermark: hw,
                last_stable_offset: lso,
                log_start_offset: ls,
                aborted_transactions: aborted,
                records: recs.into_iter().map(Bytes::from).collect(),
                current_leader,
            });
        proptest::collection::vec(
            ("[a-z.]{0,20}", any::<[u8; 16]>(), proptest::collection::vec(part, 0..3)).prop_map(|(name, id, partitions)| TopicOut { name: Bytes::from(name), id, partitions }),
            0..3,
        )
    }

    fn arb_endpoints() -> impl Strategy<Value = Vec<Endpoint>> {
        proptest::collection::vec(
            (any::<i32>(), "[a-z0-9.]{0,30}", any::<i32>(), proptest::option::of("[a-z0-9-]{0,10}"))
                .prop_map(|(node_id, host, port, rack)| Endpoint { node_id, host: Bytes::from(host), port, rack: rack.map(Bytes::from) }),
            0..3,
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        #[test]
        fn matches_kafka_protocol_byte_for_byte(id in any::<i32>(), version in MIN_VERSION..=MAX_VERSION, throttle in any::<i32>(), err in any::<i16>(), session in any::<i32>(), topics in arb_topics(), endpoints in arb_endpoints()) {
            let (err, session) = if version >= 7 { (err, session) } else { (0, 0) };
            let ours: Vec<u8> = encode_with(id, version, throttle, err, session, &topics, &endpoints).iter().flat_map(|b| b.iter().copied()).collect();
            prop_assert_eq!(ours, reference(id, version, throttle, err, session, &topics, &endpoints));
        }
    }
}
