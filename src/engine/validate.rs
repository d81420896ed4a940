//! Produce validation: what a topic asks of the batches a producer sends,
//! checked before the writer sees them. Cheap checks run on the caller's
//! thread; inflating, recompressing or walking a large batch runs on the
//! CPU pool (`Engine::submit` decides with [`Rules::heavy`]).

use std::ops::Range;

use bytes::Bytes;

use super::producers::{BatchIds, Refusal};
use super::EngineError;
use crate::protocol::batch::{self, BatchError, BatchHeader};

/// Batches that passed [`Rules::validate`], with what the writer needs of
/// each header. Only validation makes one, so the writer takes its batches
/// as they are: nothing left to parse, nothing to `expect`.
#[derive(Debug)]
pub struct Validated {
    records: Bytes,
    /// The first batch inline: a produce partition is nearly always one
    /// batch, and this is on every append's path (no allocation for it).
    first: Checked,
    rest: Option<Box<[Checked]>>,
}

/// One validated batch: where it lies in the records (a Kafka frame is at
/// most i32::MAX bytes, so u32 holds any position in it), and its header's producer fields. Kept small: it travels
/// in every append's command.
#[derive(Debug, Clone)]
pub struct Checked {
    start: u32,
    end: u32,
    pub ids: BatchIds,
    pub transactional: bool,
    pub records: i32,
}

impl Checked {
    fn new(range: Range<usize>, h: &BatchHeader) -> Checked {
        Checked {
            start: range.start as u32,
            end: range.end as u32,
            ids: BatchIds::of(h),
            transactional: h.is_transactional(),
            records: h.records_count,
        }
    }
}

impl Validated {
    /// Each batch's bytes with what was checked of it, in order.
    pub fn batches(&self) -> impl Iterator<Item = (&[u8], &Checked)> {
        std::iter::once(&self.first).chain(self.rest.iter().flatten()).map(|c| (&self.records[c.start as usize..c.end as usize], c))
    }
}

/// What a topic asks of produced batches, for validating them off the
/// engine (on the CPU pool when the work is heavy).
#[derive(Debug, Clone, Copy)]
pub(super) struct Rules {
    pub(super) max_message_bytes: usize,
    pub(super) max_inflated_bytes: usize,
    /// CreateTime topics: (before, after) bounds around `now`.
    pub(super) check_timestamps: Option<(i64, i64)>,
    /// Compacted topics: every record needs a key.
    pub(super) keys_required: bool,
    /// A topic compression.type: batches in another codec are recompressed.
    pub(super) target: Option<batch::Compression>,
    pub(super) now: i64,
    /// Producer ids handed out so far are below this.
    pub(super) producer_ids_below: i64,
}

/// The records of a batch refused one by one, as Produce v8+ reports them
/// (KIP-467): each record's index in its batch and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordErrors {
    /// Whether a timestamp is among the reasons (INVALID_TIMESTAMP, which
    /// Kafka answers before INVALID_RECORD).
    pub timestamps: bool,
    pub message: String,
    pub records: Vec<(i32, String)>,
}

impl std::fmt::Display for RecordErrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Refused records listed in one answer at most: a small compressed batch
/// can hold millions of records, and the answer must stay small (Kafka's
/// message shows three; clients match the list by index).
pub const MAX_RECORD_ERRORS: usize = 1000;

impl RecordErrors {
    /// The records of an accepted batch that break a record rule:
    /// a null key where keys are required, a timestamp outside
    /// `window` = (before, after) around `now`. None if every record passes.
    fn find(records: &[u8], h: &BatchHeader, window: Option<(i64, i64)>, now: i64, keys_required: bool) -> Option<RecordErrors> {
        let mut out = Vec::new();
        let mut total = 0usize;
        let mut timestamps = false;
        let mut refuse = |out: &mut Vec<(i32, String)>, index: i32, why: &dyn Fn() -> String| {
            total += 1;
            if out.len() < MAX_RECORD_ERRORS {
                out.push((index, why()));
            }
        };
        for r in batch::record_facts(records, h) {
            if keys_required && r.null_key {
                refuse(&mut out, r.index, &|| "Compacted topic cannot accept message without key.".to_owned());
            } else if let Some((before, after)) = window {
                if now.saturating_sub(r.timestamp) > before || r.timestamp.saturating_sub(now) > after {
                    timestamps = true;
                    let why = || format!("Timestamp {} of message with offset {} is out of range. The timestamp should be within [{}, {}]", r.timestamp, r.index, now.saturating_sub(before), now.saturating_add(after));
                    refuse(&mut out, r.index, &why);
                }
            }
        }
        if out.is_empty() {
            return None;
        }
        let message = if timestamps {
            "One or more records have been rejected due to invalid timestamp".to_owned()
        } else {
            let shown: Vec<String> = out.iter().take(3).map(|(i, why)| format!("record {i}: {why}")).collect();
            format!("One or more records have been rejected due to {total} record errors in total, and only showing the first three errors at most: [{}]", shown.join(", "))
        };
        Some(RecordErrors { timestamps, message, records: out })
    }

