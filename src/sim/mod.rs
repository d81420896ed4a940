//! The deterministic simulator (in the spirit of TigerBeetle's VOPR and
//! FoundationDB's simulation): a seeded driver runs storage on simulated
//! time and the simulated disk ([`crate::storage::disk::sim`]) through a
//! random workload, crashes and restarts it at any step, injects disk
//! faults, and checks it against a reference model after every step.
//!
//! # What one seed does
//!
//! The seed picks the configuration (segment size, descriptor cache, tip,
//! whether the disk is faulty) and then, step by step, one of: create or
//! delete a topic, append a batch, send an idempotent producer's batch (or
//! resend those in flight), take a transactional producer's next step,
//! flush, sync and acknowledge, read a partition, enforce retention,
//! compact, restart cleanly, or crash. A quarter of the plain appends come
//! as a follower's copy of its leader's batch would (`append_at`, placed at
//! the offset the model expects), some after one placed below it that must
//! be refused without a trace. Leader epochs are begun on tps now and then
//! (leader appends then carry them, copies carry their own), and tails of
//! plain batches are cut as a follower cuts its divergent tail (see
//! `docs/simulator.md`). The driver plays the engine's
//! part: a batch is acknowledged only after the flush that wrote it and
//! the sync after that flush, as the engine does for acks=all; the
//! catalog (topics, log starts, compaction windows) is modelled as
//! durable when written, as the engine's sled flush makes it.
//!
//! # What is checked, after every step
//!
//! - Offsets are dense: each append gets the offset after the last one.
//! - `log start <= high watermark <= log end`; the high watermark never
//!   moves back, across restarts too, but for a replica's (a tp with leader
//!   epochs), which restarts at the hw checkpoint (see `replica.rs`).
//! - Subtree stores hold nothing of a tp at or past the highest hw it had
//!   since its last cut.
//! - Reading a partition from its log start to its high watermark returns
//!   exactly the model's batches, byte for byte.
//! - After a crash, every acknowledged batch is there, at its offset; what
//!   survives beyond them is a prefix of what was appended (nothing
//!   invented, nothing out of order, no gap).
//! - After a restart, every file in the data directory is accounted for:
//!   a live segment, or a store the catalog lists.
//!
//! A failure names its seed and step; `canopy-sim --seed N` replays it
//! exactly (nothing reads a clock, a thread or the process's randomness).
//!
//! # Planted bugs
//!
//! [`Plant`] names bugs the simulator must find: three in storage
//! ([`crate::storage::Planted`]) and one in the driver's own engine part
//! (acknowledging before the flush). `canopy-sim --plant <bug>` reports the
//! first seed that finds it.
//!
//! # Idempotent producers
//!
//! Two producer ids send batches to random tps with sequence numbers, at
//! most five in flight per tp, and now and then (always with five
//! unanswered) send every batch in flight again, as a client does after a
//! lost connection or a restart. Each batch goes through the writer's own
//! decision ([`crate::engine::admit`]) over the engine's producer state,
//! which every open restores with the engine's own code (the snapshot,
//! cut to what the log kept, then a replay), and which is snapshotted
//! after flushes and at clean stops as the engine does. Checked: a batch
//! the log holds is never appended again; its retry is answered with the
//! offsets it was first written at; the next batch in sequence is
//! appended, never refused. A producer the engine knows nothing of (a
//! crash took its state with every batch it had) is refused unless its
//! batch starts at sequence 0; its client then starts a new epoch and
//! sends what it has in flight again from 0, as librdkafka does.
//!
//! # The catalog's failures
//!
//! On a faulty disk, one catalog write in eight fails (log starts after
//! retention, stores retention drops, a compaction window): lost, or
//! durable and reported as failed all the same (sled flushed, then
//! erred). Storage cannot tell the two apart; it stops, the machine is
//! power-cycled, and recovery must agree with whatever the catalog holds.
//!
//! # Transactions
//!
//! A transactional producer begins transactions over one to three
//! partitions, sends batches in them, and commits (only once every batch
//! it sent is acknowledged, as Kafka's producer waits for its sends) or
//! aborts. Its coordinator is played as the engine's plays it: partitions
//! added before their batches, each closed and its log end noted at the
//! decision, markers after; at every start, over the transaction state the
//! engine restored (snapshot and replay), a decided transaction is
//! finished where it is still open, an undecided one aborted with the
//! epoch bumped, and one the logs hold open that no record names aborted
//! too. Checked after every step, for every partition: each batch of an
//! open transaction lies at or past the last stable offset, each batch of
//! an aborted one is reported aborted (a read_committed consumer drops
//! it) and each committed one is not, and the stable offset waits only
//! for a transaction the model holds open. Batches sent to a partition the
//! transaction did not add, or with an epoch the coordinator fenced, must
//! not be appended.
//!
//! # The writer inside maintenance
//!
//! The engine's writer and syncer do not wait for retention or
//! compaction, so half of those calls run a few appends, perhaps a flush
//! and perhaps a sync (and the publishing after it) at a point inside
//! them: between retention's plan and its changes or before it drops
//! stores, and at one of compaction's steps (before the copy, after it,
//! after the stores are synced, between the catalog's window and the
//! readers' switch, at the end). A switch that installed the segment list
//! it copied at the start, losing the segments rolled meanwhile, fails
//! seed 4 (planted by hand, checked).
//!
//! Not yet simulated (the storage-core issue goes on): the writer and
//! syncer threads themselves (the driver calls storage, and the writer's
//! decision, in an order they could, interleaved only at those points),
//! and fetch and subtree streams through the engine.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::protocol::batch::{self, Marker};
use crate::storage::disk::sim::{Faults, Rng, SimDisk, SimStats};
use crate::storage::disk::Disk;
use crate::storage::subtree::split::Strategy;
use crate::storage::subtree::{store, Step, WindowRecord};
use crate::storage::tip::{Pick, TipConfig};
use crate::storage::{CompactConfig, EpochCache, Flushed, LogWriter, PartitionSpec, Planted, RetentionPolicy, Storage, StorageConfig, StorageError, TopicId, Tp};

mod interleave;
mod producers;
mod replica;
mod txns;

use producers::Client;
use txns::Transactor;

/// A bug to plant, to show the simulator finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plant {
    Storage(Planted),
    /// The driver acknowledges a batch as soon as it is appended, before
    /// the flush and the sync.
    AckBeforeFlush,
}

