//! Switches: changes to what readers see of the log that maintenance
//! prepares and only the writer applies.
//!
//! Retention and compaction do their slow work on the maintenance thread:
//! retention decides which log starts rise and which files nothing retained
//! lives in, compaction copies segments into stores and records the window
//! in the catalog. What then changes for readers (a log start, a branch's
//! segment list, a tp's index and stores, the store list) is a [`Switch`]
//! handed to the writer, which applies it between two of its commands
//! ([`LogWriter::apply`]). So every change to the log's structure, the
//! writer's rolls and flushes and maintenance's switches alike, is made by
//! one thread, in one order; maintenance deletes the files only after the
//! writer has switched readers away from them.
//!
//! ```text
//!  maintenance: plan / copy ─► catalog ─► Switch ──► writer: apply ──► maintenance: delete files
//! ```
//!
//! A topic's deletion is a switch too: its partitions leave the registry
//! and the writer's state in one step of the writer.

use std::fmt;

use super::*;

/// A change prepared by maintenance for the writer to apply.
pub struct Switch(pub(super) Change);

pub(super) enum Change {
    /// Retention: log starts rise (already durable in the catalog).
    LogStarts(Vec<(Tp, i64)>),
    /// Retention: sealed segments nothing retained lives in leave their
    /// branches, their index entries first.
    DropSegments(Vec<(Arc<Branch>, Vec<Arc<Segment>>)>),
    /// Retention: stores nothing retained lives in leave the tps and the
    /// store list (already out of the catalog).
    DropStores(Vec<Arc<StoreFile>>),
    /// Compaction: the window's stores in and, per branch, the segments
    /// below its first live one out (the window is durable in the
    /// catalog).
    Compacted { opened: Vec<Arc<StoreFile>>, first_live: Vec<(Arc<Branch>, u64)> },
    /// Cleaning: its stores in, in the place of the stores they replace
    /// (the window is durable in the catalog).
    Cleaned { opened: Vec<Arc<StoreFile>>, replaced: Vec<Arc<StoreFile>> },
    /// A topic's deletion: its partitions leave the registry and the
    /// writer's state.
    RemoveTopic { topic: TopicId, partitions: i32 },
}

impl Switch {
    /// Log starts rise (DeleteRecords): what the catalog already records.
    pub fn log_starts(starts: Vec<(Tp, i64)>) -> Switch {
        Switch(Change::LogStarts(starts))
    }

    /// Deletes partitions `0..partitions` of `topic`: appends to them are
    /// refused from now on, readers no longer find them. Their frames stay
    /// in shared segments until retention deletes those files.
    pub fn remove_topic(topic: TopicId, partitions: i32) -> Switch {
        Switch(Change::RemoveTopic { topic, partitions })
    }
}

impl fmt::Debug for Switch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Change::LogStarts(starts) => write!(f, "Switch::LogStarts({} tps)", starts.len()),
            Change::DropSegments(d) => write!(f, "Switch::DropSegments({} segments)", d.iter().map(|(_, s)| s.len()).sum::<usize>()),
            Change::DropStores(d) => write!(f, "Switch::DropStores({} stores)", d.len()),
            Change::Compacted { opened, first_live } => write!(f, "Switch::Compacted({} stores, {} branches)", opened.len(), first_live.len()),
            Change::Cleaned { replaced, .. } => write!(f, "Switch::Cleaned({} stores)", replaced.len()),
            Change::RemoveTopic { partitions, .. } => write!(f, "Switch::RemoveTopic({partitions} partitions)"),
        }
    }
}

/// How maintenance hands a switch to the writer and waits until it is
/// applied: the engine sends it to its writer thread; a caller that owns
/// the [`LogWriter`] (tests, tools, the simulator) applies it directly.
pub type Apply<'a> = &'a mut dyn FnMut(Switch) -> Result<(), StorageError>;

