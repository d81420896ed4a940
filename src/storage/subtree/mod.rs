//! Subtree stores: sealed branch-log segments rewritten by compaction into
//! files that each hold one region of the topic tree (`store`), chosen by
//! the splitter (`split`).
//!
//! The compactor itself lives beside the branch logs (`log::compact`),
//! whose state it switches; this module holds what it writes and what the
//! catalog records about it.

pub mod report;
pub mod split;
pub mod store;

use crate::storage::hashing::HashMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::TopicId;

/// One store as the catalog records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreRecord {
    /// Its number in the window's plan (the file is `store::file_name`).
    pub store: u32,
    /// The plan's name for it.
    pub label: String,
    /// The topics the plan gave it, by name.
    pub topics: Vec<String>,
    /// Bytes written.
    pub bytes: u64,
    /// False once retention deleted it.
    pub live: bool,
}

/// One compaction window: which segments it replaced, the plan, the stores.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowRecord {
    pub window: u64,
    pub created_ms: i64,
    /// "adaptive" or "prefix3".
    pub split: String,
    pub threshold: u64,
    /// Per branch: segments with a smaller base sequence number are
    /// replaced by this window's (and earlier windows') stores.
    pub compacted_to: Vec<(String, u64)>,
    pub stores: Vec<StoreRecord>,
    /// A key compaction (cleaning, `log::clean`): the stores its one store
    /// replaces, by (window, store). Listed here, the switch is one write.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cleaned: Vec<(u64, u32)>,
    /// A cleaning's store: the earliest delete horizon of its batches that
    /// keep tombstones (when the next cleaning may remove them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub horizon_ms: Option<i64>,
}

impl WindowRecord {
    /// The stores `windows` list that are live: not dropped by retention,
    /// not replaced by a cleaning.
    pub fn live_stores(windows: &[WindowRecord]) -> std::collections::BTreeSet<(u64, u32)> {
        let replaced: std::collections::BTreeSet<(u64, u32)> = windows.iter().flat_map(|w| w.cleaned.iter().copied()).collect();
        windows
            .iter()
            .flat_map(|w| w.stores.iter().filter(|s| s.live).map(move |s| (w.window, s.store)))
            .filter(|k| !replaced.contains(k))
            .collect()
    }
}

/// Where the compactor may stop (tests inject crashes there): before and
/// after each step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Before anything is written.
    Start,
    /// Stores written (not yet synced, under temporary names).
    Written,
    /// Stores synced and renamed; the catalog does not list them yet.
    Synced,
    /// The catalog lists the stores; the segments still exist.
    Switched,
    /// The replaced segments are deleted.
    Deleted,
}

impl Step {
    pub const ALL: [Step; 5] = [Step::Start, Step::Written, Step::Synced, Step::Switched, Step::Deleted];
}

/// Bytes per topic in a data directory: its branch-log segments (frame
/// headers only) and the stores `windows` lists. For `split-report`; the
/// broker must not be writing meanwhile.
pub fn volumes(dir: &Path, windows: &[WindowRecord]) -> Result<HashMap<TopicId, u64>, String> {
    let mut out: HashMap<TopicId, u64> = HashMap::default();
    let log = dir.join("log");
    let branches = std::fs::read_dir(&log).map_err(|e| format!("{}: {e}", log.display()))?;
    for b in branches {
        let b = b.map_err(|e| e.to_string())?.path();
        if b.extension().is_none_or(|x| x != "br") {
            continue;
        }
        for f in std::fs::read_dir(&b).map_err(|e| format!("{}: {e}", b.display()))? {
            let f = f.map_err(|e| e.to_string())?.path();
            if f.extension().is_none_or(|x| x != "seg") {
                continue;
            }
            let scan = super::segment::scan(&super::disk::RealDisk, &f, false).map_err(|e| e.to_string())?;
            for (_, fh) in scan.frames {
                *out.entry(fh.topic_id).or_default() += fh.frame_len as u64;
            }
        }
    }
    for (window, n) in WindowRecord::live_stores(windows) {
        {
            let path = dir.join("stores").join(store::file_name(window, n));
            let st = store::Store::open(&super::disk::RealDisk, &path).map_err(|e| e.to_string())?;
            for (tp, share) in &st.tps {
                *out.entry(tp.topic).or_default() += share.bytes;
            }
        }
    }
    Ok(out)
}
