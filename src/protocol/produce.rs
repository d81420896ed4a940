//! The Produce response a node reads when it forwards records to their
//! partition's leader (the REST bridge in cluster mode). The request is
//! encoded with `kafka-protocol`; the answer comes from the network and is
//! read here with the checked cursor of `response`, never by the crate's
//! decoder (which reserves whatever a count claims).

use bytes::Bytes;

use super::response::{DecodeError, Reader};

/// The version forwarded produces use: flexible, topics by name.
pub const VERSION: i16 = 9;

/// One partition of a Produce answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PartitionAck {
    pub partition: i32,
    pub error_code: i16,
    pub base_offset: i64,
    /// The error's message, when the leader gave one (UTF-8 checked).
    pub error_message: Option<String>,
}

/// A leader's Produce answer: its correlation id and, per topic name, its
/// partitions as sent (repeats are the caller's to refuse).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProduceAnswer {
    pub correlation_id: i32,
    pub topics: Vec<(Bytes, Vec<PartitionAck>)>,
}

// The fewest bytes each repeated element takes (v9), so a count is admitted
// only if that many elements fit in what remains.
/// Index, error, three offsets, no record errors, null message, no tags.
const PARTITION_MIN_BYTES: usize = 4 + 2 + 8 + 8 + 8 + 1 + 1 + 1;
/// Empty name, no partitions, no tags.
const TOPIC_MIN_BYTES: usize = 1 + 1 + 1;
/// Batch index, null message, no tags.
const RECORD_ERROR_MIN_BYTES: usize = 4 + 1 + 1;

/// Decodes a Produce v9 response from `body`, the bytes after the frame
/// length: correlation id, the response header's tagged fields, then the
/// response. Hostile input: every count and length is checked against what
/// remains, tags must ascend with exact sizes, trailing bytes are an error.
pub fn decode_response(body: &Bytes) -> Result<ProduceAnswer, DecodeError> {
    let mut r = Reader::new(body);
    let correlation_id = r.i32("correlation id")?;
    r.tagged_fields("response header", |_, _| Ok(false))?;
    let n = r.required_count("topics", TOPIC_MIN_BYTES)?;
    let mut topics = Vec::with_capacity(n);
    for _ in 0..n {
        let name = r.required_string("topic name")?;
        let k = r.required_count("partitions", PARTITION_MIN_BYTES)?;
        let mut partitions = Vec::with_capacity(k);
        for _ in 0..k {
            let partition = r.i32("partition index")?;
            let error_code = r.i16("partition error code")?;
            let base_offset = r.i64("base offset")?;
            let _log_append_time = r.i64("log append time")?;
            let _log_start = r.i64("log start offset")?;
            if let Some(errors) = r.count("record errors", RECORD_ERROR_MIN_BYTES)? {
                for _ in 0..errors {
                    r.i32("batch index")?;
                    r.string("record error message")?;
                    r.tagged_fields("record error", |_, _| Ok(false))?;
                }
            }
            let error_message = r.string("error message")?.map(|m| String::from_utf8_lossy(&m).into_owned());
            r.tagged_fields("partition", |_, _| Ok(false))?;
            partitions.push(PartitionAck { partition, error_code, base_offset, error_message });
        }
        r.tagged_fields("topic", |_, _| Ok(false))?;
        topics.push((name, partitions));
    }
    r.i32("throttle time")?;
    r.tagged_fields("response", |_, _| Ok(false))?;
    r.finish()?;
    Ok(ProduceAnswer { correlation_id, topics })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::produce_response::{BatchIndexAndErrorMessage, PartitionProduceResponse, TopicProduceResponse};
    use kafka_protocol::messages::{ProduceResponse, ResponseHeader, TopicName};
    use kafka_protocol::protocol::{Encodable, StrBytes};

    /// What `kafka-protocol` encodes: header v1 (flexible) and the body.
    fn encoded(id: i32, r: &ProduceResponse) -> Bytes {
        let mut b = bytes::BytesMut::new();
        ResponseHeader::default().with_correlation_id(id).encode(&mut b, 1).unwrap();
        r.encode(&mut b, VERSION).unwrap();
        b.freeze()
    }

    fn sample() -> ProduceResponse {
        let ok = PartitionProduceResponse::default().with_index(0).with_base_offset(42);
        let bad = PartitionProduceResponse::default()
            .with_index(2)
            .with_error_code(6)
            .with_base_offset(-1)
            .with_record_errors(vec![BatchIndexAndErrorMessage::default().with_batch_index(1).with_batch_index_error_message(Some(StrBytes::from_static_str("no")))])
            .with_error_message(Some(StrBytes::from_static_str("not the leader")));
        let t = TopicProduceResponse::default().with_name(TopicName(StrBytes::from_static_str("a.b"))).with_partition_responses(vec![ok, bad]);
        ProduceResponse::default().with_responses(vec![t]).with_throttle_time_ms(7)
    }

    #[test]
    fn reads_what_kafka_protocol_encodes() {
        let a = decode_response(&encoded(9, &sample())).unwrap();
        assert_eq!(a.correlation_id, 9);
        assert_eq!(a.topics.len(), 1);
        assert_eq!(&a.topics[0].0[..], b"a.b");
        assert_eq!(a.topics[0].1, vec![
            PartitionAck { partition: 0, error_code: 0, base_offset: 42, error_message: None },
            PartitionAck { partition: 2, error_code: 6, base_offset: -1, error_message: Some("not the leader".into()) },
        ]);
    }

    #[test]
    fn every_truncation_is_an_error_and_trailing_bytes_too() {
        crate::protocol::response::assert_refuses_truncations_and_trailing_bytes(&encoded(1, &sample()), |b| decode_response(b).map(|_| ()));
    }

    #[test]
    fn a_huge_count_is_refused_before_anything_is_reserved() {
        // Correlation id, no header tags, then 2^32 - 2 topics in 5 bytes.
        let mut b = vec![0, 0, 0, 1, 0];
        b.extend([0xfe, 0xff, 0xff, 0xff, 0x0f]);
        assert!(matches!(decode_response(&Bytes::from(b)), Err(DecodeError::CountTooLarge { .. })));
        // A null topic list.
        assert!(matches!(decode_response(&Bytes::from_static(&[0, 0, 0, 1, 0, 0])), Err(DecodeError::UnexpectedNull { .. })));
    }

    #[test]
    fn a_name_that_is_not_utf8_is_refused() {
        let mut b = encoded(1, &sample()).to_vec();
        // Correlation id (4), header tags (1), topic count (1), name length (1).
        b[7] = 0xff;
        assert!(matches!(decode_response(&Bytes::from(b)), Err(DecodeError::NotUtf8 { .. })));
    }

    #[test]
    fn minimum_sizes_are_the_smallest_encodings() {
        let p = PartitionProduceResponse::default().with_error_message(None);
        let mut b = bytes::BytesMut::new();
        p.encode(&mut b, VERSION).unwrap();
        assert_eq!(b.len(), PARTITION_MIN_BYTES);
        let mut b = bytes::BytesMut::new();
        TopicProduceResponse::default().encode(&mut b, VERSION).unwrap();
        assert_eq!(b.len(), TOPIC_MIN_BYTES);
        let mut b = bytes::BytesMut::new();
        BatchIndexAndErrorMessage::default().with_batch_index_error_message(None).encode(&mut b, VERSION).unwrap();
        assert_eq!(b.len(), RECORD_ERROR_MIN_BYTES);
    }
}
