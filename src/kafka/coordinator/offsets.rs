//! Committed offsets, the coordinator's alone: OffsetCommit and
//! TxnOffsetCommit write them, OffsetFetch reads them, DeleteGroups and
//! OffsetDelete remove them, and expiry retires the offsets of groups
//! left empty, all through [`super::Coordinator`]. Nothing else touches
//! their catalog rows (the one exception: deleting a topic removes its
//! rows in the same catalog batch as the topic, in the engine).
//!
//! Every change goes through one thread, the keeper, in the order asked:
//! it applies whatever is queued, flushes the catalog once for all of it,
//! and answers each change only after that flush, so concurrent commits
//! share one flush and an expiry's compare-and-delete never races a
//! removal.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use super::IdleGroup;
use crate::engine::Engine;
use crate::meta::{Catalog, MetaError, OffsetRecord};

/// One committed offset: (group, topic, partition, record).
pub type Row = (String, String, i32, OffsetRecord);

/// A change to the committed offsets.
pub(super) enum Change {
    Commit(Vec<Row>),
    /// A group's offsets for these partitions (every one with `None`).
    Remove { group: String, only: Option<Vec<(String, i32)>> },
    /// Of these idle groups, forget those without offsets, and retire the
    /// offsets of those empty since before `cutoff_ms` whose every commit
    /// is older than that.
    Expire { idle: Vec<IdleGroup>, cutoff_ms: i64 },
    /// Cluster mode: the offsets of coordinator shard `shard`'s groups
    /// become `rows` (what the shard's log says), every other row of those
    /// groups removed.
    Load { shard: u32, rows: super::journal::Rows },
}

/// What a change did, once durable.
#[derive(Debug, Default)]
pub(super) struct Applied {
    /// Groups with nothing left to keep, each with its commit count when
    /// listed: the coordinator forgets them if no commit came since.
    pub forget: Vec<(String, u64)>,
    /// Of `forget`, the groups whose offsets expired.
    pub expired: usize,
}

pub(super) type Job = (Change, oneshot::Sender<Result<Applied, String>>);

/// The keeper thread's body. A thread of its own (not a task plus
/// `spawn_blocking` per flush): the flush blocks anyway, and each handoff
/// between threads costs more CPU than a commit itself at low concurrency.
pub(super) fn keeper(mut rx: mpsc::Receiver<Job>, engine: Arc<Engine>) {
    while let Some(first) = rx.blocking_recv() {
        let mut jobs = vec![first];
        while let Ok(j) = rx.try_recv() {
            jobs.push(j);
        }
        let catalog = engine.catalog();
        let applied: Vec<Result<Applied, String>> = jobs.iter().map(|(c, _)| apply(catalog, c).map_err(|e| e.to_string())).collect();
        let flushed = catalog.flush().map(drop).map_err(|e| e.to_string());
        for ((_, reply), r) in jobs.into_iter().zip(applied) {
            let _ = reply.send(flushed.clone().and(r));
        }
    }
}

fn apply(catalog: &Catalog, change: &Change) -> Result<Applied, MetaError> {
    match change {
        Change::Commit(rows) => catalog.put_offsets(rows).map(|_| Applied::default()),
        Change::Remove { group, only } => catalog.remove_offsets(group, only.as_deref()).map(|_| Applied::default()),
        Change::Load { shard, rows } => {
            for g in catalog.offset_groups()?.into_iter().filter(|g| super::journal::shard_of(g) == *shard) {
                catalog.remove_offsets(&g, None)?;
            }
            let rows: Vec<Row> = rows.iter().map(|((g, t, p), r)| (g.clone(), t.clone(), *p, r.clone())).collect();
            catalog.put_offsets(&rows).map(|_| Applied::default())
        }
        Change::Expire { idle, cutoff_ms } => {
            let mut out = Applied::default();
            for g in idle {
                let rows = catalog.group_offsets(&g.id)?;
                if rows.is_empty() {
                    out.forget.push((g.id.clone(), g.commits));
                } else if expired(g, &rows, *cutoff_ms) {
                    // Row by row, compare-and-delete: a commit that landed
                    // since the rows were read survives (and the group with
                    // it, through its commit count).
                    if !catalog.expire_offsets(&g.id, *cutoff_ms)? {
                        tracing::info!(group = %g.id, "expired the committed offsets of an empty group");
                        out.forget.push((g.id.clone(), g.commits));
                        out.expired += 1;
                    }
                }
            }
            Ok(out)
        }
    }
}

/// Kafka's expiry rule: a group empty since before `cutoff_ms` whose every
/// committed offset (`rows`, not empty) is older than that.
pub(super) fn expired(g: &IdleGroup, rows: &[(String, i32, OffsetRecord)], cutoff_ms: i64) -> bool {
    g.empty_since_ms < cutoff_ms && rows.iter().all(|(_, _, r)| r.commit_ms < cutoff_ms)
}

/// Every group's committed offsets, for the lag metrics: (group, topic,
/// partition, offset).
pub fn all_committed(catalog: &Catalog) -> Vec<(String, String, i32, i64)> {
    let mut out = Vec::new();
    for g in catalog.offset_groups().unwrap_or_default() {
        for (topic, p, rec) in catalog.group_offsets(&g).unwrap_or_default() {
            out.push((g.clone(), topic, p, rec.offset));
        }
    }
    out
}
