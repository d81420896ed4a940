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
//! response, the tagged fields included: a partition's `DivergingEpoch`
//! (v12+, KIP-320: where a follower must truncate its log) and
//! `CurrentLeader` (v12+, KIP-951: for NOT_LEADER_OR_FOLLOWER), and the
//! response's `NodeEndpoints` (v16+, the leaders it names).
//!
//! [`decode_response`] is the other side, for a follower replicating from a
//! leader: it reads a flexible (v12+) response from the network without
//! trusting a single count or length in it, and hands the records back as
//! slices of the buffer they arrived in, so they are not copied either.

use bytes::{BufMut, Bytes, BytesMut};

pub use super::response::DecodeError;
use super::response::{Reader, TAGGED_FIELD_MIN_BYTES};

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
    /// (epoch, end offset): the last epoch of the leader's log at or before
    /// the epoch the follower says it last fetched, and where that epoch
    /// ends. A follower whose log goes on past it truncates there before
    /// fetching again (KIP-320). Tagged field 0 (v12+; (-1, -1), Kafka's
    /// default, is not written).
    pub diverging_epoch: Option<(i32, i64)>,
    /// (leader id, leader epoch): where the partition is led, for a
    /// NOT_LEADER_OR_FOLLOWER answer. Tagged field 1 (v12+; (-1, -1),
    /// Kafka's default, is not written).
    pub current_leader: Option<(i32, i32)>,
}

/// Bytes of a written `DivergingEpoch` (EpochEndOffset): int32 epoch, int64
/// end offset, its own empty tagged-field section.
const EPOCH_END_OFFSET_BYTES: u8 = 4 + 8 + 1;
/// Bytes of a written `CurrentLeader` (LeaderIdAndEpoch): two int32s, an
/// empty tagged-field section.
const LEADER_ID_AND_EPOCH_BYTES: u8 = 4 + 4 + 1;
// Both sizes are written as one-byte varints below.
const _: () = assert!(EPOCH_END_OFFSET_BYTES < 0x80 && LEADER_ID_AND_EPOCH_BYTES < 0x80);

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
            if flexible {
                // The partition's tagged fields: their count, then each in
                // ascending tag order as (tag, size, value). A field at
                // Kafka's default is left out, as Kafka's own encoder does.
                let diverging = p.diverging_epoch.filter(|d| *d != (-1, -1));
                let leader = p.current_leader.filter(|l| *l != (-1, -1));
                w.cur.put_u8(u8::from(diverging.is_some()) + u8::from(leader.is_some()));
                if let Some((epoch, end_offset)) = diverging {
                    w.cur.put_slice(&[0, EPOCH_END_OFFSET_BYTES]);
                    w.cur.put_i32(epoch);
                    w.cur.put_i64(end_offset);
                    w.cur.put_u8(0);
                }
                if let Some((leader, epoch)) = leader {
                    w.cur.put_slice(&[1, LEADER_ID_AND_EPOCH_BYTES]);
                    w.cur.put_i32(leader);
                    w.cur.put_i32(epoch);
                    w.cur.put_u8(0);
                }
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

// ---------------------------------------------------------------------------
// Decoding: the follower's side of replication.
// ---------------------------------------------------------------------------

/// The first version [`decode_response`] reads. Followers always ask for a
/// flexible version, so the older, fixed-width layouts are not decoded.
pub const FIRST_DECODED_VERSION: i16 = 12;

/// A leader's Fetch response (v12+), as a follower reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FetchAnswer {
    pub correlation_id: i32,
    pub throttle_ms: i32,
    pub error_code: i16,
    pub session_id: i32,
    /// As sent. Neither topics nor partitions are checked for repeats here:
    /// Kafka itself may name a topic twice (it starts a new topic entry
    /// whenever the topic changes while walking its session's partitions),
    /// so the caller matches each partition against what it asked for and
    /// refuses a partition it did not ask for or already has.
    pub topics: Vec<TopicIn>,
}

/// One topic of a [`FetchAnswer`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopicIn {
    /// The topic's name (v12, checked to be UTF-8); empty from v13.
    pub name: Bytes,
    /// The topic's id (v13+); all zeros in v12.
    pub id: [u8; 16],
    pub partitions: Vec<PartitionIn>,
}

