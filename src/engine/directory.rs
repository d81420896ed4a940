//! Cluster mode's topics: the [`TopicDirectory`] the engine asks before a
//! topic change, and how a node follows the topics the cluster decided.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::{probe, Engine, EngineError, Topic};
use crate::meta::TopicRecord;

/// Cluster mode: where topics are decided (the cluster's etcd). The engine
/// asks it before it creates, deletes, grows or reconfigures a topic, and
/// changes its own copy only once it agreed; every other node follows what
/// it decided ([`Engine::follow_topics`]). Single-node mode has none: the
/// catalog decides alone. Calls block, as the engine's admin calls do.
pub trait TopicDirectory: Send + Sync {
    /// Records a new topic (its id chosen); `TopicExists` if its name is
    /// taken in the cluster.
    fn create(&self, topic: &TopicRecord) -> Result<(), EngineError>;
    /// Removes the topic of this name and id.
    fn delete(&self, topic: &TopicRecord) -> Result<(), EngineError>;
    /// Replaces the topic's record (more partitions, other configs),
    /// provided the cluster still holds `old`.
    fn update(&self, old: &TopicRecord, new: &TopicRecord) -> Result<(), EngineError>;
    /// Replaces the cluster-wide dynamic broker configs (BROKER ""),
    /// provided the cluster still holds `old` (or already `new`).
    fn update_cluster_configs(&self, old: &BTreeMap<String, String>, new: &BTreeMap<String, String>) -> Result<(), EngineError>;
}

impl Engine {
    /// Cluster mode: topics are decided by `directory` from now on.
    pub fn set_directory(&self, directory: Arc<dyn TopicDirectory>) {
        if self.directory.set(directory).is_err() {
            panic!("a topic directory is set once");
        }
    }

    /// Cluster mode: makes the cluster-wide dynamic broker configs
    /// (BROKER "", the topic defaults every broker shares) those `read`
    /// gives, read under the admin lock (as `follow_topics` reads), and
    /// derives every topic's config again. Values are taken as stored
    /// values are at start: leniently, what does not apply here is left
    /// out with a warning. Returns whether anything changed. Blocking.
    pub fn follow_cluster_configs(&self, read: impl FnOnce() -> BTreeMap<String, String>) -> bool {
        let _admin = self.admin.lock().expect("admin lock");
        let wanted = read();
        let old = self.defaults();
        if old.layers.cluster == wanted {
            return false;
        }
        let mut layers = old.layers.clone();
        layers.cluster = wanted;
        tracing::info!(configs = ?layers.cluster, "following the cluster's broker configs");
        self.take_defaults(layers);
        true
    }

    /// Cluster mode: makes this node's topics those of `wanted` (the
    /// cluster's, by name): creates the missing ones with their ids,
    /// removes those the cluster no longer has (or has under another id:
    /// deleted and created again meanwhile; never one named in `keep`,
    /// whose record in the cluster is unreadable), adds partitions and
    /// takes new configs. A topic whose configs this node cannot apply keeps
    /// what it has, with a warning. Returns how many changes it made (a
    /// topic replaced under another id counts twice).
    /// Blocking.
    ///
    /// `read` gives (wanted, keep) and is called under the admin lock, so
    /// what is followed is the cluster as it is then: a view read before
    /// a creation or deletion this node made meanwhile (and answered)
    /// would undo it.
    pub fn follow_topics(&self, read: impl FnOnce() -> (BTreeMap<String, TopicRecord>, BTreeSet<String>)) -> usize {
        let _admin = self.admin.lock().expect("admin lock");
        let (wanted, keep) = read();
        let mut changed = 0;
        for t in self.topics() {
            if !keep.contains(t.name()) && wanted.get(t.name()).is_none_or(|w| w.id != t.id()) {
                match self.remove_topic(&t) {
                    Ok(()) => changed += 1,
                    Err(e) => tracing::error!(topic = t.name(), error = %e, "removing a topic the cluster deleted failed"),
                }
            }
        }
        let limit = self.cfg.topic_defaults.max_message_bytes_limit;
        let mut new = Vec::new();
        for (name, w) in &wanted {
            let result = match self.topic(name) {
                // Kept under another id (its record unreadable now): left
                // alone, not grown into the other topic.
                Some(t) if keep.contains(name) && t.id() != w.id => continue,
                None => {
                    let (config, skipped) = self.defaults().topic.overlay_stored(&w.configs, limit);
                    for e in skipped {
                        tracing::warn!(topic = %name, key = %e.key, error = %e, "a topic config from the cluster does not apply here; left out");
                    }
                    new.push(Arc::new(Topic { record: w.clone(), config, traffic: Arc::new(probe::Traffic::new(self.cfg.probe.traffic.clone())) }));
                    continue;
                }
                Some(t) if t.partitions() < w.partitions => self.grow_topic(&t, TopicRecord { configs: t.record.configs.clone(), ..w.clone() }).map(|()| true),
                Some(_) => Ok(false),
            };
            let result = result.and_then(|grown| {
                let t = self.topic(name).expect("present");
                if t.record.configs == w.configs {
                    return Ok(grown);
                }
                let (config, _) = self.defaults().topic.overlay_stored(&w.configs, limit);
                let record = TopicRecord { configs: w.configs.clone(), ..t.record.clone() };
                self.catalog.put_topic(&record)?;
                self.catalog.flush()?;
                self.replace_topic(Topic { record, config, traffic: t.traffic.clone() });
                Ok(true)
            });
            match result {
                Ok(true) => changed += 1,
                Ok(false) => {}
                Err(e) => tracing::error!(topic = %name, error = %e, "following the cluster's topic failed"),
            }
        }
        if !new.is_empty() {
            changed += self.add_topics(new);
        }
        changed
    }
}
