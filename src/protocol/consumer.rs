//! The consumer protocol's nested encodings: the subscription a member puts
//! in JoinGroup's protocol metadata and the assignment a leader puts in
//! SyncGroup. Both are client bytes inside a bytes field, so they go through
//! the wire-shape guard (`guard::check_embedded`) before `kafka-protocol`
//! decodes them: the crate reserves whatever count it reads.
//!
//! ```text
//! version i16, then the struct of that version (never flexible)
//! ```
//! A version newer than we know is read as the newest we know, ignoring
//! the fields after it, as Kafka's `ConsumerProtocol` does; a negative one
//! is refused.

use bytes::Bytes;
use kafka_protocol::messages::consumer_protocol_assignment::ConsumerProtocolAssignment;
use kafka_protocol::messages::consumer_protocol_subscription::ConsumerProtocolSubscription;
use kafka_protocol::protocol::Decodable;

use super::guard::{self, Embedded, GuardError, GuardLimits};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EmbeddedError {
    #[error("no version prefix")]
    Truncated,
    #[error("version {0} is negative")]
    BadVersion(i16),
    #[error(transparent)]
    Guard(#[from] GuardError),
    #[error("does not decode: {0}")]
    Decode(String),
}

/// Decodes a member's subscription from its protocol metadata.
pub fn subscription(blob: &Bytes) -> Result<ConsumerProtocolSubscription, EmbeddedError> {
    decode(Embedded::ConsumerSubscription, blob)
}

/// Decodes a leader's assignment for one member.
pub fn assignment(blob: &Bytes) -> Result<ConsumerProtocolAssignment, EmbeddedError> {
    decode(Embedded::ConsumerAssignment, blob)
}

fn decode<T: Decodable>(kind: Embedded, blob: &Bytes) -> Result<T, EmbeddedError> {
    if blob.len() < 2 {
        return Err(EmbeddedError::Truncated);
    }
    let version = i16::from_be_bytes([blob[0], blob[1]]);
    if version < 0 {
        return Err(EmbeddedError::BadVersion(version));
    }
    let version = version.min(Embedded::MAX_VERSION);
    let body = blob.slice(2..);
    // Nothing inside may be longer than the blob itself.
    let limits = GuardLimits { max_bytes_len: body.len(), ..GuardLimits::DEFAULT };
    let used = guard::check_embedded(kind, version, &body, &limits)?;
    let mut known = body.slice(..used);
    T::decode(&mut known, version).map_err(|e| EmbeddedError::Decode(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::{BufMut, BytesMut};
    use kafka_protocol::messages::consumer_protocol_subscription::TopicPartition;
    use kafka_protocol::messages::TopicName;
    use kafka_protocol::protocol::{Encodable, StrBytes};

    fn encoded<T: Encodable>(m: &T, version: i16) -> Bytes {
        let mut b = BytesMut::new();
        b.put_i16(version);
        m.encode(&mut b, version).unwrap();
        b.freeze()
    }

    fn sample() -> ConsumerProtocolSubscription {
        ConsumerProtocolSubscription::default()
            .with_topics(vec![StrBytes::from_static_str("a.b"), StrBytes::from_static_str("c")])
            .with_owned_partitions(vec![TopicPartition::default().with_topic(TopicName(StrBytes::from_static_str("a.b"))).with_partitions(vec![0, 1])])
            .with_generation_id(7)
    }

    #[test]
    fn every_version_round_trips() {
        for v in 0..=3 {
            let mut want = sample();
            if v < 1 {
                want.owned_partitions.clear();
            }
            if v < 2 {
                want.generation_id = -1;
            }
            assert_eq!(subscription(&encoded(&want, v)).unwrap(), want, "v{v}");
        }
    }

    #[test]
    fn a_newer_version_reads_as_the_newest_known() {
        let mut b = BytesMut::from(&encoded(&sample(), 3)[..]);
        b[0..2].copy_from_slice(&9i16.to_be_bytes());
        b.extend_from_slice(b"fields of v9");
        assert_eq!(subscription(&b.freeze()).unwrap(), sample());
    }

    #[test]
    fn a_lying_count_is_refused_before_anything_is_reserved() {
        // v1: topics [], user_data null, owned_partitions count 0x7fffffff.
        let mut b = BytesMut::new();
        b.put_i16(1);
        b.put_i32(0);
        b.put_i32(-1);
        b.put_i32(i32::MAX);
        assert!(matches!(subscription(&b.freeze()), Err(EmbeddedError::Guard(GuardError::CountTooLarge { .. } | GuardError::Truncated { .. }))));
        // Nested: one owned topic whose partition list claims 2^31-1 entries.
        let mut b = BytesMut::new();
        b.put_i16(1);
        b.put_i32(0);
        b.put_i32(-1);
        b.put_i32(1);
        b.put_i16(1);
        b.put_u8(b't');
        b.put_i32(i32::MAX);
        assert!(matches!(subscription(&b.freeze()), Err(EmbeddedError::Guard(_))));
    }

    #[test]
    fn short_and_negative_versions_are_refused() {
        assert_eq!(subscription(&Bytes::from_static(b"\x00")), Err(EmbeddedError::Truncated));
        assert_eq!(assignment(&Bytes::from_static(b"\xff\xff")), Err(EmbeddedError::BadVersion(-1)));
        assert!(assignment(&Bytes::from_static(b"\x00\x00\x00\x00\x00")).is_err(), "truncated body");
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(data in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256)) {
            let b = Bytes::from(data);
            let _ = subscription(&b);
            let _ = assignment(&b);
        }
    }
}