impl Plant {
    pub const ALL: [(&'static str, Plant); 5] = [
        ("skip-fsync", Plant::Storage(Planted::SkipFsync)),
        ("ack-before-flush", Plant::AckBeforeFlush),
        ("keep-torn-tail", Plant::Storage(Planted::KeepTornTail)),
        ("retention-off-by-one", Plant::Storage(Planted::RetentionPastHighWatermark)),
        ("compact-past-hw", Plant::Storage(Planted::CompactPastHighWatermark)),
    ];
    pub fn parse(name: &str) -> Option<Plant> {
        Plant::ALL.iter().find(|(n, _)| *n == name).map(|(_, p)| *p)
    }
}

/// How one run goes.
#[derive(Debug, Clone, Copy)]
pub struct SimConfig {
    pub steps: usize,
    pub plant: Option<Plant>,
    /// Print every action and storage error (replaying a failing seed).
    pub trace: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig { steps: 200, plant: None, trace: false }
    }
}

/// What a run did.
#[derive(Debug, Default, Clone, Copy)]
pub struct Outcome {
    pub steps: usize,
    pub appends: u64,
    pub acked: u64,
    pub crashes: u64,
    pub restarts: u64,
    pub compactions: u64,
    pub retentions: u64,
    pub poisoned: u64,
    /// Batches idempotent producers appended, and answers they got (an
    /// ack, or a retry answered with the offsets first written).
    pub idempotent_appends: u64,
    pub producer_answers: u64,
    /// Epochs idempotent clients began after the engine answered
    /// UNKNOWN_PRODUCER_ID (a crash took its state with every batch).
    pub producer_epochs: u64,
    /// Catalog writes that failed (lost, or durable and reported failed).
    pub catalog_faults: u64,
    /// Transactional batches appended; transactions ended with every
    /// marker acknowledged (committed, aborted); transactional batches
    /// refused as they must be (a partition not added, a fenced epoch).
    pub txn_batches: u64,
    pub txn_commits: u64,
    pub txn_aborts: u64,
    pub txn_refusals: u64,
    /// Batches appended as a follower's copy (`append_at`), and those
    /// placed below the next offset and refused as they must be.
    pub placed_appends: u64,
    pub misplaced_refusals: u64,
    /// Leader epochs begun, and epochs refused as they must be (a leader's
    /// below the latest, a copy's going back).
    pub epochs_begun: u64,
    pub stale_epoch_refusals: u64,
    /// Truncations made, and refused as they must be.
    pub truncations: u64,
    pub refused_truncations: u64,
    /// Retention and compaction calls inside which the writer appended,
    /// flushed or synced.
    pub interleaved: u64,
    /// Segments recovery opened by their index file, and by walking.
    pub indexed_segments: u64,
    pub walked_segments: u64,
    pub disk: SimStats,
}

impl Outcome {
    /// Adds another run's counts to these (the disk's digests fold in
    /// order, so the same seeds in the same order give the same digest).
    pub fn add(&mut self, o: &Outcome) {
        self.steps += o.steps;
        self.appends += o.appends;
        self.acked += o.acked;
        self.crashes += o.crashes;
        self.restarts += o.restarts;
        self.compactions += o.compactions;
        self.retentions += o.retentions;
        self.poisoned += o.poisoned;
        self.idempotent_appends += o.idempotent_appends;
        self.producer_answers += o.producer_answers;
        self.producer_epochs += o.producer_epochs;
        self.catalog_faults += o.catalog_faults;
        self.txn_batches += o.txn_batches;
        self.txn_commits += o.txn_commits;
        self.txn_aborts += o.txn_aborts;
        self.txn_refusals += o.txn_refusals;
        self.placed_appends += o.placed_appends;
        self.misplaced_refusals += o.misplaced_refusals;
        self.epochs_begun += o.epochs_begun;
        self.stale_epoch_refusals += o.stale_epoch_refusals;
        self.truncations += o.truncations;
        self.refused_truncations += o.refused_truncations;
        self.interleaved += o.interleaved;
        self.indexed_segments += o.indexed_segments;
        self.walked_segments += o.walked_segments;
        self.disk.faults += o.disk.faults;
        self.disk.crashes += o.disk.crashes;
        self.disk.torn_writes += o.disk.torn_writes;
        self.disk.lost_writes += o.disk.lost_writes;
        self.disk.writes += o.disk.writes;
        self.disk.syncs += o.disk.syncs;
        self.disk.unsynced_drops += o.disk.unsynced_drops;
        self.disk.history = self.disk.history.rotate_left(7) ^ o.disk.history;
    }
}

/// A broken invariant: the seed, the step, what.
#[derive(Debug, Clone)]
pub struct Failure {
    pub seed: u64,
    pub step: usize,
    pub what: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "seed {} failed at step {}: {} (replay: cargo run --release --bin canopy-sim -- --seed {})", self.seed, self.step, self.what, self.seed)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Staged,
    /// Written by flush number n.
    Flushed(u64),
    Acked,
}

#[derive(Debug, Clone)]
struct MBatch {
    /// Its stream sequence number.
    seq: u64,
    base: i64,
    last: i64,
    /// As storage must return it (base offset patched).
    bytes: Vec<u8>,
    state: State,
    kind: Kind,
}

/// Who wrote a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Plain,
    /// An idempotent producer's: (producer id, epoch, base sequence).
    Idempotent(i64, i16, i32),
    /// The transactional producer's data: its epoch, base sequence and
    /// record count.
    TxnData(i16, i32, i32),
    /// A transaction marker of the transactional producer.
    TxnMarker(Marker),
}

/// Producer state is kept this long without use (the engine's default).
const PRODUCER_EXPIRY_MS: i64 = 7 * 24 * 3600 * 1000;

#[derive(Debug, Clone)]
struct MTp {
    batches: Vec<MBatch>,
    /// The log start the catalog holds.
    log_start: i64,
    /// The highest high watermark seen (since the last open, for a tp
    /// that keeps epochs: its restart goes back to its checkpoint).
    hw_seen: i64,
    /// The highest high watermark the tp had since its last cut: subtree
    /// stores hold nothing at or past it.
    hw_max: i64,
    /// The leader epochs storage must hold, before the cut to the log
    /// start (which the check applies).
    epochs: EpochCache,
}

impl MTp {
    fn next_offset(&self) -> i64 {
        self.batches.last().map_or(self.log_start, |b| b.last + 1)
    }
}

#[derive(Debug, Clone)]
struct MTopic {
    name: String,
    branch: String,
    retention_ms: Option<i64>,
    parts: Vec<MTp>,
}

/// The catalog as the engine keeps it (durable when written).
#[derive(Debug, Default, Clone)]
struct Catalog {
    windows: Vec<WindowRecord>,
}

