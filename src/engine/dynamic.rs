//! Run-time changes an operator makes: topic and broker configs
//! (AlterConfigs, IncrementalAlterConfigs, and what DescribeConfigs reads
//! of them) and log starts (DeleteRecords). Each runs under the engine's
//! admin lock and is durable in the catalog before anything uses it; the
//! layers and the table of configs are `configs`' own.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::configs::{self, Alter, BrokerLayers, BrokerScope, Described};
use super::topics::TopicConfig;
use super::{Engine, EngineError, Topic};
use crate::meta::TopicRecord;
use crate::storage::{self, StorageError, Tp};

/// The broker-level config layers, and the parsed topic default they give.
#[derive(Debug)]
pub(super) struct Defaults {
    pub(super) layers: BrokerLayers,
    pub(super) topic: TopicConfig,
}

/// A stored topic's config: `default` with its own configs over it. What
/// no longer passes (a value kept before a check existed, a
/// max.message.bytes over a limit lowered since) is left out or capped
/// with a warning, not refused: the topic must stay usable.
pub(super) fn stored_config(default: &TopicConfig, record: &TopicRecord, limit: i32) -> TopicConfig {
    let (config, skipped) = default.overlay_stored(&record.configs, limit);
    for e in skipped {
        tracing::warn!(topic = %record.name, key = %e.key, error = %e, "a stored topic config does not apply; left out");
    }
    config
}

impl Engine {
    pub(super) fn defaults(&self) -> Arc<Defaults> {
        self.defaults.read().expect("defaults lock").clone()
    }

    /// Every config of a topic, with its value, source and synonyms.
    pub fn describe_topic_configs(&self, topic: &Topic) -> Vec<Described> {
        self.defaults().layers.describe_topic(&topic.record.configs)
    }

    /// The topic-default configs of this broker or of the cluster-wide
    /// default resource.
    pub fn describe_broker_configs(&self, scope: BrokerScope) -> Vec<Described> {
        self.defaults().layers.describe_broker(scope == BrokerScope::Cluster)
    }

    /// Changes a topic's configs: new values are checked as at creation
    /// (what is stored already, leniently: it may predate a check), then
    /// made durable before they are used. Produce and retention see them
    /// at their next look-up of the topic. Blocking.
    pub fn alter_topic_configs(&self, name: &str, alter: Alter, validate_only: bool) -> Result<(), EngineError> {
        let _admin = self.admin.lock().expect("admin lock");
        let topic = self.topic(name).ok_or(EngineError::UnknownTopicOrPartition)?;
        // An internal topic's configs are the broker's to choose (its
        // cleanup policy keeps committed offsets).
        if super::topics::is_internal(name) {
            return Err(EngineError::InvalidTopic(super::topics::NameError::Reserved(name.to_owned())));
        }
        let set = alter.apply(&topic.record.configs, configs::topic_def)?;
        // New values strictly; what is stored already leniently (it may
        // predate a check, and must not block changing other keys).
        let limit = self.cfg.topic_defaults.max_message_bytes_limit;
        let defaults = self.defaults();
        let changed: BTreeMap<String, String> = set.iter().filter(|(k, v)| topic.record.configs.get(*k) != Some(*v)).map(|(k, v)| (k.clone(), v.clone())).collect();
        defaults.topic.overlay(&changed, limit)?;
        let (config, skipped) = defaults.topic.overlay_stored(&set, limit);
        let lags_changed = changed.contains_key("min.compaction.lag.ms") || changed.contains_key("max.compaction.lag.ms");
        if let Some(e) = skipped.into_iter().find(|e| changed.contains_key(&e.key) || (lags_changed && e.key == "min.compaction.lag.ms")) {
            return Err(e.into());
        }
        if validate_only || set == topic.record.configs {
            return Ok(());
        }
        let mut record = topic.record.clone();
        record.configs = set;
        if let Some(d) = self.directory.get() {
            d.update(&topic.record, &record)?;
        }
        self.catalog.put_topic(&record)?;
        self.catalog.flush()?;
        tracing::info!(topic = name, configs = ?record.configs, "topic configs changed");
        self.replace_topic(Topic { record, config, traffic: topic.traffic.clone() });
        Ok(())
    }