/// One partition of a [`TopicIn`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PartitionIn {
    pub partition: i32,
    pub error_code: i16,
    pub high_watermark: i64,
    pub last_stable_offset: i64,
    pub log_start_offset: i64,
    /// (producer id, first offset); a null list reads as empty.
    pub aborted_transactions: Vec<(i64, i64)>,
    pub preferred_read_replica: i32,
    /// The record bytes, a slice of the response buffer (never copied);
    /// null reads as empty. Not parsed here: the follower validates the
    /// batches as it would a producer's before appending them.
    pub records: Bytes,
    /// (epoch, end offset) where the follower must truncate (tagged field
    /// 0); absent or Kafka's default (-1, -1) reads as `None`.
    pub diverging_epoch: Option<(i32, i64)>,
    /// (leader id, leader epoch) (tagged field 1); absent or (-1, -1) reads
    /// as `None`.
    pub current_leader: Option<(i32, i32)>,
}

// The fewest bytes each repeated element can take on the wire (v12+). A
// count is admitted only if that many elements of this size fit in what
// remains, so what a `Vec::with_capacity` reserves stays within a small
// multiple of the body's length, whatever the count says.
// `minimum_sizes_are_the_smallest_encodings` checks them against the encoder.

/// Producer id, first offset, empty tagged fields.
const ABORTED_MIN_BYTES: usize = 8 + 8 + 1;
/// Index, error, three offsets, null aborted list, preferred read replica,
/// null records, empty tagged fields.
const PARTITION_MIN_BYTES: usize = 4 + 2 + 8 + 8 + 8 + 1 + 4 + 1 + 1;
/// v12: empty name, no partitions, empty tagged fields.
const NAMED_TOPIC_MIN_BYTES: usize = 1 + 1 + 1;
/// v13+: id, no partitions, empty tagged fields.
const TOPIC_MIN_BYTES: usize = 16 + 1 + 1;
const _: () = assert!(TAGGED_FIELD_MIN_BYTES > 0 && ABORTED_MIN_BYTES > 0 && PARTITION_MIN_BYTES > 0 && NAMED_TOPIC_MIN_BYTES > 0 && TOPIC_MIN_BYTES > 0);

/// Decodes a Fetch response of `version` (12..=18) from `body`, the bytes
/// after the 4-byte frame length: correlation id, the response header's
/// tagged fields, then the response.
///
/// `body` comes from the network and is treated as hostile: every varint,
/// count and length is checked against the bytes that remain before
/// anything is reserved or sliced, a varint past five bytes or `u32` is
/// refused, a known tagged field must fill exactly the size it declares,
/// tags must ascend (KIP-482), and bytes left after the response are an
/// error. Unknown tagged fields are skipped by their declared size; so are
/// the response's `NodeEndpoints` (tag 0, v16+), since a follower learns
/// where brokers are from the cluster, not from a leader's answer. Work and
/// memory are linear in `body.len()`. `kafka-protocol`'s decoder was not
/// used: it reserves whatever count the wire claims before reading an
/// element (see `guard`), and ignores a tagged field's declared size.
pub fn decode_response(version: i16, body: &Bytes) -> Result<FetchAnswer, DecodeError> {
    if !(FIRST_DECODED_VERSION..=MAX_VERSION).contains(&version) {
        return Err(DecodeError::UnsupportedVersion { api: "fetch", version });
    }
    let mut r = Reader::new(body);
    let correlation_id = r.i32("correlation id")?;
    r.tagged_fields("response header", |_, _| Ok(false))?;
    let throttle_ms = r.i32("throttle time")?;
    let error_code = r.i16("error code")?;
    let session_id = r.i32("session id")?;
    let min_topic = if version >= 13 { TOPIC_MIN_BYTES } else { NAMED_TOPIC_MIN_BYTES };
    let n = r.required_count("topics", min_topic)?;
    let mut topics = Vec::with_capacity(n);
    for _ in 0..n {
        topics.push(r.topic(version)?);
    }
    r.tagged_fields("response", |_, _| Ok(false))?;
    if r.remaining() > 0 {
        return Err(DecodeError::TrailingBytes { at: r.pos, count: r.remaining() });
    }
    Ok(FetchAnswer { correlation_id, throttle_ms, error_code, session_id, topics })
}

