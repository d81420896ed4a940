//! Feature levels (KIP-584), as ApiVersions v3+ reports them: what this
//! broker supports, and the level it runs at (the "finalized" level, which
//! clients act on).
//!
//! One feature matters to clients today: `transaction.version`. At 2 a
//! Kafka 4 producer uses transactions v2 (KIP-890 part 2: EndTxn v5, an
//! epoch per transaction, partitions and groups joining on Produce and
//! TxnOffsetCommit); below it, the protocol before. The level is the
//! `transaction_version` setting. Clients re-read the levels when the
//! epoch grows, so the epoch is the broker's start time: a restart with
//! another level is noticed.

use kafka_protocol::messages::api_versions_response::{FinalizedFeatureKey, SupportedFeatureKey};
use kafka_protocol::protocol::StrBytes;

pub const TRANSACTION_VERSION: &str = "transaction.version";
/// The highest `transaction.version` served.
pub const TRANSACTION_VERSION_MAX: i16 = 2;

#[derive(Debug, Clone)]
pub struct Features {
    pub transaction_version: i16,
    /// Grows whenever the levels may have changed (here: at every start).
    pub epoch: i64,
}

impl Features {
    pub fn new(transaction_version: i16) -> Features {
        let epoch = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
        Features { transaction_version, epoch }
    }

    /// Whether producers are told to use transactions v2.
    pub fn transactions_v2(&self) -> bool {
        self.transaction_version >= 2
    }

    /// The supported ranges, for an ApiVersions answer of `version`.
    /// Before v4, features whose range starts at 0 are left out, as Kafka
    /// does (KAFKA-17492: older clients fail to read them).
    pub fn supported(&self, version: i16) -> Vec<SupportedFeatureKey> {
        [(TRANSACTION_VERSION, 0, TRANSACTION_VERSION_MAX)]
            .into_iter()
            .filter(|&(_, min, _)| version >= 4 || min > 0)
            .map(|(name, min, max)| SupportedFeatureKey::default().with_name(StrBytes::from_static_str(name)).with_min_version(min).with_max_version(max))
            .collect()
    }

    /// The finalized levels; a feature at level 0 is not listed (Kafka's
    /// way of saying it is off).
    pub fn finalized(&self) -> Vec<FinalizedFeatureKey> {
        [(TRANSACTION_VERSION, self.transaction_version)]
            .into_iter()
            .filter(|&(_, level)| level > 0)
            .map(|(name, level)| FinalizedFeatureKey::default().with_name(StrBytes::from_static_str(name)).with_min_version_level(level).with_max_version_level(level))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_as_kafka_reports_them() {
        let f = Features::new(2);
        assert!(f.transactions_v2());
        assert!(f.epoch > 0);
        let fin = f.finalized();
        assert_eq!(fin.len(), 1);
        assert_eq!((fin[0].name.as_str(), fin[0].min_version_level, fin[0].max_version_level), (TRANSACTION_VERSION, 2, 2));
        assert_eq!(f.supported(4).len(), 1);
        assert_eq!((f.supported(4)[0].min_version, f.supported(4)[0].max_version), (0, 2));
        assert!(f.supported(3).is_empty(), "a range from 0 is left out before v4");
        let off = Features::new(0);
        assert!(!off.transactions_v2());
        assert!(off.finalized().is_empty(), "level 0 is not listed");
        assert!(!Features::new(1).transactions_v2());
    }
}
