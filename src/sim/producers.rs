//! The idempotent producers of the simulation (see the module docs of
//! `sim`, "Idempotent producers").

use super::*;

/// An idempotent producer's batches to one tp, as its client sees them.
#[derive(Debug, Clone, Default)]
pub(super) struct Client {
    /// Its epoch: bumped, with its sequences started over, when the
    /// engine answers UNKNOWN_PRODUCER_ID (as librdkafka resets its
    /// producer id).
    epoch: i16,
    next_seq: i32,
    /// Sent and not yet acknowledged, oldest first (at most
    /// `MAX_IN_FLIGHT`, as Kafka's clients keep them): each is sent again
    /// by a retry, with the same sequence number and bytes.
    in_flight: Vec<Sent>,
    /// The connection broke (a restart, a crash, or an error answer): the
    /// batches in flight are sent again, in order, before any new one.
    pub(super) resend: bool,
}

#[derive(Debug, Clone)]
struct Sent {
    epoch: i16,
    seq: i32,
    /// Its record count.
    count: i32,
    /// As the client sent it (base offset 0).
    bytes: Vec<u8>,
}

/// The producer ids the simulated idempotent clients use.
const PRODUCER_IDS: [i64; 2] = [1_000, 1_001];
/// Kafka's clients keep at most five batches in flight per partition with
/// idempotence on (and the engine remembers five per producer and tp).
const MAX_IN_FLIGHT: usize = 5;
impl Sim {
    /// An idempotent producer sends its next batch to a tp, or (now and
    /// then, and always with `MAX_IN_FLIGHT` unanswered) sends every batch
    /// in flight again, in order, as a client does after a lost connection
    /// or a broker restart.
    pub(super) fn idempotent_append(&mut self) -> Check {
        let Some(tp) = self.pick_tp() else { return self.create_topic() };
        let pid = PRODUCER_IDS[self.rng.below(PRODUCER_IDS.len() as u64) as usize];
        let client = self.clients.entry((pid, tp)).or_default().clone();
        let retry = !client.in_flight.is_empty() && (client.resend || client.in_flight.len() >= MAX_IN_FLIGHT || self.rng.below(3) == 0);
        self.clients.get_mut(&(pid, tp)).expect("client").resend = false;
        let sends = if retry {
            client.in_flight
        } else {
            let n = 1 + self.rng.below(4) as usize;
            let values: Vec<Vec<u8>> = (0..n).map(|_| (0..self.rng.below(200)).map(|_| self.rng.next_u64() as u8).collect()).collect();
            let records: Vec<batch::NewRecord<'_>> = values.iter().map(|v| batch::NewRecord { value: Some(v), ..Default::default() }).collect();
            let mut bytes = batch::build(&records, self.now_ms);
            batch::set_producer(&mut bytes, pid, client.epoch, client.next_seq);
            let sent = Sent { epoch: client.epoch, seq: client.next_seq, count: n as i32, bytes };
            let c = self.clients.get_mut(&(pid, tp)).expect("client");
            c.next_seq += n as i32;
            c.in_flight.push(sent.clone());
            vec![sent]
        };
        for sent in sends {
            if !self.send_idempotent(tp, pid, sent)? {
                break;
            }
        }
        Ok(())
    }

