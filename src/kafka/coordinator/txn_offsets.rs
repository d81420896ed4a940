//! Transactional offsets at the group's coordinator (cluster mode;
//! docs/cluster.md, "Transaction state", step 5): a transaction's offsets
//! wait in the group's shard as pending ones until its marker reaches the
//! shard, which commits or drops them; the shard also keeps each
//! producer's newest coordinator epoch, so a deposed coordinator's late
//! marker is refused. Kafka's pending transactional offsets on
//! `__consumer_offsets`. The journal records are `journal::Record::Pending`
//! and `journal::Record::Fence`; the maps they fill are `Coordinator`'s
//! `pending` and `fences`, loaded with each shard.

use std::collections::HashMap;

use super::{journal, offsets, CommitIds, Coordinator};
use crate::meta::OffsetRecord;

/// Verification guards (KIP-890's, for the group's shard): a
/// TxnOffsetCommit takes one before it asks the transaction's coordinator
/// whether the shard is in the transaction, and its offsets are staged
/// only if no marker for the producer reached the shard since. Without
/// it, offsets of a transaction that ended while the answer travelled
/// would wait for the producer's next marker, and a later transaction's
/// commit would commit them.
#[derive(Default)]
pub(super) struct Guards {
    tokens: crate::engine::txns::Guards<(u32, i64)>,
    /// Per shard, the last token taken before its last load or unload: a
    /// missing guard at or below it went with the load (the client asks
    /// again: NOT_COORDINATOR), one above it with a marker.
    loaded_at: HashMap<u32, u64>,
}

impl Coordinator {
    /// A verification guard for `producer_id`'s offsets to `group`, taken
    /// before the transaction's coordinator is asked (see [`Guards`]).
    pub fn guard_txn_offsets(&self, group: &str, producer_id: i64) -> u64 {
        let now = self.engine.now_ms();
        self.guards.lock().expect("guards lock").tokens.take((journal::shard_of(group), producer_id), now)
    }

    /// Gives a guard back unused (the verification failed).
    pub fn release_txn_offsets_guard(&self, group: &str, producer_id: i64, token: u64) {
        let _ = self.take_guard(journal::shard_of(group), producer_id, token);
    }

    /// Takes `token` if it still stands. Gone: INVALID_TXN_STATE if a
    /// marker for the producer reached the shard since it was taken (the
    /// transaction ended), NOT_COORDINATOR if the shard loaded or
    /// unloaded since (the client finds the coordinator and asks again).
    fn take_guard(&self, shard: u32, producer_id: i64, token: u64) -> Result<(), i16> {
        use kafka_protocol::ResponseError as E;
        let mut g = self.guards.lock().expect("guards lock");
        if g.tokens.redeem(&(shard, producer_id), token) {
            Ok(())
        } else if g.loaded_at.get(&shard).is_some_and(|at| token <= *at) {
            Err(E::NotCoordinator.code())
        } else {
            Err(E::InvalidTxnState.code())
        }
    }

    /// A marker for `producer_id` reached `shard`: its guards there go.
    pub(super) fn drop_guards(&self, shard: u32, producer_id: i64) {
        self.guards.lock().expect("guards lock").tokens.drop_key(&(shard, producer_id));
    }

    /// `shard` loaded or unloaded: every guard of it goes, as taken
    /// before the load.
    pub(super) fn void_guards(&self, shard: u32) {
        let mut g = self.guards.lock().expect("guards lock");
        g.tokens.drop_where(|(s, _)| *s == shard);
        let at = g.tokens.last();
        g.loaded_at.insert(shard, at);
    }