    /// Changes the dynamic broker configs of one scope (the topic
    /// defaults Kafka lets change at run time). Every topic's config is
    /// derived again from the new defaults; the change is durable before
    /// any topic uses it. Blocking.
    pub fn alter_broker_configs(&self, scope: BrokerScope, alter: Alter, validate_only: bool) -> Result<(), EngineError> {
        let _admin = self.admin.lock().expect("admin lock");
        let old = self.defaults();
        let mut layers = old.layers.clone();
        let slot = layers.scope_mut(scope);
        let set = alter.apply(slot, configs::broker_def).map_err(|e| EngineError::InvalidBrokerConfig(e.message))?;
        let fixed: Vec<&str> = set.keys().filter(|k| configs::broker_def(k).is_some_and(|d| !d.broker_dynamic)).map(String::as_str).collect();
        if !fixed.is_empty() {
            return Err(EngineError::InvalidBrokerConfig(format!("Cannot update these configs dynamically: {}; they are static settings of the broker", fixed.join(", "))));
        }
        if let Some(k) = set.keys().find(|k| configs::broker_def(k).is_none()) {
            return Err(EngineError::InvalidBrokerConfig(format!("Unknown broker config name: {k} (the dynamic broker configs are the topic defaults, such as log.retention.ms)")));
        }
        // The new values strictly (what is stored already was checked when
        // it was set, and may predate a check).
        let limit = self.cfg.topic_defaults.max_message_bytes_limit;
        for (k, v) in set.iter().filter(|(k, v)| slot.get(*k) != Some(*v)) {
            configs::check_broker_value(k, v, limit).map_err(|e| EngineError::InvalidBrokerConfig(e.message))?;
        }
        *slot = set;
        if validate_only {
            return Ok(());
        }
        let stored = layers.scope_mut(scope);
        match self.directory.get() {
            // Cluster mode: every broker's default lives in the cluster
            // (this node follows it like any other); this broker's own
            // layer stays in its catalog.
            Some(d) if scope == BrokerScope::Cluster => d.update_cluster_configs(&old.layers.cluster, stored)?,
            _ => self.catalog.put_broker_configs(scope.catalog_key(), stored)?,
        }
        tracing::info!(scope = scope.catalog_key(), configs = ?stored, "broker configs changed");
        let changed = self.take_defaults(layers);
        tracing::info!(topics_changed = changed, "topic configs derived again");
        Ok(())
    }

    /// Takes `layers` as the broker's, deriving the topic default and every
    /// topic's config again (under the admin lock); how many topics'
    /// configs changed.
    pub(super) fn take_defaults(&self, layers: BrokerLayers) -> usize {
        let limit = self.cfg.topic_defaults.max_message_bytes_limit;
        let (topic, skipped) = layers.topic_default(limit);
        for e in skipped {
            tracing::warn!(key = %e.key, error = %e, "a broker config does not apply here; left out");
        }
        let changed: Vec<Topic> = self
            .topics()
            .into_iter()
            .filter_map(|t| {
                let config = topic.overlay_stored(&t.record.configs, limit).0;
                (config != t.config).then(|| Topic { record: t.record.clone(), config, traffic: t.traffic.clone() })
            })
            .collect();
        *self.defaults.write().expect("defaults lock") = Arc::new(Defaults { layers, topic });
        let n = changed.len();
        for t in changed {
            self.replace_topic(t);
        }
        n
    }

    /// DeleteRecords: raises each tp's log start to its offset (-1: the
    /// high watermark), durably in the catalog before readers see it;
    /// retention later deletes the files nothing above a log start lives
    /// in (shared segments and stores hold other tps too). Answers each
    /// tp's new log start, in order. Blocking.
    pub fn delete_records(&self, requests: &[(Tp, i64)]) -> Vec<Result<i64, EngineError>> {
        // No topic is deleted meanwhile (its log start rows would be
        // written back after its deletion removed them). Order: admin, then
        // log starts; nothing takes them the other way.
        let _admin = self.admin.lock().expect("admin lock");
        let _starts = self.log_starts.lock().expect("log starts lock");
        // Each tp's new start, and those that rise (to be written).
        let mut raised: Vec<(Tp, i64)> = Vec::new();
        let mut answers: Vec<Result<i64, EngineError>> = requests
            .iter()
            .map(|(tp, offset)| {
                let topic = self.topic_by_id(&tp.topic).ok_or(EngineError::UnknownTopicOrPartition)?;
                if !topic.config.cleanup.delete {
                    return Err(EngineError::Policy(format!("Records of partition {}-{} can not be deleted due to the configured policy", topic.name(), tp.partition)));
                }
                let (log_start, hw, _) = self.offsets(tp).ok_or(EngineError::UnknownTopicOrPartition)?;
                let to = if *offset == -1 { hw } else { *offset };
                if to < 0 || to > hw {
                    return Err(EngineError::DeleteOutOfRange { offset: *offset, hw });
                }
                if to > log_start {
                    raised.push((*tp, to));
                }
                Ok(to.max(log_start))
            })
            .collect();
        if raised.is_empty() {
            return answers;
        }
        let rows: Vec<_> = raised.iter().map(|(tp, s)| (tp.topic, tp.partition, *s)).collect();
        let applied = self.catalog.put_log_starts(&rows).map_err(EngineError::from).and_then(|()| Ok(self.switch(storage::Switch::log_starts(raised.clone()))?));
        if let Err(e) = applied {
            let why = e.to_string();
            for a in answers.iter_mut().filter(|a| a.is_ok()) {
                *a = Err(EngineError::Storage(StorageError::Catalog(why.clone())));
            }
            return answers;
        }
        self.trim_txns(&raised);
        tracing::info!(partitions = raised.len(), "records deleted (log starts raised)");
        answers
    }

    /// Forgets aborted transactions wholly below raised log starts.
    pub(super) fn trim_txns(&self, starts: &[(Tp, i64)]) {
        if self.any_txns.load(std::sync::atomic::Ordering::Acquire) && !starts.is_empty() {
            let mut txns = self.txns.write().expect("txns lock");
            for (tp, start) in starts {
                txns.trim(tp, *start);
            }
        }
    }
}
