//! Retention: which log starts rise past `retention.ms` or
//! `retention.bytes`, and which segment and store files nothing retained
//! lives in any more. The changes readers see go through the writer (a
//! [`Switch`]); the files go after.

use super::*;

impl Storage {
    /// Applies retention: advances log start offsets of tps whose oldest
    /// stored batches (in stores or sealed segments) are past `retention.ms`
    /// or beyond `retention.bytes`, hands the new starts to `persist` (which
    /// must make them durable), then deletes segment files and whole stores
    /// nothing retained lives in; a store leaves the catalog (`drop_stores`)
    /// before its file is deleted. Returns the new starts and the number of
    /// files deleted.
    pub fn enforce_retention(
        &self,
        now_ms: i64,
        policy: impl Fn(&Tp) -> RetentionPolicy,
        persist: impl FnOnce(&[(Tp, i64)]) -> Result<(), String>,
        drop_stores: impl FnOnce(&[(u64, u32)]) -> Result<(), String>,
        apply: Apply<'_>,
    ) -> Result<(Vec<(Tp, i64)>, usize), StorageError> {
        let _maintenance = self.maintenance.lock().expect("maintenance lock");
        let branches: Vec<Arc<Branch>> = self.branches.read().expect("branches lock").values().cloned().collect();
        let mut advanced: HashMap<Tp, i64> = HashMap::default();
        for branch in &branches {
            let segs = branch.segs.read().expect("branch lock").clone();
            // Partitions are looked up after the segments are: any frame in
            // those segments belongs to a partition registered before.
            let parts: Vec<Arc<Partition>> = self.parts.read().expect("parts lock").values().filter(|p| Arc::ptr_eq(&p.branch, branch)).cloned().collect();
            let sealed = segs.split_last().map_or(&[][..], |(_, sealed)| sealed);
            // Per tp: its shares of sealed segments, oldest first.
            let mut shares: HashMap<Tp, Vec<SegTp>> = HashMap::default();
            for seg in sealed {
                for (tp, s) in seg.tps.lock().expect("segment tps lock").iter() {
                    shares.entry(*tp).or_default().push(*s);
                }
            }
            for part in parts {
                let tp = part.tp;
                let p = policy(&tp);
                let (log_start, hw, total_bytes, mut list) = {
                    let st = part.st.read().expect("partition lock");
                    let stored: Vec<SegTp> = st
                        .stored
                        .iter()
                        .filter_map(|s| s.store.tps.get(&tp))
                        .map(|t| SegTp { last_offset: t.last_offset, bytes: t.bytes, max_ts: t.max_ts, since_entry: 0 })
                        .collect();
                    (st.log_start, st.hw, st.bytes(&tp, &segs), stored)
                };
                list.extend(shares.get(&tp).into_iter().flatten().copied());
                let mut new_start = log_start;
                let mut remaining = total_bytes;
                // Only what readers can see is retired: never past the high
                // watermark.
                let visible = |last: i64| if self.cfg.planted == Some(Planted::RetentionPastHighWatermark) { last <= hw } else { last < hw };
                for s in list.iter().filter(|s| s.last_offset >= log_start && visible(s.last_offset)) {
                    let expired = p.retention_ms.is_some_and(|ms| ms >= 0 && s.max_ts < now_ms - ms);
                    let oversize = p.retention_bytes.is_some_and(|b| remaining.saturating_sub(s.bytes) >= b);
                    if !(expired || oversize) {
                        break;
                    }
                    new_start = s.last_offset + 1;
                    remaining = remaining.saturating_sub(s.bytes);
                }
                if new_start > log_start {
                    advanced.insert(tp, new_start);
                }
            }
        }
        let advanced: Vec<(Tp, i64)> = advanced.into_iter().collect();
        if !advanced.is_empty() {
            persist(&advanced).map_err(|e| StorageError::Poisoned(format!("persisting log start offsets: {e}")))?;
            apply(Switch(Change::LogStarts(advanced.clone())))?;
        }
        let deleted = self.delete_dead_segments(&branches, apply)? + self.delete_dead_stores(drop_stores, apply)?;
        Ok((advanced, deleted))
    }

