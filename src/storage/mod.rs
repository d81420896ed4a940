//! Storage: everything that owns a data file.
//!
//! Synchronous and deterministic: no tokio, no sockets, time passed in by the
//! caller. The branch log (DESIGN.md): per branch, chronological segment
//! files holding every topic of that branch in stream order; the tip
//! (`tip`): the newest batches in memory, indexed per branch, which reads
//! try first. The subtree stores of a later issue sit beside them.

pub mod disk;
pub mod files;
pub mod hashing;
pub mod log;
pub mod merge;
pub mod segment;
pub mod subtree;
pub mod tip;

pub use log::{EpochCache, EpochEntry, 
    placeable, Apply, CleanConfig, CleanPolicy, Cleaned, CompactConfig, Compacted, Appended, TopicView, Flushed, LogWriter, PartitionSpec, Planted, ReadError, ReadResult, RecoveryReport, RetentionPolicy, Storage,
    StorageConfig, StorageError, Switch,
};

/// A topic's UUID; frames carry it so a re-created topic never sees the
/// bytes of its predecessor.
pub type TopicId = [u8; 16];

/// A topic partition as storage knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tp {
    pub topic: TopicId,
    pub partition: i32,
}

/// The branch of a topic: its first two `.`-separated segments.
/// `app.codestore.commits` → `app.codestore`; `metrics` → `metrics`.
pub fn branch_of(topic: &str) -> &str {
    match topic.match_indices('.').nth(1) {
        Some((i, _)) => &topic[..i],
        None => topic,
    }
}

#[cfg(test)]
mod tests {
    use super::branch_of;

    #[test]
    fn branches_are_two_segment_prefixes() {
        assert_eq!(branch_of("app.codestore.commits"), "app.codestore");
        assert_eq!(branch_of("app.codestore"), "app.codestore");
        assert_eq!(branch_of("metrics"), "metrics");
        assert_eq!(branch_of("a..b"), "a.");
        assert_eq!(branch_of("..x"), ".");
    }
}