/// One catalog write's fate (see `Sim::catalog_write`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CatalogWrite {
    Taken,
    /// Not durable, and reported as failed.
    Lost,
    /// Durable, and reported as failed all the same.
    TakenButFailed,
}

impl CatalogWrite {
    /// Runs `take` (the catalog keeps the write) unless the write is
    /// lost; answers as the catalog would.
    fn apply(self, trace: bool, what: &str, take: impl FnOnce()) -> Result<(), String> {
        if self != CatalogWrite::Lost {
            take();
        }
        if trace && self != CatalogWrite::Taken {
            eprintln!("  the catalog fails writing {what}: {self:?}");
        }
        match self {
            CatalogWrite::Taken => Ok(()),
            _ => Err(format!("simulated catalog failure ({self:?})")),
        }
    }
}

const DIR: &str = "/data";
const BRANCHES: [&str; 4] = ["app.a", "app.b", "ops", "x.y"];

struct Sim {
    seed: u64,
    rng: Rng,
    disk: SimDisk,
    faults: Faults,
    cfg: StorageConfig,
    plant: Option<Plant>,
    /// The open storage and its writer.
    storage: Option<(Arc<Storage>, LogWriter)>,
    topics: BTreeMap<TopicId, MTopic>,
    catalog: Catalog,
    now_ms: i64,
    /// Flushes written but not yet synced, in order.
    unsynced: Vec<(u64, Flushed)>,
    next_flush: u64,
    next_topic: u64,
    /// The engine's idempotent-producer state, restored at each open as the
    /// engine restores it (snapshot, then a replay of the log).
    producers: crate::engine::producers::Producers,
    txns: std::sync::RwLock<crate::engine::txns::Txns>,
    clients: BTreeMap<(i64, Tp), Client>,
    transactor: Transactor,
    /// Opens so far: an action that may crash and reopen storage midway
    /// (any append) stops when this moved.
    opens: u64,
    /// A truncation that failed writing its cut: (tp, where it cuts, the
    /// sequence number of the tp's last cut before it). Whether it holds
    /// is for recovery to say.
    pending_cut: Option<(Tp, i64, u64)>,
    /// What the high-watermark checkpoint may hold (`replica.rs`): one
    /// content, or several after writes that failed.
    hw_files: Vec<replica::HwFile>,
    out: Outcome,
    step: usize,
    trace: bool,
}

/// Runs one seed.
pub fn run(seed: u64, cfg: SimConfig) -> Result<Outcome, Failure> {
    let mut sim = Sim::new(seed, cfg.plant);
    sim.trace = cfg.trace;
    let result = (|| {
        sim.open()?;
        for step in 0..cfg.steps {
            sim.step = step;
            sim.act()?;
            sim.check()?;
        }
        // A last crash: everything acknowledged must survive it.
        sim.crash()?;
        sim.check()
    })();
    let step = sim.step;
    sim.out.steps = cfg.steps;
    sim.out.disk = sim.disk.stats();
    result.map(|_| sim.out).map_err(|what| Failure { seed, step, what })
}

type Check = Result<(), String>;

fn ensure(cond: bool, what: impl FnOnce() -> String) -> Check {
    if cond {
        Ok(())
    } else {
        Err(what())
    }
}

impl Sim {
    fn new(seed: u64, plant: Option<Plant>) -> Sim {
        // Storage's maps iterate in a fixed order, so it performs its file
        // operations in the same order at every replay.
        crate::storage::hashing::fix_seed_on_this_thread(seed);
        let mut rng = Rng::new(seed);
        // Half the seeds run on a faulty disk.
        let faults = if rng.below(2) == 0 {
            Faults::default()
        } else {
            Faults { write_eio: 1_000, nospc: 3_000, sync_eio: 3_000, emfile: 3_000, read_eio: 1_000 }
        };
        let disk = SimDisk::new(rng.next_u64(), Faults::default());
        // The data directory exists, as the operator (or the catalog) made it.
        disk.create_dir_all(Path::new(DIR)).and_then(|_| disk.sync_dir(Path::new("/"))).expect("a fresh simulated disk");
        disk.set_faults(faults);
        let cfg = StorageConfig {
            segment_bytes: [2 << 10, 8 << 10, 64 << 10][rng.below(3) as usize],
            segment_ms: [1_000, 60_000][rng.below(2) as usize],
            index_interval_bytes: [256, 4096][rng.below(2) as usize],
            index_checkpoint_bytes: [1 << 10, 16 << 10, 64 << 20][rng.below(3) as usize],
            tip: TipConfig { bytes: [0, 8 << 10, 1 << 20][rng.below(3) as usize], ..TipConfig::default() },
            max_open_files: [2, 4, 64][rng.below(3) as usize],
            hold_until_sync: rng.below(4) != 0,
            // No page cache here; a window of nothing drops every synced
            // page at the next sync, and the disk checks each drop is of
            // durable bytes only.
            page_cache_bytes: 0,
            disk: Arc::new(disk.clone()),
            planted: match plant {
                Some(Plant::Storage(p)) => Some(p),
                _ => None,
            },
        };
        Sim {
            seed,
            rng,
            disk,
            faults,
            cfg,
            plant,
            storage: None,
            topics: BTreeMap::new(),
            catalog: Catalog::default(),
            now_ms: 1_700_000_000_000,
            unsynced: Vec::new(),
            next_flush: 0,
            next_topic: 0,
            producers: Default::default(),
            txns: Default::default(),
            clients: BTreeMap::new(),
            transactor: Transactor::default(),
            opens: 0,
            pending_cut: None,
            hw_files: vec![replica::HwFile::new()],
            out: Outcome::default(),
            step: 0,
            trace: false,
        }
    }

    fn storage(&self) -> &Storage {
        &self.storage.as_ref().expect("storage open").0
    }

    fn writer(&mut self) -> &mut LogWriter {
        &mut self.storage.as_mut().expect("storage open").1
    }

    fn specs(&self) -> Vec<PartitionSpec> {
        let mut v = Vec::new();
        for (id, t) in &self.topics {
            for (p, mtp) in t.parts.iter().enumerate() {
                v.push(PartitionSpec { tp: Tp { topic: *id, partition: p as i32 }, branch: t.branch.clone(), log_start: mtp.log_start });
            }
        }
        v
    }

    fn tps(&self) -> Vec<Tp> {
        self.topics.iter().flat_map(|(id, t)| (0..t.parts.len()).map(move |p| Tp { topic: *id, partition: p as i32 })).collect()
    }