    /// Is everything `tps` holds below its tp's log start (or of a deleted topic)?
    fn all_dead<'s>(&self, mut tps: impl Iterator<Item = (&'s Tp, i64)>) -> bool {
        let parts = self.parts.read().expect("parts lock");
        tps.all(|(tp, last_offset)| match parts.get(tp) {
            None => true,
            Some(p) => last_offset < p.st.read().expect("partition lock").log_start,
        })
    }

    /// Sealed segments nothing retained lives in: out of their branches
    /// (the writer's switch), then off the disk.
    fn delete_dead_segments(&self, branches: &[Arc<Branch>], apply: Apply<'_>) -> Result<usize, StorageError> {
        let mut dead: Vec<(Arc<Branch>, Vec<Arc<Segment>>)> = Vec::new();
        for branch in branches {
            let segs = branch.segs.read().expect("branch lock");
            // After the segments (see enforce_retention): a partition
            // missing here was really deleted. (Dead segments need not be
            // a prefix: a live tp can keep an older one.)
            let Some((_, sealed)) = segs.split_last() else { continue };
            let d: Vec<Arc<Segment>> = sealed.iter().filter(|seg| self.all_dead(seg.tps.lock().expect("segment tps lock").iter().map(|(tp, s)| (tp, s.last_offset)))).cloned().collect();
            if !d.is_empty() {
                dead.push((branch.clone(), d));
            }
        }
        if dead.is_empty() {
            return Ok(0);
        }
        apply(Switch(Change::DropSegments(dead.clone())))?;
        let mut deleted = 0;
        for (branch, segs) in dead {
            for seg in segs {
                tracing::info!(path = %seg.path.display(), "deleting segment past retention");
                seg.file.retire();
                seg.remove_files(&*self.cfg.disk)?;
                deleted += 1;
            }
            sync_dir(&*self.cfg.disk, &branch.dir)?;
        }
        Ok(deleted)
    }

    /// Drops the index entries of `branch`'s tps that point into the
    /// segments `gone` names.
    pub(super) fn trim_index(&self, branch: &Arc<Branch>, gone: impl Fn(u64) -> bool) {
        let parts: Vec<Arc<Partition>> = self.parts.read().expect("parts lock").values().filter(|p| Arc::ptr_eq(&p.branch, branch)).cloned().collect();
        for part in parts {
            let mut st = part.st.write().expect("partition lock");
            if st.index.iter().any(|e| gone(e.seg)) {
                st.index.retain(|e| !gone(e.seg));
            }
        }
    }

    /// Deletes whole stores nothing retained lives in: out of the catalog
    /// first, then out of the tps, then the file.
    fn delete_dead_stores(&self, drop_stores: impl FnOnce(&[(u64, u32)]) -> Result<(), String>, apply: Apply<'_>) -> Result<usize, StorageError> {
        let dead: Vec<Arc<StoreFile>> = {
            let stores = self.stores.read().expect("stores lock");
            stores.iter().filter(|s| self.all_dead(s.store.tps.iter().map(|(tp, t)| (tp, t.last_offset)))).cloned().collect()
        };
        if dead.is_empty() {
            return Ok(0);
        }
        let keys: Vec<(u64, u32)> = dead.iter().map(|s| (s.store.window, s.store.store)).collect();
        drop_stores(&keys).map_err(|e| StorageError::Poisoned(format!("removing stores from the catalog: {e}")))?;
        apply(Switch(Change::DropStores(dead.clone())))?;
        for s in &dead {
            tracing::info!(path = %s.store.path.display(), "deleting store past retention");
            s.file.retire();
            self.cfg.disk.remove_file(&s.store.path).map_err(io_err(&s.store.path))?;
        }
        sync_dir(&*self.cfg.disk, &self.stores_dir)?;
        self.compaction_stats.stores_deleted.fetch_add(dead.len() as u64, Ordering::Relaxed);
        Ok(dead.len())
    }
}