impl LogWriter {
    /// Applies a switch maintenance prepared. Cheap: a few lock
    /// acquisitions per tp and branch it names, no I/O.
    pub fn apply(&mut self, sw: Switch) -> Result<(), StorageError> {
        let log = self.storage().clone();
        match sw.0 {
            Change::LogStarts(starts) => {
                let parts = log.parts.read().expect("parts lock");
                for (tp, start) in &starts {
                    if let Some(part) = parts.get(tp) {
                        let mut st = part.st.write().expect("partition lock");
                        st.log_start = st.log_start.max(*start);
                        // The epochs below it go with the next checkpoint.
                        let start = st.log_start;
                        self.epochs_dirty |= st.epochs.truncate_from_start(start);
                    }
                }
            }
            Change::DropSegments(dead) => {
                for (branch, segs) in dead {
                    // Index entries go before the segments leave the
                    // branch, so a read that finds its segment gone looks
                    // again and finds no entry for it.
                    let gone: crate::storage::hashing::HashSet<u64> = segs.iter().map(|s| s.base_seq).collect();
                    log.trim_index(&branch, |seg| gone.contains(&seg));
                    branch.segs.write().expect("branch lock").retain(|s| !gone.contains(&s.base_seq));
                }
            }
            Change::DropStores(dead) => {
                let parts: Vec<Arc<Partition>> = log.parts.read().expect("parts lock").values().cloned().collect();
                for part in parts {
                    let mut st = part.st.write().expect("partition lock");
                    st.stored.retain(|s| !dead.iter().any(|d| Arc::ptr_eq(d, s)));
                }
                log.stores.write().expect("stores lock").retain(|s| !dead.iter().any(|d| Arc::ptr_eq(d, s)));
            }
            Change::Compacted { opened, first_live } => {
                let parts: Vec<Arc<Partition>> = log.parts.read().expect("parts lock").values().cloned().collect();
                let mut stores = log.stores.write().expect("stores lock");
                for (branch, first_live) in &first_live {
                    // Per tp at once: its new stores in, its entries into
                    // the replaced segments out, so a reader sees one or
                    // the other.
                    for part in parts.iter().filter(|p| Arc::ptr_eq(&p.branch, branch)) {
                        let mut st = part.st.write().expect("partition lock");
                        st.stored.extend(opened.iter().filter(|s| s.store.tps.contains_key(&part.tp)).cloned());
                        while st.index.front().is_some_and(|e| e.seg < *first_live) {
                            st.index.pop_front();
                        }
                    }
                    branch.segs.write().expect("branch lock").retain(|s| s.base_seq >= *first_live);
                }
                stores.extend(opened);
            }
            Change::Cleaned { opened, replaced } => {
                let is_replaced = |s: &Arc<StoreFile>| replaced.iter().any(|r| Arc::ptr_eq(r, s));
                // Only the cleaned topic's partitions change.
                let mut tps: Vec<Tp> = replaced.iter().flat_map(|s| s.store.tps.keys().copied()).collect();
                tps.sort();
                tps.dedup();
                let parts: Vec<Arc<Partition>> = {
                    let all = log.parts.read().expect("parts lock");
                    tps.iter().filter_map(|tp| all.get(tp).cloned()).collect()
                };
                let mut stores = log.stores.write().expect("stores lock");
                for part in parts {
                    let mut st = part.st.write().expect("partition lock");
                    // Per tp at once, where the replaced stores were.
                    let Some(at) = st.stored.iter().position(is_replaced) else { continue };
                    st.stored.retain(|s| !is_replaced(s));
                    let new: Vec<Arc<StoreFile>> = opened.iter().filter(|s| s.store.tps.contains_key(&part.tp)).cloned().collect();
                    st.stored.splice(at..at, new);
                }
                stores.retain(|s| !is_replaced(s));
                stores.extend(opened);
            }
            Change::RemoveTopic { topic, partitions } => {
                let gone = log.remove_topic(&topic, partitions);
                self.forget(&gone);
            }
        }
        Ok(())
    }
}