    fn mtp(&mut self, tp: &Tp) -> &mut MTp {
        &mut self.topics.get_mut(&tp.topic).expect("model topic").parts[tp.partition as usize]
    }

    /// Opens storage; with faults on, a failing open is retried on a
    /// healthy disk after a power cycle (an operator fixing the disk and
    /// rebooting), which must succeed. Without the power cycle the retry
    /// would trust pages that a failed fsync left in the page cache but not
    /// on disk (Linux's fsync error semantics): no storage engine survives
    /// that, so the simulator does not ask it to.
    /// The previous stop was clean when its marker is there (as the engine
    /// decides); an open that trusted it removes it before anything else.
    fn open(&mut self) -> Check {
        let dir = Path::new(DIR);
        let mut attempt = 0;
        // Storage, then the engine's producer state (the snapshot, cut to
        // what the log kept, then the log after it replayed): a start
        // fails if either does.
        let (storage, producers, txns) = loop {
            let clean = Storage::stopped_cleanly(dir, &self.cfg);
            let opened = Storage::open_with(dir, self.cfg.clone(), self.specs(), clean, Some(&self.catalog.windows))
                .and_then(|s| s.0.clear_clean_marker().map(|_| s))
                .map_err(|e| e.to_string())
                .and_then(|s| crate::engine::restore_producers(&s.0, self.now_ms, PRODUCER_EXPIRY_MS).map(|(p, t)| (s, p, t)).map_err(|e| format!("restoring producer state: {e}")));
            match opened {
                Ok(s) => break s,
                Err(e) if attempt == 0 && self.faulty() => {
                    attempt += 1;
                    if self.trace {
                        eprintln!("  recovery failed on the faulty disk: {e}; again on a healthy one after a power cycle");
                    }
                    self.disk.set_faults(Faults::default());
                    self.disk.crash();
                }
                Err(e) => return Err(format!("recovery failed: {e}")),
            }
        };
        self.disk.set_faults(self.faults);
        let r = storage.0.recovery_report();
        self.out.indexed_segments += r.indexed_segments as u64;
        self.out.walked_segments += (r.segments - r.indexed_segments) as u64;
        self.storage = Some(storage);
        self.producers = producers;
        self.txns = std::sync::RwLock::new(txns);
        self.unsynced.clear();
        self.opens += 1;
        // A truncation that failed midway: the cut holds if recovery has it.
        if let Some((tp, at, before)) = self.pending_cut.take() {
            // (`>=`: a cut again before anything was written merges into
            // the one before, with the same sequence number.)
            if self.topics.contains_key(&tp.topic) && self.storage().cuts_of(&tp).iter().any(|c| c.seq >= before && c.end == at) {
                self.cut_model(tp, at);
            }
        }
        // Every client's connection broke: what it has in flight goes again.
        for c in self.clients.values_mut() {
            c.resend = true;
        }
        self.after_recovery()?;
        self.recover_txns()
    }

    fn faulty(&self) -> bool {
        self.faults.write_eio + self.faults.nospc + self.faults.sync_eio + self.faults.emfile + self.faults.read_eio > 0
    }

    /// After an open: what survived is what was acknowledged plus a prefix
    /// of the rest; the model drops the rest; every file is accounted for.
    fn after_recovery(&mut self) -> Check {
        for tp in self.tps() {
            let (log_start, _, leo) = self.storage().offsets(&tp).ok_or_else(|| format!("{tp:?} missing after recovery"))?;
            let m = self.mtp(&tp);
            let acked_end = m.batches.iter().rev().find(|b| b.state == State::Acked).map_or(m.log_start, |b| b.last + 1);
            ensure(leo >= acked_end, || format!("{tp:?}: log end {leo} after recovery is below the acknowledged end {acked_end}"))?;
            ensure(log_start >= m.log_start, || format!("{tp:?}: log start {log_start} went back below {}", m.log_start))?;
            // Survivors: whole batches, a prefix of what was appended.
            let cut = m.batches.iter().position(|b| b.base >= leo).unwrap_or(m.batches.len());
            ensure(cut == m.batches.len() || m.batches[cut].base == leo, || format!("{tp:?}: log end {leo} after recovery is inside a batch"))?;
            let survivors_end = if cut == 0 { m.batches.first().map_or(m.log_start, |b| b.base) } else { m.batches[cut - 1].last + 1 };
            ensure(leo == survivors_end, || format!("{tp:?}: log end {leo} after recovery, but the batches that survived end at {survivors_end}"))?;
            m.batches.truncate(cut);
            // As recovery cuts them: to the log start, then the log end.
            m.epochs.truncate_from_start(log_start);
            m.epochs.truncate_from_end(leo);
            for b in &mut m.batches {
                b.state = State::Acked;
            }
            m.log_start = m.log_start.max(log_start);
        }
        self.recovered_hws()?;
        self.check_files()
    }

    fn check_files(&self) -> Check {
        let s = self.storage();
        let (log, indexes): (Vec<PathBuf>, Vec<PathBuf>) = self.disk.files_under(&Path::new(DIR).join("log")).into_iter().partition(|f| f.extension().is_none_or(|x| x != "idx"));
        for f in &log {
            let name = f.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let in_branch = f.parent().and_then(|p| p.file_name()).is_some_and(|d| d.to_string_lossy().ends_with(".br"));
            ensure(in_branch && name.ends_with(".seg"), || format!("unaccounted file {}", f.display()))?;
        }
        // A segment's index file lives and dies with its segment.
        for f in &indexes {
            ensure(log.contains(&f.with_extension("seg")), || format!("index file {} without its segment", f.display()))?;
        }
        ensure(log.len() == s.segment_count(), || format!("{} segment files on disk, {} segments in storage", log.len(), s.segment_count()))?;
        let mut listed: Vec<String> = self.catalog.windows.iter().flat_map(|w| w.stores.iter().filter(|st| st.live).map(move |st| store::file_name(w.window, st.store))).collect();
        listed.sort();
        let mut found: Vec<String> = self.disk.files_under(&Path::new(DIR).join("stores")).iter().filter_map(|f| f.file_name().map(|n| n.to_string_lossy().into_owned())).collect();
        found.sort();
        ensure(found == listed, || format!("store files {found:?}, catalog lists {listed:?}"))?;
        ensure(s.store_count() == listed.len(), || format!("{} stores open, {} listed", s.store_count(), listed.len()))
    }