    /// One idempotent batch through the writer's decision
    /// ([`crate::engine::admit`]), checked against the model: a batch the
    /// log holds is answered with its offsets, never appended again; the
    /// next one in sequence is appended. False: stop sending (storage
    /// refused this one).
    fn send_idempotent(&mut self, tp: Tp, pid: i64, sent: Sent) -> Result<bool, String> {
        use crate::engine::producers::{BatchIds, Check as Decision};
        let header = batch::BatchHeader::parse(&sent.bytes).map_err(|e| format!("a batch the simulator built does not parse: {e:?}"))?;
        let ids = BatchIds::of(&header);
        let log_start = self.mtp(&tp).log_start;
        // The log's copy of this batch, if it holds one (retention may have
        // taken it since: then the engine cannot know it, and any answer
        // is one Kafka could give).
        let held = self.mtp(&tp).batches.iter().find(|b| b.kind == Kind::Idempotent(pid, sent.epoch, sent.seq)).map(|b| (b.base, b.last, b.state));
        let decision = crate::engine::admit(&self.producers, &self.txns, tp, ids, false);
        if self.trace {
            eprintln!("  producer {pid} sequence {} ({} records) to {}/{}: {decision:?}, the log holds it at {held:?}", sent.seq, ids.count, tp.topic[15], tp.partition);
        }
        match (decision, held) {
            (_, Some((_, last, _))) if last < log_start => {
                self.answered(pid, tp, sent.epoch, sent.seq);
                Ok(true)
            }
            (Decision::Duplicate { base_offset, last_offset }, Some((base, last, state))) => {
                ensure((base_offset, last_offset) == (base, last), || format!("{tp:?}: producer {pid} sequence {} retried: answered with offsets {base_offset}..{last_offset}, the log holds it at {base}..{last}", sent.seq))?;
                if state == State::Acked {
                    self.answered(pid, tp, sent.epoch, sent.seq);
                }
                Ok(true)
            }
            (Decision::Append, Some((base, ..))) => Err(format!("{tp:?}: producer {pid} sequence {} retried and appended again; the log holds it at offset {base}", sent.seq)),
            (Decision::Append, None) => match self.append_batch(tp, sent.bytes, State::Staged, Kind::Idempotent(pid, sent.epoch, sent.seq))? {
                Some(a) => {
                    self.producers.record(tp, ids, a.base_offset, a.last_offset, self.now_ms);
                    self.out.idempotent_appends += 1;
                    Ok(true)
                }
                // The client got an error: it sends what it has in flight
                // again (after a power cycle every client does).
                None => {
                    if let Some(c) = self.clients.get_mut(&(pid, tp)) {
                        c.resend = true;
                    }
                    Ok(false)
                }
            },
            (Decision::Duplicate { base_offset, .. }, None) => Err(format!("{tp:?}: producer {pid} sequence {} answered as a retry of offset {base_offset}, which the log does not hold", sent.seq)),
            // A batch sent after one the log lost (a restart dropped it
            // unflushed) is out of order; the client sends the lost one
            // again first, as Kafka's clients do on that error.
            (Decision::Refuse(crate::engine::producers::Refusal::OutOfOrder), None) if self.lost_before(pid, tp, sent.epoch, sent.seq) => Ok(false),
            // The engine knows nothing of this producer here (a crash took
            // its state with every batch it had) and this batch does not
            // start at sequence 0: none of what the client has in flight
            // is in the log, so it starts a new epoch and sends it all
            // again from sequence 0, as librdkafka does.
            (Decision::Refuse(crate::engine::producers::Refusal::UnknownProducer), None) if sent.seq != 0 => {
                self.new_epoch(pid, tp);
                Ok(false)
            }
            (Decision::Refuse(why), _) => Err(format!("{tp:?}: producer {pid} sequence {} refused: {why:?} (held: {held:?})", sent.seq)),
        }
    }

    /// Whether a batch in flight before `seq` is not in the log.
    fn lost_before(&mut self, pid: i64, tp: Tp, epoch: i16, seq: i32) -> bool {
        let earlier: Vec<i32> = self.clients.get(&(pid, tp)).map(|c| c.in_flight.iter().filter(|s| s.epoch == epoch && s.seq < seq).map(|s| s.seq).collect()).unwrap_or_default();
        let m = self.mtp(&tp);
        earlier.iter().any(|&s| !m.batches.iter().any(|b| b.kind == Kind::Idempotent(pid, epoch, s)))
    }

    /// The client's next epoch: what it has in flight is numbered again
    /// from sequence 0, in order, and sent before anything new.
    fn new_epoch(&mut self, pid: i64, tp: Tp) {
        let c = self.clients.get_mut(&(pid, tp)).expect("client");
        c.epoch += 1;
        c.next_seq = 0;
        for s in &mut c.in_flight {
            s.epoch = c.epoch;
            s.seq = c.next_seq;
            batch::set_producer(&mut s.bytes, pid, s.epoch, s.seq);
            c.next_seq += s.count;
        }
        c.resend = true;
        self.out.producer_epochs += 1;
    }

    /// The client has its answer for `seq`: no longer in flight.
    pub(super) fn answered(&mut self, pid: i64, tp: Tp, epoch: i16, seq: i32) {
        if let Some(c) = self.clients.get_mut(&(pid, tp)) {
            c.in_flight.retain(|s| (s.epoch, s.seq) != (epoch, seq));
        }
        self.out.producer_answers += 1;
    }
}