impl<'a> Reader<'a> {
    fn topic(&mut self, version: i16) -> Result<TopicIn, DecodeError> {
        let (mut name, mut id) = (Bytes::new(), [0; 16]);
        if version >= 13 {
            id = self.fixed("topic id")?;
        } else {
            let at = self.pos;
            name = self.bytes("topic name")?.ok_or(DecodeError::UnexpectedNull { what: "topic name", at })?;
            if std::str::from_utf8(&name).is_err() {
                return Err(DecodeError::NotUtf8 { what: "topic name", at });
            }
        }
        let n = self.required_count("partitions", PARTITION_MIN_BYTES)?;
        let mut partitions = Vec::with_capacity(n);
        for _ in 0..n {
            partitions.push(self.partition()?);
        }
        self.tagged_fields("topic", |_, _| Ok(false))?;
        Ok(TopicIn { name, id, partitions })
    }

    fn partition(&mut self) -> Result<PartitionIn, DecodeError> {
        let partition = self.i32("partition index")?;
        let error_code = self.i16("partition error code")?;
        let high_watermark = self.i64("high watermark")?;
        let last_stable_offset = self.i64("last stable offset")?;
        let log_start_offset = self.i64("log start offset")?;
        let mut aborted_transactions = Vec::new();
        if let Some(n) = self.count("aborted transactions", ABORTED_MIN_BYTES)? {
            aborted_transactions.reserve_exact(n);
            for _ in 0..n {
                let producer_id = self.i64("aborted producer id")?;
                let first_offset = self.i64("aborted first offset")?;
                self.tagged_fields("aborted transaction", |_, _| Ok(false))?;
                aborted_transactions.push((producer_id, first_offset));
            }
        }
        let preferred_read_replica = self.i32("preferred read replica")?;
        let records = self.bytes("records")?.unwrap_or_default();
        let (mut diverging_epoch, mut current_leader) = (None, None);
        self.tagged_fields("partition", |tag, field| match tag {
            0 => {
                let epoch = field.i32("diverging epoch")?;
                let end_offset = field.i64("diverging end offset")?;
                field.tagged_fields("diverging epoch", |_, _| Ok(false))?;
                diverging_epoch = Some((epoch, end_offset)).filter(|d| *d != (-1, -1));
                Ok(true)
            }
            1 => {
                let leader = field.i32("current leader id")?;
                let epoch = field.i32("current leader epoch")?;
                field.tagged_fields("current leader", |_, _| Ok(false))?;
                current_leader = Some((leader, epoch)).filter(|l| *l != (-1, -1));
                Ok(true)
            }
            // SnapshotId (2) is for KRaft's metadata log, not ours.
            _ => Ok(false),
        })?;
        Ok(PartitionIn { partition, error_code, high_watermark, last_stable_offset, log_start_offset, aborted_transactions, preferred_read_replica, records, diverging_epoch, current_leader })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::fetch_response::{AbortedTransaction, FetchableTopicResponse, PartitionData};
    use kafka_protocol::messages::{FetchResponse, ResponseHeader, TopicName};
    use kafka_protocol::protocol::{Encodable, StrBytes};
    use proptest::prelude::*;

    fn reference(id: i32, version: i16, throttle_ms: i32, error_code: i16, session_id: i32, topics: &[TopicOut], endpoints: &[Endpoint]) -> Vec<u8> {
        use kafka_protocol::messages::fetch_response::{EpochEndOffset, LeaderIdAndEpoch, NodeEndpoint};
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
                                        .with_diverging_epoch(match p.diverging_epoch.filter(|_| version >= 12) {
                                            Some((e, o)) => EpochEndOffset::default().with_epoch(e).with_end_offset(o),
                                            None => EpochEndOffset::default(),
                                        })
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
        arb_topics_up_to(6000)
    }

    /// Topics whose partitions each have up to three record slices of
    /// fewer than `record_bytes` bytes.
    fn arb_topics_up_to(record_bytes: usize) -> impl Strategy<Value = Vec<TopicOut>> {
        let part = (
            any::<i32>(),
            any::<i16>(),
            any::<i64>(),
            any::<i64>(),
            any::<i64>(),
            proptest::option::of(proptest::collection::vec((any::<i64>(), any::<i64>()), 0..3)),
            proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..record_bytes), 0..3),
            // (-1, -1) is Kafka's default, which neither side writes.
            proptest::option::of((-1..5i32, prop_oneof![-1..5i64, any::<i64>()])),
            proptest::option::of((-1..5i32, -1..5i32)),
        )
            .prop_map(|(partition, error_code, hw, lso, ls, aborted, recs, diverging_epoch, current_leader)| PartitionOut {
                partition,
                error_code,
                high_watermark: hw,
                last_stable_offset: lso,
                log_start_offset: ls,
                aborted_transactions: aborted,
                records: recs.into_iter().map(Bytes::from).collect(),
                diverging_epoch,
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

    // --- decode_response ---

    /// The body of a framed response: everything after the frame length.
    fn body_of(parts: &[Bytes]) -> Bytes {
        Bytes::from(parts.concat()).slice(4..)
    }

    /// What a follower should read back from the response `encode_with`
    /// (or `reference`) writes for these arguments.
    fn expected(id: i32, version: i16, throttle_ms: i32, error_code: i16, session_id: i32, topics: &[TopicOut]) -> FetchAnswer {
        let topics = topics
            .iter()
            .map(|t| TopicIn {
                name: if version >= 13 { Bytes::new() } else { t.name.clone() },
                id: if version >= 13 { t.id } else { [0; 16] },
                partitions: t
                    .partitions
                    .iter()
                    .map(|p| PartitionIn {
                        partition: p.partition,
                        error_code: p.error_code,
                        high_watermark: p.high_watermark,
                        last_stable_offset: p.last_stable_offset,
                        log_start_offset: p.log_start_offset,
                        aborted_transactions: p.aborted_transactions.clone().unwrap_or_default(),
                        preferred_read_replica: -1,
                        records: Bytes::from(p.records.concat()),
                        diverging_epoch: p.diverging_epoch.filter(|d| *d != (-1, -1)),
                        current_leader: p.current_leader.filter(|l| *l != (-1, -1)),
                    })
                    .collect(),
            })
            .collect();
        FetchAnswer { correlation_id: id, throttle_ms, error_code, session_id, topics }
    }

    /// A v13 body up to and including a topic count of `topics` (the count
    /// as written: entries + 1).
    fn head(topics: u64) -> BytesMut {
        let mut b = BytesMut::new();
        b.put_i32(7); // correlation id
        b.put_u8(0); // header tags
        b.put_i32(0); // throttle
        b.put_i16(0); // error
        b.put_i32(0); // session
        put_uvarint(&mut b, topics);
        b
    }

    /// A v13 body up to and including one partition's fixed-size fields.
    fn head_of_partition() -> BytesMut {
        let mut b = head(2);
        b.put_slice(&[9; 16]); // topic id
        b.put_u8(2); // one partition
        b.put_i32(0);
        b.put_i16(0);
        b.put_i64(10);
        b.put_i64(10);
        b.put_i64(0);
        b
    }

    /// A v13 response of one topic with one empty partition whose tagged
    /// field section is `tags` (count included).
    fn one_partition(tags: &[u8]) -> Bytes {
        let mut b = head_of_partition();
        b.put_u8(0); // null aborted transactions
        b.put_i32(-1); // preferred read replica
        b.put_u8(1); // empty records
        b.put_slice(tags);
        b.put_u8(0); // topic tags
        b.put_u8(0); // response tags
        b.freeze()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(100))]
        #[test]
        fn decodes_what_kafka_protocol_and_we_encode(id in any::<i32>(), version in FIRST_DECODED_VERSION..=MAX_VERSION, throttle in any::<i32>(), err in any::<i16>(), session in any::<i32>(), topics in arb_topics(), endpoints in arb_endpoints()) {
            let want = expected(id, version, throttle, err, session, &topics);
            let theirs = Bytes::from(reference(id, version, throttle, err, session, &topics, &endpoints)).slice(4..);
            prop_assert_eq!(decode_response(version, &theirs), Ok(want.clone()));
            let ours = body_of(&encode_with(id, version, throttle, err, session, &topics, &endpoints));
            prop_assert_eq!(decode_response(version, &ours), Ok(want));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        #[test]
        fn every_truncation_is_an_error(version in FIRST_DECODED_VERSION..=MAX_VERSION, topics in arb_topics_up_to(40), endpoints in arb_endpoints()) {
            let full = body_of(&encode_with(1, version, 0, 0, 0, &topics, &endpoints));
            prop_assert!(decode_response(version, &full).is_ok());
            for len in 0..full.len() {
                prop_assert!(decode_response(version, &full.slice(..len)).is_err(), "a {}-byte prefix of {} decoded", len, full.len());
            }
        }

        #[test]
        fn random_bytes_never_panic(version in 10i16..20, bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = decode_response(version, &Bytes::from(bytes));
        }

        #[test]
        fn damaged_responses_never_panic(version in FIRST_DECODED_VERSION..=MAX_VERSION, topics in arb_topics_up_to(40), endpoints in arb_endpoints(), damage in proptest::collection::vec((any::<proptest::sample::Index>(), any::<u8>()), 1..5)) {
            let mut b = encode_with(1, version, 0, 0, 0, &topics, &endpoints).concat().split_off(4);
            for (at, byte) in damage {
                let at = at.index(b.len());
                b[at] = byte;
            }
            let _ = decode_response(version, &Bytes::from(b));
        }
    }

    #[test]
    fn huge_counts_and_lengths_in_a_tiny_body_are_refused() {
        let decode = |b: BytesMut| decode_response(13, &b.freeze());
        for claimed in [0x8000_0000u64, u64::from(u32::MAX)] {
            assert!(matches!(decode(head(claimed)), Err(DecodeError::CountTooLarge { what: "topics", count, .. }) if count == claimed - 1));
        }

        let mut b = head(2);
        b.put_slice(&[9; 16]);
        put_uvarint(&mut b, 0x8000_0000);
        assert!(matches!(decode(b), Err(DecodeError::CountTooLarge { what: "partitions", count: 0x7fff_ffff, .. })));

        let mut b = head_of_partition();
        put_uvarint(&mut b, 0x8000_0000);
        b.put_slice(&[0; 8]); // room for the one partition the topic claims
        assert!(matches!(decode(b), Err(DecodeError::CountTooLarge { what: "aborted transactions", count: 0x7fff_ffff, .. })));

        let mut b = head_of_partition();
        b.put_u8(0);
        b.put_i32(-1);
        put_uvarint(&mut b, u64::from(u32::MAX));
        assert!(matches!(decode(b), Err(DecodeError::Truncated { what: "records", needed, .. }) if needed == u64::from(u32::MAX - 1)));

        // Tagged fields: a huge count, and a huge declared size.
        let mut b = BytesMut::new();
        b.put_i32(7);
        put_uvarint(&mut b, 0x7fff_ffff);
        assert!(matches!(decode(b), Err(DecodeError::CountTooLarge { what: "response header", .. })));
        let mut b = BytesMut::new();
        b.put_i32(7);
        b.put_slice(&[1, 5]);
        put_uvarint(&mut b, u64::from(u32::MAX));
        assert!(matches!(decode(b), Err(DecodeError::Truncated { what: "response header", .. })));

        // v12's topic name.
        let mut b = head(2);
        put_uvarint(&mut b, u64::from(u32::MAX));
        assert!(matches!(decode_response(12, &b.freeze()), Err(DecodeError::Truncated { what: "topic name", .. })));
    }

    #[test]
    fn varints_past_five_bytes_or_u32_are_refused() {
        // 2^32: five bytes, but past u32.
        let mut b = head(0);
        b.truncate(b.len() - 1);
        b.put_slice(&[0x80, 0x80, 0x80, 0x80, 0x10]);
        assert!(matches!(decode_response(13, &b.freeze()), Err(DecodeError::BadVarint { what: "topics", .. })));
        // Six bytes, even for a small value.
        let mut b = head(0);
        b.truncate(b.len() - 1);
        b.put_slice(&[0x81, 0x80, 0x80, 0x80, 0x80, 0x00]);
        assert!(matches!(decode_response(13, &b.freeze()), Err(DecodeError::BadVarint { what: "topics", .. })));
        // u32::MAX itself is a varint; as a count it is simply too large.
        let mut b = head(0);
        b.truncate(b.len() - 1);
        b.put_slice(&[0xff, 0xff, 0xff, 0xff, 0x0f]);
        assert!(matches!(decode_response(13, &b.freeze()), Err(DecodeError::CountTooLarge { .. })));
    }

    #[test]
    fn trailing_bytes_are_an_error() {
        let topics = [TopicOut { name: Bytes::from_static(b"t"), id: [3; 16], partitions: vec![PartitionOut { records: vec![Bytes::from_static(b"abc")], ..Default::default() }] }];
        for version in FIRST_DECODED_VERSION..=MAX_VERSION {
            let mut b = encode(1, version, 0, 0, 0, &topics).concat().split_off(4);
            assert!(decode_response(version, &Bytes::from(b.clone())).is_ok());
            b.push(0);
            let len = b.len();
            assert_eq!(decode_response(version, &Bytes::from(b)), Err(DecodeError::TrailingBytes { at: len - 1, count: 1 }));
        }
    }

    #[test]
    fn unknown_tagged_fields_are_skipped() {
        use kafka_protocol::messages::fetch_response::{EpochEndOffset, LeaderIdAndEpoch, NodeEndpoint, SnapshotId};
        for version in FIRST_DECODED_VERSION..=MAX_VERSION {
            let partition = PartitionData::default()
                .with_partition_index(3)
                .with_high_watermark(10)
                .with_last_stable_offset(9)
                .with_log_start_offset(1)
                .with_aborted_transactions(Some(vec![AbortedTransaction::default().with_producer_id(5.into()).with_first_offset(6).with_unknown_tagged_field(1, Bytes::from_static(b"tx"))]))
                .with_records(Some(Bytes::from_static(b"records")))
                .with_diverging_epoch(EpochEndOffset::default().with_epoch(2).with_end_offset(40).with_unknown_tagged_field(5, Bytes::from_static(b"inner")))
                .with_current_leader(LeaderIdAndEpoch::default().with_leader_id(1.into()).with_leader_epoch(3).with_unknown_tagged_field(0, Bytes::from_static(b"x")))
                .with_snapshot_id(SnapshotId::default().with_end_offset(8).with_epoch(1))
                .with_unknown_tagged_field(7, Bytes::from_static(b"partition"));
            let topic = FetchableTopicResponse::default()
                .with_topic(if version >= 13 { TopicName::default() } else { TopicName(StrBytes::from_static_str("t")) })
                .with_topic_id(if version >= 13 { uuid::Uuid::from_bytes([4; 16]) } else { Default::default() })
                .with_partitions(vec![partition])
                .with_unknown_tagged_field(4, Bytes::from_static(b"topic"));
            let endpoints = if version >= 16 { vec![NodeEndpoint::default().with_node_id(1.into()).with_host(StrBytes::from_static_str("h")).with_port(9092)] } else { Vec::new() };
            let resp = FetchResponse::default().with_throttle_time_ms(5).with_session_id(9).with_responses(vec![topic]).with_node_endpoints(endpoints).with_unknown_tagged_field(9, Bytes::from_static(b"response"));
            let mut b = BytesMut::new();
            ResponseHeader::default().with_correlation_id(11).with_unknown_tagged_field(3, Bytes::from_static(b"header")).encode(&mut b, 1).unwrap();
            resp.encode(&mut b, version).unwrap();

            let want = FetchAnswer {
                correlation_id: 11,
                throttle_ms: 5,
                error_code: 0,
                session_id: 9,
                topics: vec![TopicIn {
                    name: if version >= 13 { Bytes::new() } else { Bytes::from_static(b"t") },
                    id: if version >= 13 { [4; 16] } else { [0; 16] },
                    partitions: vec![PartitionIn {
                        partition: 3,
                        error_code: 0,
                        high_watermark: 10,
                        last_stable_offset: 9,
                        log_start_offset: 1,
                        aborted_transactions: vec![(5, 6)],
                        preferred_read_replica: -1,
                        records: Bytes::from_static(b"records"),
                        diverging_epoch: Some((2, 40)),
                        current_leader: Some((1, 3)),
                    }],
                }],
            };
            assert_eq!(decode_response(version, &b.freeze()), Ok(want), "v{version}");
        }
    }

    #[test]
    fn a_known_tagged_field_must_fill_its_declared_size() {
        let epoch = |size: u8, extra: &[u8]| {
            let mut tags = vec![1, 0, size];
            tags.extend_from_slice(&2i32.to_be_bytes());
            tags.extend_from_slice(&40i64.to_be_bytes());
            tags.push(0);
            tags.extend_from_slice(extra);
            one_partition(&tags)
        };
        let answer = decode_response(13, &epoch(13, &[])).unwrap();
        assert_eq!(answer.topics[0].partitions[0].diverging_epoch, Some((2, 40)));
        // Declared one byte longer than its value (the byte is there).
        assert!(matches!(decode_response(13, &epoch(14, &[0xff])), Err(DecodeError::TaggedFieldSize { tag: 0, declared: 14, used: 13, .. })));
        // Declared one byte shorter: its value may not run past it.
        assert!(matches!(decode_response(13, &epoch(12, &[])), Err(DecodeError::Truncated { what: "diverging epoch", .. })));
    }

    #[test]
    fn tags_must_ascend() {
        let leader = [1, 9, 0, 0, 0, 1, 0, 0, 0, 1, 0];
        let mut twice = vec![2];
        twice.extend_from_slice(&leader);
        twice.extend_from_slice(&leader);
        assert!(matches!(decode_response(13, &one_partition(&twice)), Err(DecodeError::TagOrder { tag: 1, previous: 1, .. })));
        let mut backwards = vec![2, 5, 0];
        backwards.extend_from_slice(&leader);
        assert!(matches!(decode_response(13, &one_partition(&backwards)), Err(DecodeError::TagOrder { tag: 1, previous: 5, .. })));
        let mut ascending = vec![2];
        ascending.extend_from_slice(&leader);
        ascending.extend_from_slice(&[5, 0]);
        assert_eq!(decode_response(13, &one_partition(&ascending)).unwrap().topics[0].partitions[0].current_leader, Some((1, 1)));
    }

    #[test]
    fn null_records_and_aborted_transactions_read_as_empty() {
        let mut b = head_of_partition();
        b.put_u8(0); // null aborted transactions
        b.put_i32(-1);
        b.put_u8(0); // null records
        b.put_slice(&[0, 0, 0]);
        let answer = decode_response(13, &b.freeze()).unwrap();
        let p = &answer.topics[0].partitions[0];
        assert!(p.records.is_empty() && p.aborted_transactions.is_empty());
    }

    #[test]
    fn records_are_slices_of_the_body() {
        let records = Bytes::from(vec![7u8; 10_000]);
        let topics = [TopicOut { id: [1; 16], partitions: vec![PartitionOut { records: vec![records.clone()], ..Default::default() }], ..Default::default() }];
        let body = body_of(&encode(1, 13, 0, 0, 0, &topics));
        let answer = decode_response(13, &body).unwrap();
        let got = &answer.topics[0].partitions[0].records;
        assert_eq!(got, &records);
        let within = body.as_ptr_range();
        assert!(within.contains(&got.as_ptr()), "the records were copied");
    }

    #[test]
    fn other_versions_are_refused() {
        let body = body_of(&encode(1, 11, 0, 0, 0, &[]));
        for version in [-1, 0, MIN_VERSION, 11, MAX_VERSION + 1, i16::MAX] {
            assert_eq!(decode_response(version, &body), Err(DecodeError::UnsupportedVersion { api: "fetch", version }));
        }
    }

    /// The count bounds assume these are the smallest encodings; if the
    /// encoder (or the schema) ever writes something smaller, a bound would
    /// refuse a valid response.
    #[test]
    fn minimum_sizes_are_the_smallest_encodings() {
        let len = |version, topics: &[TopicOut]| encode(0, version, 0, 0, 0, topics).iter().map(Bytes::len).sum::<usize>();
        let topic = TopicOut::default();
        assert_eq!(len(13, &[topic.clone()]) - len(13, &[]), TOPIC_MIN_BYTES);
        assert_eq!(len(12, &[topic.clone()]) - len(12, &[]), NAMED_TOPIC_MIN_BYTES);
        let with = |p: PartitionOut| TopicOut { partitions: vec![p], ..Default::default() };
        assert_eq!(len(13, &[with(PartitionOut::default())]) - len(13, &[topic]), PARTITION_MIN_BYTES);
        let aborted = |n| with(PartitionOut { aborted_transactions: Some(vec![(0, 0); n]), ..Default::default() });
        assert_eq!(len(13, &[aborted(1)]) - len(13, &[aborted(0)]), ABORTED_MIN_BYTES);
        assert_eq!(TAGGED_FIELD_MIN_BYTES, [0u8, 0].len()); // tag 0, size 0
    }

    #[test]
    fn errors_read_well() {
        let e = decode_response(13, &head(0x8000_0000).freeze()).unwrap_err();
        assert_eq!(e.to_string(), "topics at offset 15: 2147483647 entries cannot fit in the 0 bytes that remain");
    }
}