    /// One random action.
    fn act(&mut self) -> Check {
        self.now_ms += self.rng.below(400) as i64;
        let roll = self.rng.below(100);
        if self.trace {
            let what = match roll {
                0..=3 => "create topic",
                4 => "delete topic",
                5..=21 => "append",
                22..=29 => "transaction",
                30..=44 => "idempotent append",
                45..=59 => "flush",
                60..=71 => "sync",
                72..=80 => "read",
                81..=84 => "read subtree stream",
                85..=88 => "retention",
                89..=92 => "compact",
                93..=95 => "clean restart",
                _ => "crash",
            };
            eprintln!("step {} at {} ms: {what}", self.step, self.now_ms);
        }
        match roll {
            0..=3 => self.create_topic(),
            4 => self.delete_topic(),
            5..=21 => self.append(),
            22..=29 => self.transact(),
            30..=44 => self.idempotent_append(),
            45..=59 => self.flush(),
            60..=71 => self.sync(),
            72..=80 => self.read(),
            81..=84 => self.read_stream(),
            85..=88 => self.retention(),
            89..=92 => self.compact(),
            93..=95 => self.clean_restart(),
            _ => self.crash(),
        }
    }

    fn create_topic(&mut self) -> Check {
        if self.topics.len() >= 12 {
            return Ok(());
        }
        self.next_topic += 1;
        let mut id = [0u8; 16];
        id[..8].copy_from_slice(&self.seed.to_be_bytes());
        id[8..].copy_from_slice(&self.next_topic.to_be_bytes());
        let branch = BRANCHES[self.rng.below(BRANCHES.len() as u64) as usize];
        let name = format!("{branch}.t{}", self.next_topic);
        let partitions = 1 + self.rng.below(3) as usize;
        let retention_ms = [None, Some(2_000), Some(20_000)][self.rng.below(3) as usize];
        for p in 0..partitions {
            self.storage().add_partition(PartitionSpec { tp: Tp { topic: id, partition: p as i32 }, branch: branch.to_owned(), log_start: 0 });
        }
        let parts = vec![MTp { batches: Vec::new(), log_start: 0, hw_seen: 0, hw_max: 0, epochs: EpochCache::default() }; partitions];
        self.topics.insert(id, MTopic { name, branch: branch.to_owned(), retention_ms, parts });
        Ok(())
    }

    fn delete_topic(&mut self) -> Check {
        let Some(id) = self.pick_topic() else { return Ok(()) };
        let partitions = self.topics[&id].parts.len() as i32;
        if let Err(e) = self.writer().apply(crate::storage::Switch::remove_topic(id, partitions)) {
            return Err(format!("deleting a topic failed: {e}"));
        }
        self.topics.remove(&id);
        self.clients.retain(|(_, tp), _| tp.topic != id);
        self.txns.write().expect("txns lock").remove_topic(&id);
        self.transactor.seqs.retain(|tp, _| tp.topic != id);
        Ok(())
    }

    fn pick_topic(&mut self) -> Option<TopicId> {
        if self.topics.is_empty() {
            return None;
        }
        let i = self.rng.below(self.topics.len() as u64) as usize;
        self.topics.keys().nth(i).copied()
    }

    fn pick_tp(&mut self) -> Option<Tp> {
        let id = self.pick_topic()?;
        let n = self.topics[&id].parts.len() as u64;
        Some(Tp { topic: id, partition: self.rng.below(n) as i32 })
    }

    fn append(&mut self) -> Check {
        let Some(tp) = self.pick_tp() else { return self.create_topic() };
        let mut bytes = self.plain_batch();
        let state = if self.plant == Some(Plant::AckBeforeFlush) { State::Acked } else { State::Staged };
        if self.rng.below(16) == 0 {
            self.begin_epoch(tp)?;
        }
        if self.rng.below(12) == 0 {
            return self.truncate(tp);
        }
        if self.rng.below(4) == 0 {
            // As a follower copies its leader's batch: placed at the offset
            // the model expects (`append_at`), after, now and then, one
            // placed below it, which must be refused and change nothing.
            let next = self.mtp(&tp).next_offset();
            if next > 0 && self.rng.below(3) == 0 {
                let mut below = bytes.clone();
                batch::set_base_offset(&mut below, next - 1 - self.rng.below(next as u64) as i64);
                let now = self.now_ms;
                match self.writer().append_at(tp, &below, now) {
                    Err(StorageError::Misplaced(_)) => self.out.misplaced_refusals += 1,
                    Ok(a) => return Err(format!("{tp:?}: a batch placed below the next offset {next} was taken at {}", a.base_offset)),
                    Err(e) => return self.poisoned(e),
                }
                ensure(self.writer().next_offset(&tp) == Some(next), || format!("{tp:?}: a refused placement moved the next offset from {next}"))?;
            }
            batch::set_base_offset(&mut bytes, next);
            // The leader's epoch: none (single-node), the latest, a newer
            // one (which starts here), or, now and then, an older one,
            // refused like a misplaced batch.
            let latest = self.mtp(&tp).epochs.latest().map_or(-1, |l| l.epoch);
            if latest > 0 && self.rng.below(8) == 0 {
                let mut older = bytes.clone();
                batch::set_partition_leader_epoch(&mut older, self.rng.below(latest as u64) as i32);
                let now = self.now_ms;
                match self.writer().append_at(tp, &older, now) {
                    Err(StorageError::Misplaced(_)) => self.out.stale_epoch_refusals += 1,
                    Ok(_) => return Err(format!("{tp:?}: a copy of an epoch below {latest} was taken")),
                    Err(e) => return self.poisoned(e),
                }
            }
            let epoch = match self.rng.below(4) {
                0 if latest < 0 => -1,
                0 => latest + 1,
                _ => latest,
            };
            batch::set_partition_leader_epoch(&mut bytes, epoch);
            let placed = self.append_batch_at(tp, bytes, state, Kind::Plain, true)?;
            if placed.is_some_and(|a| epoch >= 0 && a.base_offset == next) {
                self.mtp(&tp).epochs.assign(epoch, next);
            }
            self.out.placed_appends += placed.is_some() as u64;
            return Ok(());
        }
        self.append_batch(tp, bytes, state, Kind::Plain).map(drop)
    }

    /// One to four random records.
    fn plain_batch(&mut self) -> Vec<u8> {
        let n = 1 + self.rng.below(4) as usize;
        let values: Vec<Vec<u8>> = (0..n)
            .map(|_| {
                let len = self.rng.below(300) as usize;
                (0..len).map(|_| self.rng.next_u64() as u8).collect()
            })
            .collect();
        let records: Vec<batch::NewRecord<'_>> = values.iter().map(|v| batch::NewRecord { value: Some(v), ..Default::default() }).collect();
        batch::build(&records, self.now_ms)
    }