    /// Cluster mode (TxnOffsetCommit at the group's coordinator): offsets
    /// (`producer_id`, `epoch`)'s transaction commits for `group` if it
    /// commits. They are appended to the group's shard as pending offsets
    /// and wait, in memory and in the log, for the transaction's marker
    /// ([`Coordinator::end_txn_offsets`]); a later offset of the same
    /// partition in the same transaction replaces it. Rows: (topic,
    /// partition, offset). `guard` is the one taken before verification:
    /// gone (the transaction's marker reached the shard since, or the
    /// shard loaded again), the offsets are INVALID_TXN_STATE, as a late
    /// batch is at a partition's leader.
    pub async fn stage_txn_offsets(&self, producer_id: i64, epoch: i16, group: &str, rows: Vec<(String, i32, OffsetRecord)>, guard: u64) -> Result<(), i16> {
        use kafka_protocol::ResponseError as E;
        let shard = journal::shard_of(group);
        let Some(j) = self.journal.get() else {
            let _ = self.take_guard(shard, producer_id, guard);
            return Err(E::CoordinatorNotAvailable.code());
        };
        let _turn = self.turns[shard as usize].lock().await;
        self.take_guard(shard, producer_id, guard)?;
        if !j.ready(shard) {
            return Err(E::NotCoordinator.code());
        }
        let records = rows.iter().map(|(t, p, r)| journal::Record::Pending { group: group.to_owned(), topic: t.clone(), partition: *p, producer_id, state: Some((epoch, r.clone())) }).collect();
        j.append(shard, records).await?;
        let mut pending = self.pending.lock().expect("pending offsets lock");
        let shard = pending.entry(shard).or_default();
        for (t, p, r) in rows {
            shard.insert((group.to_owned(), t, p, producer_id), (epoch, r));
        }
        Ok(())
    }

    /// Cluster mode: the marker of (`producer_id`, `epoch`)'s transaction
    /// reached `shard` (WriteTxnMarkers for the coordinator topic's
    /// partition): the transaction's pending offsets there become the
    /// committed ones (`commit`) or are dropped, by one append of the
    /// committed offsets and the pending ones' tombstones. With nothing
    /// pending there is nothing to do (the marker came again). A marker
    /// from an older coordinator than one whose marker reached the shard
    /// for this producer is TRANSACTION_COORDINATOR_FENCED (a deposed
    /// coordinator's, late: it must not end a later transaction's
    /// offsets); a newer coordinator epoch is stored with the change.
    /// `Err` is what WriteTxnMarkers answers for the partition.
    pub async fn end_txn_offsets(&self, shard: u32, producer_id: i64, epoch: i16, coordinator_epoch: i32, commit: bool) -> Result<(), i16> {
        use kafka_protocol::ResponseError as E;
        let j = self.journal.get().ok_or(E::NotLeaderOrFollower.code())?;
        let rows: Vec<offsets::Row> = {
            let _turn = self.turns[shard as usize].lock().await;
            if !j.ready(shard) {
                return Err(E::NotLeaderOrFollower.code());
            }
            let known = self.fences.lock().expect("fences lock").get(&shard).and_then(|f| f.get(&producer_id).copied());
            if known.is_some_and(|k| k > coordinator_epoch) {
                return Err(E::TransactionCoordinatorFenced.code());
            }
            let newer = known.is_none_or(|k| coordinator_epoch > k);
            let ours: Vec<(journal::PendingKey, (i16, OffsetRecord))> =
                self.pending.lock().expect("pending offsets lock").get(&shard).map(|p| p.iter().filter(|((_, _, _, pid), _)| *pid == producer_id).map(|(k, v)| (k.clone(), v.clone())).collect()).unwrap_or_default();
            // A marker older than the offsets is a deposed end's.
            if ours.iter().any(|(_, (e, _))| *e > epoch) {
                return Err(E::InvalidProducerEpoch.code());
            }
            // The transaction ended: offsets verified before it are late.
            self.drop_guards(shard, producer_id);
            if ours.is_empty() && !newer {
                return Ok(());
            }
            let mut records: Vec<journal::Record> = Vec::with_capacity(ours.len() * 2);
            if commit {
                records.extend(ours.iter().map(|((g, t, p, _), (_, r))| journal::Record::Offset(journal::Entry { group: g.clone(), topic: t.clone(), partition: *p, record: Some(r.clone()) })));
            }
            records.extend(ours.iter().map(|((g, t, p, pid), _)| journal::Record::Pending { group: g.clone(), topic: t.clone(), partition: *p, producer_id: *pid, state: None }));
            if newer {
                records.push(journal::Record::Fence { producer_id, coordinator_epoch });
            }
            j.append(shard, records).await.map_err(marker_error)?;
            if newer {
                self.fences.lock().expect("fences lock").entry(shard).or_default().insert(producer_id, coordinator_epoch);
            }
            if let Some(p) = self.pending.lock().expect("pending offsets lock").get_mut(&shard) {
                for (k, _) in &ours {
                    p.remove(k);
                }
            }
            let rows: Vec<offsets::Row> = ours.into_iter().map(|((g, t, p, _), (_, r))| (g, t, p, r)).collect();
            if commit {
                self.apply_journaled(j.as_ref(), shard, offsets::Change::Commit(rows.clone())).await.map_err(|e| marker_error(e.code))?;
            }
            rows
        };
        if commit {
            // The groups are known to the coordinator (listed, counted).
            for group in rows.into_iter().map(|(g, ..)| g).collect::<std::collections::BTreeSet<_>>() {
                let _ = self.txn_commit_check(group, CommitIds { generation: -1, member_id: String::new(), instance_id: None }).await;
            }
        }
        Ok(())
    }

