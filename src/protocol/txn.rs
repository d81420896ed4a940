//! The answers a transaction coordinator reads from other nodes (cluster
//! mode, docs/cluster.md "Transaction state"): WriteTxnMarkers v1 from the
//! partition leaders it ends a transaction at, and AddPartitionsToTxn v5
//! (the brokers' batched form) from the coordinator a partition leader
//! asks whether a transaction added its partition. The requests are
//! encoded with `kafka-protocol`; the answers come from the network and
//! are read with the checked cursor of `response`.

use bytes::Bytes;

use super::response::{DecodeError, Reader};

/// The WriteTxnMarkers version sent (Kafka 4 has only 1).
pub const WRITE_TXN_MARKERS_VERSION: i16 = 1;
/// The AddPartitionsToTxn version a leader asks a coordinator with: the
/// brokers' batched form (v4+), flexible.
pub const ADD_PARTITIONS_VERSION: i16 = 5;

/// Per topic name, each partition's error code, as an answer lists them.
pub type TopicCodes = Vec<(Bytes, Vec<(i32, i16)>)>;

/// A WriteTxnMarkers answer: per marker, its producer id and codes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MarkersAnswer {
    pub correlation_id: i32,
    pub markers: Vec<(i64, TopicCodes)>,
}

/// An AddPartitionsToTxn (v4+) answer: the top-level code, then per
/// transactional id its codes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AddPartitionsAnswer {
    pub correlation_id: i32,
    pub error_code: i16,
    pub transactions: Vec<(Bytes, TopicCodes)>,
}

// The fewest bytes each repeated element takes, so a count is admitted
// only if that many elements fit in what remains.
/// Index, error code, no tags.
const PARTITION_MIN_BYTES: usize = 4 + 2 + 1;
/// Empty name, no partitions, no tags.
const TOPIC_MIN_BYTES: usize = 1 + 1 + 1;
/// Producer id, no topics, no tags.
const MARKER_MIN_BYTES: usize = 8 + 1 + 1;
/// Empty id, no topics, no tags.
const TRANSACTION_MIN_BYTES: usize = 1 + 1 + 1;

/// `parts` (topic, partition) grouped by topic, in first-seen order, as
/// both requests name them.
pub fn by_topic<'a>(parts: impl IntoIterator<Item = (&'a str, i32)>) -> Vec<(&'a str, Vec<i32>)> {
    let mut out: Vec<(&str, Vec<i32>)> = Vec::new();
    for (name, p) in parts {
        match out.iter_mut().find(|(n, _)| *n == name) {
            Some((_, ps)) => ps.push(p),
            None => out.push((name, vec![p])),
        }
    }
    out
}

/// The code an answer gives partition `p` of `name` among `topics`.
fn code_of(topics: &[&(Bytes, Vec<(i32, i16)>)], name: &str, p: i32) -> Option<i16> {
    topics.iter().filter(|(n, _)| n.as_ref() == name.as_bytes()).flat_map(|(_, ps)| ps).find(|(i, _)| *i == p).map(|(_, c)| *c)
}

impl MarkersAnswer {
    /// Each of `parts`' code for `producer_id`'s marker; `None` where the
    /// answer left it out.
    pub fn codes(&self, producer_id: i64, parts: &[(String, i32)]) -> Vec<Option<i16>> {
        let topics: Vec<&(Bytes, Vec<(i32, i16)>)> = self.markers.iter().filter(|(pid, _)| *pid == producer_id).flat_map(|(_, ts)| ts).collect();
        parts.iter().map(|(name, p)| code_of(&topics, name, *p)).collect()
    }
}

impl AddPartitionsAnswer {
    /// Each of `parts`' code for transactional id `id`; `None` where the
    /// answer left it out.
    pub fn codes<'a>(&self, id: &str, parts: impl IntoIterator<Item = (&'a str, i32)>) -> Vec<Option<i16>> {
        let topics: Vec<&(Bytes, Vec<(i32, i16)>)> = self.transactions.iter().filter(|(t, _)| t.as_ref() == id.as_bytes()).flat_map(|(_, ts)| ts).collect();
        parts.into_iter().map(|(name, p)| code_of(&topics, name, p)).collect()
    }
}

/// A list of topic results: name, then (index, code) per partition.
fn topic_codes(r: &mut Reader<'_>) -> Result<TopicCodes, DecodeError> {
    let n = r.required_count("topics", TOPIC_MIN_BYTES)?;
    let mut topics = Vec::with_capacity(n);
    for _ in 0..n {
        let name = r.required_string("topic name")?;
        let k = r.required_count("partitions", PARTITION_MIN_BYTES)?;
        let mut partitions = Vec::with_capacity(k);
        for _ in 0..k {
            partitions.push((r.i32("partition index")?, r.i16("partition error code")?));
            r.tagged_fields("partition", |_, _| Ok(false))?;
        }
        r.tagged_fields("topic", |_, _| Ok(false))?;
        topics.push((name, partitions));
    }
    Ok(topics)
}