    /// Appends `bytes` to `tp`, checks that its offsets follow the model's,
    /// and adds it to the model as `state`. `None`: storage was out of
    /// descriptors or space and staged nothing, or it refused for good and
    /// the machine was power-cycled.
    fn append_batch(&mut self, tp: Tp, bytes: Vec<u8>, state: State, kind: Kind) -> Result<Option<crate::storage::Appended>, String> {
        self.append_batch_at(tp, bytes, state, kind, false)
    }

    /// `append_batch`; `placed`: as a follower's copy, at the batch's own
    /// base offset.
    fn append_batch_at(&mut self, tp: Tp, bytes: Vec<u8>, state: State, kind: Kind, placed: bool) -> Result<Option<crate::storage::Appended>, String> {
        let now = self.now_ms;
        let appended = if placed { self.writer().append_at(tp, &bytes, now) } else { self.writer().append(tp, &bytes, now, false) };
        match appended {
            // Placed where the model expects: never misplaced, faults or not.
            Err(StorageError::Misplaced(why)) => Err(format!("{tp:?}: a copy placed at the model's next offset was refused: {why}")),
            Ok(a) => {
                self.appended(tp, bytes, &a, state, kind, placed)?;
                Ok(Some(a))
            }
            Err(StorageError::Exhausted { .. }) => Ok(None),
            Err(e) => self.poisoned(e).map(|_| None),
        }
    }

    /// The model after an append: its offsets follow the model's, and it
    /// joins the model as `state`.
    /// `placed`: a follower's copy (`append_at`).
    fn appended(&mut self, tp: Tp, mut bytes: Vec<u8>, a: &crate::storage::Appended, state: State, kind: Kind, placed: bool) -> Check {
        let expected = self.mtp(&tp).next_offset();
        let records = batch::BatchHeader::parse(&bytes).map_err(|e| format!("a batch the simulator built does not parse: {e:?}"))?.last_offset_delta as i64 + 1;
        ensure(a.base_offset == expected, || format!("{tp:?}: append got offset {}, the model expects {expected}", a.base_offset))?;
        ensure(a.last_offset == expected + records - 1, || format!("{tp:?}: {records} records end at {}", a.last_offset))?;
        batch::set_base_offset(&mut bytes, a.base_offset);
        // A leader's append carries its latest epoch; a copy keeps its own.
        if let Some(l) = self.mtp(&tp).epochs.latest().filter(|_| !placed) {
            batch::set_partition_leader_epoch(&mut bytes, l.epoch);
        }
        self.mtp(&tp).batches.push(MBatch { seq: a.seq, base: a.base_offset, last: a.last_offset, bytes, state, kind });
        self.out.appends += 1;
        Ok(())
    }

    /// Storage refused for good: the operator restarts the machine (a power
    /// cycle, for the reason `open` gives).
    fn poisoned(&mut self, e: StorageError) -> Check {
        if self.trace {
            eprintln!("  storage refused: {e}");
        }
        ensure(self.faulty(), || format!("storage failed on a healthy disk: {e}"))?;
        self.out.poisoned += 1;
        self.crash()
    }

    fn flush(&mut self) -> Check {
        match self.writer().flush() {
            Ok(f) => {
                self.flushed(f);
                // The engine snapshots producer state after a flush when one
                // is due (every 30 s or so).
                if self.rng.below(4) == 0 {
                    crate::engine::snapshot_producers(&self.producers, &self.txns.read().expect("txns lock"), self.storage());
                }
                Ok(())
            }
            Err(e) => self.poisoned(e),
        }
    }

    /// The model after a flush: everything staged is written by it.
    fn flushed(&mut self, f: Flushed) {
        let n = self.next_flush;
        self.next_flush += 1;
        for t in self.topics.values_mut() {
            for m in &mut t.parts {
                for b in m.batches.iter_mut().filter(|b| b.state == State::Staged) {
                    b.state = State::Flushed(n);
                }
            }
        }
        self.unsynced.push((n, f));
    }

    /// Syncs, then publishes and acknowledges what the flushes before it
    /// wrote (the engine's syncer).
    fn sync(&mut self) -> Check {
        match self.storage().sync() {
            Ok(_) => {
                for (_, f) in &self.unsynced {
                    self.storage().publish_hw(f);
                }
                self.synced();
                // Replication's part: a cap on a replicated tp's hw, and
                // the engine's checkpoint of them now and then.
                self.cap_hw()?;
                if self.rng.below(3) == 0 {
                    self.checkpoint_hws()?;
                }
                Ok(())
            }
            Err(e) => self.poisoned(e),
        }
    }

    /// The model after a sync (and the publishing of every flush before
    /// it): what those flushes wrote is acknowledged.
    fn synced(&mut self) {
        let upto = self.next_flush;
        self.unsynced.clear();
        let mut answered = Vec::new();
        for (id, t) in self.topics.iter_mut() {
            for (p, m) in t.parts.iter_mut().enumerate() {
                for b in &mut m.batches {
                    if matches!(b.state, State::Flushed(n) if n < upto) {
                        b.state = State::Acked;
                        self.out.acked += 1;
                        if let Kind::Idempotent(pid, epoch, seq) = b.kind {
                            answered.push((pid, Tp { topic: *id, partition: p as i32 }, epoch, seq));
                        }
                    }
                }
            }
        }
        for (pid, tp, epoch, seq) in answered {
            self.answered(pid, tp, epoch, seq);
        }
        self.complete_txn();
    }

    fn read(&mut self) -> Check {
        let Some(tp) = self.pick_tp() else { return Ok(()) };
        self.read_all(tp)
    }

    /// Reads `tp` from its log start to its high watermark and compares.
    fn read_all(&mut self, tp: Tp) -> Check {
        let Some((log_start, hw, _)) = self.storage().offsets(&tp) else { return Err(format!("{tp:?} unknown to storage")) };
        let max = [1usize, 500, 1 << 20][self.rng.below(3) as usize];
        let m = self.mtp(&tp).clone();
        let mut i = m.batches.partition_point(|b| b.last < log_start);
        let mut at = log_start;
        while at < hw {
            let r = match self.storage().read(&tp, at, max, true) {
                Ok(r) => r,
                // A read failed on the faulty disk: nothing to compare.
                Err(crate::storage::ReadError::Io(_)) if self.faulty() => return Ok(()),
                Err(e) => return Err(format!("{tp:?}: read at {at} failed: {e}")),
            };
            ensure(!r.records.is_empty(), || format!("{tp:?}: read at {at} below the high watermark {hw} returned nothing"))?;
            for got in &r.records {
                let Some(want) = m.batches.get(i) else { return Err(format!("{tp:?}: read returned a batch past every batch appended (at {at})")) };
                ensure(want.state != State::Staged, || format!("{tp:?}: read returned batch {} before its flush", want.base))?;
                ensure(got[..] == want.bytes[..], || format!("{tp:?}: batch at {} differs from what was appended", want.base))?;
                i += 1;
                at = want.last + 1;
            }
            ensure(r.next_offset == at, || format!("{tp:?}: next offset {} != {at}", r.next_offset))?;
        }
        Ok(())
    }