    /// The keys of `group`'s pending offsets in `shard` (of `only`'s
    /// partitions, if given), sorted.
    pub(super) fn pending_keys(&self, shard: u32, group: &str, only: Option<&[(String, i32)]>) -> Vec<journal::PendingKey> {
        let pending = self.pending.lock().expect("pending offsets lock");
        let mut keys: Vec<journal::PendingKey> = pending
            .get(&shard)
            .into_iter()
            .flat_map(|p| p.keys())
            .filter(|(g, t, p, _)| g == group && only.is_none_or(|o| o.iter().any(|(ot, op)| ot == t && op == p)))
            .cloned()
            .collect();
        keys.sort();
        keys
    }

    /// The pending offsets' tombstones for `keys` (appended with the
    /// committed offsets' tombstones when a group or its offsets are
    /// deleted, as Kafka's tombstone drops a key's pending transactional
    /// offsets too).
    pub(super) fn pending_tombstones(keys: &[journal::PendingKey]) -> impl Iterator<Item = journal::Record> + '_ {
        keys.iter().map(|(g, t, p, pid)| journal::Record::Pending { group: g.clone(), topic: t.clone(), partition: *p, producer_id: *pid, state: None })
    }

    /// Forgets pending offsets whose tombstones the shard's log took.
    pub(super) fn forget_pending(&self, shard: u32, keys: &[journal::PendingKey]) {
        if let Some(p) = self.pending.lock().expect("pending offsets lock").get_mut(&shard) {
            for k in keys {
                p.remove(k);
            }
        }
    }

    /// Cluster mode: which partitions of `groups` have offsets waiting in
    /// an open transaction here (OffsetFetch with require_stable answers
    /// UNSTABLE_OFFSET_COMMIT for them).
    pub fn pending_txn_offsets(&self, groups: &std::collections::HashSet<String>) -> HashMap<String, std::collections::HashSet<(String, i32)>> {
        let mut out: HashMap<String, std::collections::HashSet<(String, i32)>> = HashMap::new();
        let pending = self.pending.lock().expect("pending offsets lock");
        for ((g, t, p, _), _) in pending.values().flat_map(|p| p.iter()) {
            if groups.contains(g) {
                out.entry(g.clone()).or_default().insert((t.clone(), *p));
            }
        }
        out
    }
}

/// What WriteTxnMarkers answers for a coordinator shard whose log refused
/// a marker's change (`code` as the journal maps it for commits): the
/// codes a partition's leader gives, so the transaction's coordinator
/// tries again where the shard is led now.
fn marker_error(code: i16) -> i16 {
    use kafka_protocol::ResponseError as E;
    match E::try_from_code(code) {
        Some(E::NotCoordinator) => E::NotLeaderOrFollower.code(),
        Some(E::CoordinatorNotAvailable) => E::NotEnoughReplicas.code(),
        Some(E::InvalidCommitOffsetSize) => E::UnknownServerError.code(),
        _ => code,
    }
}
