//! Produce validation: what a topic asks of the batches a producer sends,
//! checked before the writer sees them. Cheap checks run on the caller's
//! thread; inflating, recompressing or walking a large batch runs on the
//! CPU pool (`Engine::submit` decides with [`Rules::heavy`]).

use bytes::Bytes;

use super::EngineError;
use crate::protocol::batch::{self, BatchError};

/// What a topic asks of produced batches, for validating them off the
/// engine (on the CPU pool when the work is heavy).
#[derive(Debug, Clone, Copy)]
pub(super) struct Rules {
    pub(super) max_message_bytes: usize,
    pub(super) max_inflated_bytes: usize,
    /// CreateTime topics: (before, after) bounds around `now`.
    pub(super) check_timestamps: Option<(i64, i64)>,
    /// A topic compression.type: batches in another codec are recompressed.
    pub(super) target: Option<batch::Compression>,
    pub(super) now: i64,
    /// Producer ids handed out so far are below this.
    pub(super) producer_ids_below: i64,
}

/// Batches larger than this are validated on the CPU pool even when they
/// are not compressed (record checks walk every record).
const INLINE_VALIDATION_BYTES: usize = 256 << 10;

impl Rules {
    /// Whether validating `records` takes more than a checksum: anything to
    /// inflate or recompress, or much to walk.
    pub(super) fn heavy(&self, records: &[u8]) -> bool {
        records.len() > INLINE_VALIDATION_BYTES
            || self.target.is_some()
            || batch::split(records).any(|b| b.ok().and_then(|b| batch::BatchHeader::parse(b).ok()).is_some_and(|h| h.compression() != batch::Compression::None))
    }

    /// Checks every batch (sizes, CRC, records, timestamps, producer ids,
    /// no control batches) and recompresses for the topic's codec. Returns
    /// the records to append.
    pub(super) fn validate(self, records: Bytes) -> Result<Bytes, EngineError> {
        let limit = self.max_message_bytes;
        let mut any = false;
        let mut rebuilt: Option<Vec<u8>> = None;
        let mut recompressed = false;
        for b in batch::split(&records) {
            let b = b?;
            if b.len() > limit {
                return Err(EngineError::MessageTooLarge { size: b.len(), limit });
            }
            let h = batch::validate(b, limit)?;
            let inflated = batch::records_of(b, &h, self.max_inflated_bytes)?;
            let (min_ts, max_ts) = batch::check_records(&inflated, &h)?;
            // Records without a timestamp (-1) are not checked, as in Kafka.
            if let Some((before, after)) = self.check_timestamps.filter(|_| h.base_timestamp >= 0) {
                let now = self.now;
                if now.saturating_sub(min_ts) > before || max_ts.saturating_sub(now) > after {
                    return Err(EngineError::InvalidTimestamp { min_ts, max_ts, now });
                }
            }
            // Only ids this broker handed out: state per producer id is
            // kept, so made-up ids must not be able to grow it.
            if h.producer_id >= 0 && !(1..self.producer_ids_below).contains(&h.producer_id) {
                return Err(EngineError::ProducerRefused(kafka_protocol::ResponseError::UnknownProducerId.code()));
            }
            // Control records (transaction markers) are written by the
            // broker only; Kafka refuses them from producers.
            if h.is_control() {
                return Err(EngineError::Corrupt(BatchError::ControlBatch));
            }
            any = true;
            if let Some(codec) = self.target.filter(|c| *c != h.compression()) {
                recompressed = true;
                let packed = batch::with_records(b, &crate::protocol::compression::compress(codec, &inflated), codec);
                if packed.len() > limit {
                    return Err(EngineError::MessageTooLarge { size: packed.len(), limit });
                }
                rebuilt.get_or_insert_with(Vec::new).extend_from_slice(&packed);
            } else if self.target.is_some() {
                rebuilt.get_or_insert_with(Vec::new).extend_from_slice(b);
            }
        }
        if !any {
            return Err(EngineError::Corrupt(BatchError::Empty));
        }
        let records = match rebuilt {
            Some(r) if recompressed => Bytes::from(r),
            _ => records,
        };
        Ok(records)
    }
}