    /// Reads a random set of branches in arrival order (the n-way merge over
    /// tip, segments and stores) and compares with the model: every visible
    /// batch of their live topics at or past its log start, by sequence
    /// number, byte for byte.
    fn read_stream(&mut self) -> Check {
        let mask = 1 + self.rng.below((1 << BRANCHES.len()) - 1);
        let branches: Vec<String> = BRANCHES.iter().enumerate().filter(|(i, _)| mask >> i & 1 == 1).map(|(_, b)| b.to_string()).collect();
        let max = [1usize, 700, 1 << 20][self.rng.below(3) as usize];
        let s = self.storage();
        let starts: BTreeMap<Tp, i64> = self.tps().into_iter().filter_map(|tp| s.offsets(&tp).map(|o| (tp, o.0))).collect();
        let visible = s.visible_seq();
        let mut got: Vec<(u64, Tp, Vec<u8>)> = Vec::new();
        let mut at = s.stream_start(&branches);
        let mut reads = 0;
        while at < visible {
            reads += 1;
            ensure(reads <= 100_000, || format!("subtree read of {branches:?} makes no progress at {at}"))?;
            let mut pick = |_: u64, tp: &Tp, last: i64, _: &[u8]| if starts.get(tp).is_some_and(|&start| last >= start) { Pick::Take } else { Pick::Skip };
            let r = match s.read_stream(&branches, at, max, true, &mut pick) {
                Ok(r) => r,
                Err(crate::storage::ReadError::Io(_)) if self.faulty() => return Ok(()),
                Err(e) => return Err(format!("subtree read of {branches:?} at {at} failed: {e}")),
            };
            let next = if r.cut { r.batches.last().map_or(at, |m| m.seq + 1) } else { r.examined_to };
            ensure(next > at, || format!("subtree read of {branches:?} at {at} did not move"))?;
            got.extend(r.batches.into_iter().map(|m| (m.seq, m.tp, m.bytes.to_vec())));
            at = next;
        }
        let mut want: Vec<(u64, Tp, Vec<u8>)> = Vec::new();
        for (id, t) in &self.topics {
            if !branches.contains(&t.branch) {
                continue;
            }
            for (p, m) in t.parts.iter().enumerate() {
                let tp = Tp { topic: *id, partition: p as i32 };
                let start = starts[&tp];
                want.extend(m.batches.iter().filter(|b| b.seq < visible && b.last >= start).map(|b| (b.seq, tp, b.bytes.clone())));
            }
        }
        want.sort_by_key(|w| w.0);
        if got != want && self.trace {
            let short = |v: &[(u64, Tp, Vec<u8>)]| v.iter().map(|(s, tp, b)| (*s, tp.topic[15], tp.partition, b.len())).collect::<Vec<_>>();
            eprintln!("  from {} visible {visible}: got {:?}\n  want {:?}", s.stream_start(&branches), short(&got), short(&want));
        }
        if got != want {
            let first = got.iter().zip(&want).position(|(g, w)| g != w).unwrap_or(got.len().min(want.len()));
            return Err(format!(
                "subtree read of {branches:?} differs at item {first}: got {} batches, want {} (got {:?}, want {:?})",
                got.len(),
                want.len(),
                got.get(first).map(|g| (g.0, g.1.partition)),
                want.get(first).map(|w| (w.0, w.1.partition))
            ));
        }
        Ok(())
    }

    /// How the catalog answers the next write: on a faulty disk, now and
    /// then it fails, before the write was durable or after (sled flushed,
    /// then reported an error): storage cannot tell the two apart.
    fn catalog_write(&mut self) -> CatalogWrite {
        if !self.faulty() || self.rng.below(8) != 0 {
            return CatalogWrite::Taken;
        }
        self.out.catalog_faults += 1;
        [CatalogWrite::Lost, CatalogWrite::TakenButFailed][self.rng.below(2) as usize]
    }

    fn retention(&mut self) -> Check {
        self.out.retentions += 1;
        let policies: BTreeMap<TopicId, Option<i64>> = self.topics.iter().map(|(id, t)| (*id, t.retention_ms)).collect();
        let mut persisted: Vec<(Tp, i64)> = Vec::new();
        let mut dropped: Vec<(u64, u32)> = Vec::new();
        let (starts_write, stores_write) = (self.catalog_write(), self.catalog_write());
        let trace = self.trace;
        // The writer and syncer go on meanwhile: between retention's plan
        // and its changes, or before it drops stores.
        let work = std::cell::RefCell::new(self.interleaved_work());
        let at_drop = self.rng.below(2) == 0;
        let (now, unsynced) = (self.now_ms, self.unsynced.clone());
        let (storage, writer) = self.storage.as_mut().expect("storage open");
        let storage = storage.clone();
        let writer = std::cell::RefCell::new(writer);
        let interleave = |at: bool| {
            if let (true, Some(w)) = (at, work.borrow_mut().as_mut()) {
                w.run(&storage, &mut writer.borrow_mut(), &unsynced, now);
            }
        };
        let r = storage.enforce_retention(
            now,
            |tp| RetentionPolicy { retention_ms: policies.get(&tp.topic).copied().flatten(), retention_bytes: None },
            |starts| {
                interleave(!at_drop);
                starts_write.apply(trace, "log starts", || persisted.extend_from_slice(starts))
            },
            |keys| {
                interleave(at_drop);
                stores_write.apply(trace, "dropped stores", || dropped.extend_from_slice(keys))
            },
            &mut |sw| writer.borrow_mut().apply(sw),
        );
        // Retention retires only what its policy lets go: every batch
        // below a new log start (and at or past the old one) expired.
        if let Ok((starts, _)) = &r {
            for (tp, start) in starts {
                let Some(Some(ms)) = self.topics.get(&tp.topic).map(|t| t.retention_ms) else { continue };
                let m = self.mtp(tp);
                if let Some(b) = m.batches.iter().filter(|b| b.base < *start && b.last >= m.log_start).find(|b| batch::BatchHeader::parse(&b.bytes).map_or(true, |h| h.max_timestamp >= now - ms)) {
                    return Err(format!("{tp:?}: retention moved the log start to {start}, past the batch {}..={} that has not expired", b.base, b.last));
                }
            }
        }
        // The catalog took what storage handed it, whatever came next.
        for (tp, start) in persisted {
            if self.topics.contains_key(&tp.topic) {
                let m = self.mtp(&tp);
                m.log_start = m.log_start.max(start);
            }
        }
        for w in &mut self.catalog.windows {
            for st in &mut w.stores {
                if dropped.contains(&(w.window, st.store)) {
                    st.live = false;
                }
            }
        }
        // The engine forgets aborted transactions below the new log starts.
        if let Ok((starts, _)) = &r {
            let mut t = self.txns.write().expect("txns lock");
            for (tp, start) in starts {
                t.trim(tp, *start);
            }
        }
        let opens = self.opens;
        if let Some(w) = work.into_inner() {
            self.absorb(w)?;
        }
        match r {
            // The interleaved work failed and the machine was restarted:
            // what retention answered no longer matters.
            _ if self.opens != opens => Ok(()),
            Ok(_) => Ok(()),
            Err(e) => self.poisoned(e),
        }
    }