    /// A malformed record is reported with its index too.
    fn of_batch(e: BatchError) -> EngineError {
        match e {
            BatchError::BadRecord { index, why } => EngineError::RecordsRefused(RecordErrors {
                timestamps: false,
                message: format!("record {index} of the batch is malformed: {why}"),
                records: vec![(index, format!("malformed: {why}"))],
            }),
            e => EngineError::Corrupt(e),
        }
    }
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
    pub(super) fn validate(self, records: Bytes) -> Result<Validated, EngineError> {
        let limit = self.max_message_bytes;
        let mut first: Option<Checked> = None;
        let mut rest: Vec<Checked> = Vec::new();
        let mut rebuilt: Option<Vec<u8>> = None;
        let mut recompressed = false;
        // Batches lie back to back: each starts where the last one ended,
        // in the records as sent and in the rebuilt ones alike.
        let mut at = 0;
        for b in batch::split(&records) {
            let b = b?;
            if b.len() > limit {
                return Err(EngineError::MessageTooLarge { size: b.len(), limit });
            }
            let h = batch::validate(b, limit)?;
            let inflated = batch::records_of(b, &h, self.max_inflated_bytes)?;
            let (min_ts, max_ts) = batch::check_records(&inflated, &h).map_err(RecordErrors::of_batch)?;
            // Records without a timestamp (-1) are not checked, as in Kafka.
            let now = self.now;
            let window = self.check_timestamps.filter(|_| h.base_timestamp >= 0).filter(|(before, after)| now.saturating_sub(min_ts) > *before || max_ts.saturating_sub(now) > *after);
            if window.is_some() || self.keys_required {
                if let Some(refused) = RecordErrors::find(&inflated, &h, window, now, self.keys_required) {
                    return Err(EngineError::RecordsRefused(refused));
                }
            }
            // Only ids this broker handed out: state per producer id is
            // kept, so made-up ids must not be able to grow it.
            if h.producer_id >= 0 && !(1..self.producer_ids_below).contains(&h.producer_id) {
                return Err(EngineError::ProducerRefused(Refusal::UnknownProducer));
            }
            // Control records (transaction markers) are written by the
            // broker only; Kafka refuses them from producers.
            if h.is_control() {
                return Err(EngineError::Corrupt(BatchError::ControlBatch));
            }
            let len = if let Some(codec) = self.target.filter(|c| *c != h.compression()) {
                recompressed = true;
                let packed = batch::with_records(b, &crate::protocol::compression::compress(codec, &inflated), codec);
                if packed.len() > limit {
                    return Err(EngineError::MessageTooLarge { size: packed.len(), limit });
                }
                rebuilt.get_or_insert_with(Vec::new).extend_from_slice(&packed);
                packed.len()
            } else {
                if self.target.is_some() {
                    rebuilt.get_or_insert_with(Vec::new).extend_from_slice(b);
                }
                b.len()
            };
            // Recompression keeps the producer fields and the record count.
            let c = Checked::new(at..at + len, &h);
            match first {
                None => first = Some(c),
                Some(_) => rest.push(c),
            }
            at += len;
        }
        let Some(first) = first else {
            return Err(EngineError::Corrupt(BatchError::Empty));
        };
        let records = match rebuilt {
            Some(r) if recompressed => Bytes::from(r),
            _ => records,
        };
        debug_assert_eq!(at, records.len());
        let rest = (!rest.is_empty()).then(|| rest.into_boxed_slice());
        Ok(Validated { records, first, rest })
    }
}


#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::batch::tests::make_keyed_batch;

    fn rules(window: Option<(i64, i64)>, keys_required: bool) -> Rules {
        Rules { max_message_bytes: 1 << 20, max_inflated_bytes: 1 << 20, check_timestamps: window, keys_required, target: None, now: 10_000, producer_ids_below: 1 }
    }

    fn refused(r: Result<Validated, EngineError>) -> RecordErrors {
        match r {
            Err(EngineError::RecordsRefused(e)) => e,
            other => panic!("expected record errors, got {other:?}"),
        }
    }

    #[test]
    fn each_refused_record_is_named_by_its_index() {
        // Timestamps 1_000, 1_001, 1_002 (base 1_000): the window keeps
        // only what is at most 8_998 ms old, so records 0 and 1 are refused.
        let b = Bytes::from(make_keyed_batch(&[Some(b"a"), Some(b"b"), Some(b"c")], &[b"x", b"y", b"z"], 1_000));
        let e = refused(rules(Some((8_998, 0)), false).validate(b.clone()));
        assert!(e.timestamps);
        assert_eq!(e.records.iter().map(|r| r.0).collect::<Vec<_>>(), [0, 1]);
        assert!(rules(Some((9_000, 0)), false).validate(b).is_ok(), "every record inside the window");

        // Null keys where keys are required; a timestamp fault elsewhere
        // makes the answer INVALID_TIMESTAMP, as Kafka's.
        let b = Bytes::from(make_keyed_batch(&[None, Some(b"b"), None], &[b"x", b"y", b"z"], 1_000));
        let e = refused(rules(None, true).validate(b.clone()));
        assert!(!e.timestamps);
        assert_eq!(e.records.iter().map(|r| r.0).collect::<Vec<_>>(), [0, 2]);
        assert!(e.message.contains("2 record errors"), "{}", e.message);
        let e = refused(rules(Some((8_998, 0)), true).validate(b.clone()));
        assert!(e.timestamps);
        assert_eq!(e.records.iter().map(|r| r.0).collect::<Vec<_>>(), [0, 1, 2]);
        assert!(rules(None, false).validate(b).is_ok(), "null keys are fine where keys are not required");
    }

    #[test]
    fn the_list_of_refused_records_is_bounded() {
        let n = MAX_RECORD_ERRORS + 500;
        let keys = vec![None; n];
        let values: Vec<&[u8]> = vec![b"v"; n];
        let b = Bytes::from(make_keyed_batch(&keys, &values, 1_000));
        let e = refused(rules(None, true).validate(b));
        assert_eq!(e.records.len(), MAX_RECORD_ERRORS);
        assert!(e.message.contains(&format!("{n} record errors")), "{}", e.message);
    }
}