/// Decodes a WriteTxnMarkers v1 response from `body` (the bytes after the
/// frame length: correlation id, the header's tagged fields, the
/// response). Every count and length is checked against what remains,
/// tags must ascend with exact sizes, trailing bytes are an error.
pub fn decode_markers(body: &Bytes) -> Result<MarkersAnswer, DecodeError> {
    let mut r = Reader::new(body);
    let correlation_id = r.i32("correlation id")?;
    r.tagged_fields("response header", |_, _| Ok(false))?;
    let n = r.required_count("markers", MARKER_MIN_BYTES)?;
    let mut markers = Vec::with_capacity(n);
    for _ in 0..n {
        let producer_id = r.i64("producer id")?;
        let topics = topic_codes(&mut r)?;
        r.tagged_fields("marker", |_, _| Ok(false))?;
        markers.push((producer_id, topics));
    }
    r.tagged_fields("response", |_, _| Ok(false))?;
    r.finish()?;
    Ok(MarkersAnswer { correlation_id, markers })
}

/// Decodes an AddPartitionsToTxn v5 response from `body`, checked as
/// [`decode_markers`] is.
pub fn decode_add_partitions(body: &Bytes) -> Result<AddPartitionsAnswer, DecodeError> {
    let mut r = Reader::new(body);
    let correlation_id = r.i32("correlation id")?;
    r.tagged_fields("response header", |_, _| Ok(false))?;
    r.i32("throttle time")?;
    let error_code = r.i16("error code")?;
    let n = r.required_count("transactions", TRANSACTION_MIN_BYTES)?;
    let mut transactions = Vec::with_capacity(n);
    for _ in 0..n {
        let id = r.required_string("transactional id")?;
        let topics = topic_codes(&mut r)?;
        r.tagged_fields("transaction", |_, _| Ok(false))?;
        transactions.push((id, topics));
    }
    r.tagged_fields("response", |_, _| Ok(false))?;
    r.finish()?;
    Ok(AddPartitionsAnswer { correlation_id, error_code, transactions })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::add_partitions_to_txn_response::{AddPartitionsToTxnPartitionResult, AddPartitionsToTxnResult, AddPartitionsToTxnTopicResult};
    use kafka_protocol::messages::write_txn_markers_response::{WritableTxnMarkerPartitionResult, WritableTxnMarkerResult, WritableTxnMarkerTopicResult};
    use kafka_protocol::messages::{AddPartitionsToTxnResponse, ProducerId, ResponseHeader, TopicName, TransactionalId, WriteTxnMarkersResponse};
    use kafka_protocol::protocol::{Encodable, StrBytes};

    fn encoded<T: Encodable>(id: i32, r: &T, version: i16) -> Bytes {
        let mut b = bytes::BytesMut::new();
        ResponseHeader::default().with_correlation_id(id).encode(&mut b, 1).unwrap();
        r.encode(&mut b, version).unwrap();
        b.freeze()
    }

    fn name(s: &'static str) -> TopicName {
        TopicName(StrBytes::from_static_str(s))
    }

    fn markers() -> WriteTxnMarkersResponse {
        let p = |i, c| WritableTxnMarkerPartitionResult::default().with_partition_index(i).with_error_code(c);
        WriteTxnMarkersResponse::default().with_markers(vec![
            WritableTxnMarkerResult::default().with_producer_id(ProducerId(7)).with_topics(vec![
                WritableTxnMarkerTopicResult::default().with_name(name("a.b")).with_partitions(vec![p(0, 0), p(2, 6)]),
                WritableTxnMarkerTopicResult::default().with_name(name("c")).with_partitions(vec![]),
            ]),
            WritableTxnMarkerResult::default().with_producer_id(ProducerId(9)).with_topics(vec![]),
        ])
    }

    fn added() -> AddPartitionsToTxnResponse {
        let p = |i, c| AddPartitionsToTxnPartitionResult::default().with_partition_index(i).with_partition_error_code(c);
        let t = AddPartitionsToTxnTopicResult::default().with_name(name("a.b")).with_results_by_partition(vec![p(1, 0), p(3, 48)]);
        AddPartitionsToTxnResponse::default().with_throttle_time_ms(3).with_error_code(0).with_results_by_transaction(vec![
            AddPartitionsToTxnResult::default().with_transactional_id(TransactionalId(StrBytes::from_static_str("tx"))).with_topic_results(vec![t]),
        ])
    }

    #[test]
    fn reads_what_kafka_protocol_encodes() {
        let a = decode_markers(&encoded(4, &markers(), WRITE_TXN_MARKERS_VERSION)).unwrap();
        assert_eq!(a.correlation_id, 4);
        assert_eq!(a.markers, vec![
            (7, vec![(Bytes::from_static(b"a.b"), vec![(0, 0), (2, 6)]), (Bytes::from_static(b"c"), vec![])]),
            (9, vec![]),
        ]);
        let a = decode_add_partitions(&encoded(5, &added(), ADD_PARTITIONS_VERSION)).unwrap();
        assert_eq!((a.correlation_id, a.error_code), (5, 0));
        assert_eq!(a.transactions, vec![(Bytes::from_static(b"tx"), vec![(Bytes::from_static(b"a.b"), vec![(1, 0), (3, 48)])])]);
    }

    #[test]
    fn parts_group_by_topic_and_answers_are_read_per_part() {
        assert_eq!(by_topic([("a", 1), ("b", 0), ("a", 3)]), vec![("a", vec![1, 3]), ("b", vec![0])]);
        let a = decode_markers(&encoded(4, &markers(), WRITE_TXN_MARKERS_VERSION)).unwrap();
        let parts = [("a.b".to_string(), 2), ("a.b".to_string(), 5), ("c".to_string(), 0)];
        assert_eq!(a.codes(7, &parts), vec![Some(6), None, None]);
        assert_eq!(a.codes(8, &parts), vec![None, None, None], "another producer's marker");
        let a = decode_add_partitions(&encoded(5, &added(), ADD_PARTITIONS_VERSION)).unwrap();
        assert_eq!(a.codes("tx", [("a.b", 3), ("a.b", 1)]), vec![Some(48), Some(0)]);
        assert_eq!(a.codes("other", [("a.b", 3)]), vec![None]);
    }

    #[test]
    fn every_truncation_is_an_error_and_trailing_bytes_too() {
        use crate::protocol::response::assert_refuses_truncations_and_trailing_bytes as refused;
        refused(&encoded(1, &markers(), WRITE_TXN_MARKERS_VERSION), |b| decode_markers(b).map(|_| ()));
        refused(&encoded(1, &added(), ADD_PARTITIONS_VERSION), |b| decode_add_partitions(b).map(|_| ()));
    }

    #[test]
    fn huge_counts_nulls_and_bad_names_are_refused() {
        // Correlation id, no header tags, then 2^32 - 2 markers in 5 bytes.
        let mut b = vec![0, 0, 0, 1, 0];
        b.extend([0xfe, 0xff, 0xff, 0xff, 0x0f]);
        assert!(matches!(decode_markers(&Bytes::from(b)), Err(DecodeError::CountTooLarge { .. })));
        assert!(matches!(decode_markers(&Bytes::from_static(&[0, 0, 0, 1, 0, 0])), Err(DecodeError::UnexpectedNull { .. })));
        // Throttle time and error code, then a huge transaction count.
        let mut b = vec![0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0];
        b.extend([0xfe, 0xff, 0xff, 0xff, 0x0f]);
        assert!(matches!(decode_add_partitions(&Bytes::from(b)), Err(DecodeError::CountTooLarge { .. })));
        // A topic name that is not UTF-8: correlation id (4), header tags
        // (1), marker count (1), producer id (8), topic count (1), name
        // length (1).
        let mut b = encoded(1, &markers(), WRITE_TXN_MARKERS_VERSION).to_vec();
        b[16] = 0xff;
        assert!(matches!(decode_markers(&Bytes::from(b)), Err(DecodeError::NotUtf8 { .. })));
    }

    #[test]
    fn minimum_sizes_are_the_smallest_encodings() {
        let size = |e: &dyn Fn(&mut bytes::BytesMut)| {
            let mut b = bytes::BytesMut::new();
            e(&mut b);
            b.len()
        };
        let v = WRITE_TXN_MARKERS_VERSION;
        assert_eq!(size(&|b| WritableTxnMarkerPartitionResult::default().encode(b, v).unwrap()), PARTITION_MIN_BYTES);
        assert_eq!(size(&|b| WritableTxnMarkerTopicResult::default().encode(b, v).unwrap()), TOPIC_MIN_BYTES);
        assert_eq!(size(&|b| WritableTxnMarkerResult::default().encode(b, v).unwrap()), MARKER_MIN_BYTES);
        let v = ADD_PARTITIONS_VERSION;
        assert_eq!(size(&|b| AddPartitionsToTxnPartitionResult::default().encode(b, v).unwrap()), PARTITION_MIN_BYTES);
        assert_eq!(size(&|b| AddPartitionsToTxnTopicResult::default().encode(b, v).unwrap()), TOPIC_MIN_BYTES);
        assert_eq!(size(&|b| AddPartitionsToTxnResult::default().encode(b, v).unwrap()), TRANSACTION_MIN_BYTES);
    }
}