    fn compact(&mut self) -> Check {
        let names: BTreeMap<TopicId, String> = self.topics.iter().map(|(id, t)| (*id, t.name.clone())).collect();
        let cfg = CompactConfig { lag_ms: 1_000, strategy: Strategy::Adaptive(Default::default()), max_bytes: 1 << 20 };
        let mut record = None;
        let (window_write, trace) = (self.catalog_write(), self.trace);
        // The writer and syncer go on meanwhile, at one of compaction's
        // steps (between its catalog write and the readers' switch, say).
        let work = std::cell::RefCell::new(self.interleaved_work());
        let at = Step::ALL[self.rng.below(Step::ALL.len() as u64) as usize];
        let (now, unsynced) = (self.now_ms, self.unsynced.clone());
        let (storage, writer) = self.storage.as_mut().expect("storage open");
        let storage = storage.clone();
        let writer = std::cell::RefCell::new(writer);
        let r = storage.compact_until(
            now,
            &cfg,
            |id| names.get(id).cloned(),
            &mut |_| true,
            |w| window_write.apply(trace, "a compaction window", || record = Some(w.clone())),
            &mut |sw| writer.borrow_mut().apply(sw),
            &mut |step| {
                if step == at {
                    if let Some(w) = work.borrow_mut().as_mut() {
                        w.run(&storage, &mut writer.borrow_mut(), &unsynced, now);
                    }
                }
                false
            },
        );
        if let Some(w) = record {
            self.catalog.windows.push(w);
        }
        // The hws compaction may have seen (the writer published meanwhile),
        // before anything can crash.
        self.note_hws();
        if self.trace {
            eprintln!("  compaction: {:?}", r.as_ref().map(|c| c.as_ref().map(|c| (c.window.window, c.segments))));
        }
        let opens = self.opens;
        if let Some(w) = work.into_inner() {
            self.absorb(w)?;
        }
        if self.opens != opens {
            return Ok(());
        }
        match r {
            Ok(Some(_)) => {
                self.out.compactions += 1;
                Ok(())
            }
            Ok(None) => Ok(()),
            Err(e) => self.poisoned(e),
        }
    }

    fn clean_restart(&mut self) -> Check {
        // A clean shutdown writes its last round and syncs first (the
        // engine's drain), then marks the stop clean; without the mark the
        // next open scans deep. The producer snapshot comes after the
        // flush, as the writer's last one does: taken before it, it would
        // speak of batches (a marker closing a transaction) that the
        // restart then loses.
        let opens = self.opens;
        self.flush()?;
        if self.opens != opens {
            return Ok(());
        }
        if let Err(e) = self.storage().sync() {
            return self.poisoned(e);
        }
        // The writer's last snapshot, then the marker.
        crate::engine::snapshot_producers(&self.producers, &self.txns.read().expect("txns lock"), self.storage());
        let _ = self.storage().mark_clean();
        for t in self.topics.values_mut() {
            for m in &mut t.parts {
                for b in m.batches.iter_mut().filter(|b| matches!(b.state, State::Flushed(_))) {
                    b.state = State::Acked;
                }
            }
        }
        self.out.restarts += 1;
        self.storage = None;
        self.open()
    }

    fn crash(&mut self) -> Check {
        self.out.crashes += 1;
        self.storage = None;
        self.disk.crash();
        self.open()
    }

    /// The invariants that hold between any two steps.
    fn check(&mut self) -> Check {
        let bad = self.disk.stats().unsynced_drops;
        ensure(bad == 0, || format!("storage asked the page cache to drop bytes not yet durable ({bad} times)"))?;
        for tp in self.tps() {
            let Some((log_start, hw, leo)) = self.storage().offsets(&tp) else { return Err(format!("{tp:?} unknown to storage")) };
            ensure(log_start <= hw && hw <= leo, || format!("{tp:?}: log start {log_start}, high watermark {hw}, log end {leo} out of order"))?;
            let m = self.mtp(&tp);
            ensure(hw >= m.hw_seen, || format!("{tp:?}: high watermark went back from {} to {hw}", m.hw_seen))?;
            m.hw_seen = hw;
            m.hw_max = m.hw_max.max(hw);
            let hw_max = m.hw_max;
            let model_end = m.next_offset();
            let stored = self.storage().stored_to(&tp);
            ensure(stored.is_none_or(|l| l < hw_max), || format!("{tp:?}: subtree stores hold offset {stored:?}, at or past every high watermark the tp had since its last cut ({hw_max})"))?;
            ensure(hw <= model_end, || format!("{tp:?}: high watermark {hw} past everything appended ({model_end})"))?;
            ensure(leo <= model_end, || format!("{tp:?}: log end {leo} past everything appended ({model_end})"))?;
            let mut expected = self.mtp(&tp).epochs.clone();
            expected.truncate_from_start(log_start);
            let held = self.storage().epochs(&tp).unwrap_or_default();
            ensure(held == expected.entries(), || format!("{tp:?}: leader epochs {held:?}, the model has {:?} from log start {log_start}", expected.entries()))?;
        }
        self.check_txns()?;
        // One partition read whole per step keeps the cost linear.
        if let Some(tp) = self.pick_tp() {
            self.read_all(tp)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
