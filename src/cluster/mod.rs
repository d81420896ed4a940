//! Cluster mode (issue 24; the design is `docs/cluster.md`): which nodes
//! form the cluster and which of them is the controller, as etcd holds it.
//!
//! Every node registers a [`NodeRecord`] under its lease and watches the
//! cluster's keys; what it has seen is a [`ClusterView`], published to the
//! Kafka handlers through a [`Membership`]. Single-node mode (no
//! `etcd_endpoints`) has the same shape: a view of one node that is its
//! own controller, fixed for the process's life, so handlers never ask
//! which mode they run in.
//!
//! The pure parts live here and in [`keys`]: the records, the key layout,
//! and the view built from etcd's key-value events (unit-tested without
//! etcd). The etcd session itself ([`etcd`]) is built with the `cluster`
//! feature.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

#[cfg(feature = "cluster")]
pub mod etcd;
pub mod keys;

/// How a node reaches the cluster's etcd, and how long its registration
/// outlives its last keep-alive.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    pub node_id: i32,
    /// etcd client URLs (`http://host:port`).
    pub etcd_endpoints: Vec<String>,
    /// The etcd key prefix is `/canopy/<cluster_name>/`: one etcd can hold
    /// several clusters.
    pub cluster_name: String,
    pub rack: Option<String>,
    /// A node whose lease is not renewed for this long leaves the cluster
    /// (Kafka's `broker.session.timeout.ms`); etcd counts leases in whole
    /// seconds, so it is rounded up to one.
    pub session_timeout_ms: u64,
    /// How often the lease is renewed (`broker.heartbeat.interval.ms`).
    pub heartbeat_interval_ms: u64,
}

/// One address a node serves a Kafka listener on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    pub listener: String,
    pub host: String,
    pub port: i32,
}

/// What a node registers about itself (`nodes/<id>`, JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub id: i32,
    pub rack: Option<String>,
    /// Tells a node's registrations apart: a restarted node registers again
    /// with a new one (its lease id in cluster mode; the broker epoch that
    /// fetches and KIP-951 answers carry).
    pub incarnation: i64,
    pub endpoints: Vec<Endpoint>,
}

impl NodeRecord {
    /// The node's address on `listener`, else on its first listener (a
    /// node whose listeners differ from this one's is still reachable by
    /// clients on some listener; Kafka requires the same names on every
    /// broker and would leave such a node out).
    pub fn endpoint(&self, listener: &str) -> Option<&Endpoint> {
        self.endpoints.iter().find(|e| e.listener == listener)
    }
}

/// The controller: a node holding the `controller` key, and that key's
/// create revision, which is its epoch (a later controller's is larger).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Controller {
    pub id: i32,
    pub epoch: i64,
}

/// The cluster as one node has seen it: the live nodes and the controller.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterView {
    pub cluster_id: String,
    pub nodes: BTreeMap<i32, NodeRecord>,
    pub controller: Option<Controller>,
    /// The etcd revision this view reflects (0 in single-node mode).
    pub revision: i64,
}

/// This node's place in the cluster, shared by the handlers: the latest
/// view, and whether the node may still act as a member.
pub struct Membership {
    node_id: i32,
    view: watch::Receiver<Arc<ClusterView>>,
    fence: Arc<Fence>,
}

impl Membership {
    /// Single-node mode: `me`, alone and the controller, for ever.
    pub fn single(cluster_id: String, me: NodeRecord) -> Membership {
        let id = me.id;
        let view = ClusterView { cluster_id, nodes: BTreeMap::from([(id, me)]), controller: Some(Controller { id, epoch: 1 }), revision: 0 };
        let (tx, rx) = watch::channel(Arc::new(view));
        // Nothing publishes again; the receiver keeps the last value.
        drop(tx);
        Membership { node_id: id, view: rx, fence: Arc::new(Fence::forever()) }
    }

    pub(crate) fn new(node_id: i32, view: watch::Receiver<Arc<ClusterView>>, fence: Arc<Fence>) -> Membership {
        Membership { node_id, view, fence }
    }

    pub fn node_id(&self) -> i32 {
        self.node_id
    }

    /// The latest view (cheap: an `Arc`).
    pub fn view(&self) -> Arc<ClusterView> {
        self.view.borrow().clone()
    }

    /// A receiver that wakes at every new view.
    pub fn subscribe(&self) -> watch::Receiver<Arc<ClusterView>> {
        self.view.clone()
    }

    /// Whether this node's registration is still certainly alive: its
    /// lease was renewed recently enough that etcd cannot have expired it.
    /// Past that, the node must not act as a member (lead, coordinate).
    pub fn in_good_standing(&self) -> bool {
        self.fence.alive()
    }

    /// The controller's id, or -1 while there is none (Kafka's answer).
    pub fn controller_id(&self) -> i32 {
        self.view().controller.map_or(-1, |c| c.id)
    }
}

/// The local deadline of a node's lease, on the monotonic clock: the send
/// time of the last keep-alive etcd acknowledged, plus the lease's TTL,
/// minus a margin for clock rate differences. A paused process (SIGSTOP)
/// wakes past it, and then knows it may have been expired.
pub(crate) struct Fence {
    origin: Instant,
    /// Microseconds since `origin`; `u64::MAX`: no deadline (single node);
    /// 0: no lease.
    deadline_us: AtomicU64,
}

impl Fence {
    pub(crate) fn forever() -> Fence {
        Fence { origin: Instant::now(), deadline_us: AtomicU64::new(u64::MAX) }
    }

    pub(crate) fn lapsed() -> Fence {
        Fence { origin: Instant::now(), deadline_us: AtomicU64::new(0) }
    }

    /// The lease is certainly alive until `until`.
    pub(crate) fn extend(&self, until: Instant) {
        let us = until.saturating_duration_since(self.origin).as_micros().min(u64::MAX as u128 - 1) as u64;
        self.deadline_us.fetch_max(us, Ordering::AcqRel);
    }

    /// The lease is gone (expired, revoked): nothing is certain until a new
    /// registration extends it again.
    pub(crate) fn revoke(&self) {
        self.deadline_us.store(0, Ordering::Release);
    }

    pub(crate) fn alive(&self) -> bool {
        let d = self.deadline_us.load(Ordering::Acquire);
        d == u64::MAX || (self.origin.elapsed().as_micros() as u64) < d
    }
}

/// Builds a [`ClusterView`] from the cluster's keys: a full read, then the
/// watch's events, in revision order. Values that do not decode are left
/// out (and reported once by the caller): a damaged or foreign key must
/// not stop a node from following the rest.
#[derive(Debug, Default, Clone)]
pub struct ViewBuilder {
    view: ClusterView,
}

/// One change to a key under the cluster's prefix.
#[derive(Debug, Clone)]
pub enum KeyEvent<'a> {
    Put { key: &'a [u8], value: &'a [u8], create_revision: i64 },
    Delete { key: &'a [u8] },
}

impl ViewBuilder {
    pub fn view(&self) -> &ClusterView {
        &self.view
    }

    /// Applies one event of `revision`. `Err` names a value that did not
    /// decode (the event is otherwise ignored).
    pub fn apply(&mut self, keys: &keys::Keys, event: KeyEvent<'_>, revision: i64) -> Result<(), String> {
        self.view.revision = self.view.revision.max(revision);
        let (key, value) = match event {
            KeyEvent::Put { key, value, create_revision } => (key, Some((value, create_revision))),
            KeyEvent::Delete { key } => (key, None),
        };
        match keys.parse(key) {
            Some(keys::Key::Node(id)) => match value {
                None => {
                    self.view.nodes.remove(&id);
                }
                Some((v, _)) => {
                    let rec: NodeRecord = serde_json::from_slice(v).map_err(|e| format!("node {id}: {e}"))?;
                    if rec.id != id {
                        return Err(format!("node {id}: the record names node {}", rec.id));
                    }
                    self.view.nodes.insert(id, rec);
                }
            },
            Some(keys::Key::Controller) => {
                self.view.controller = match value {
                    None => None,
                    Some((v, create_revision)) => {
                        let id = std::str::from_utf8(v).ok().and_then(|s| s.parse::<i32>().ok()).ok_or("controller: not a node id")?;
                        Some(Controller { id, epoch: create_revision })
                    }
                };
            }
            Some(keys::Key::ClusterId) => {
                if let Some((v, _)) = value {
                    self.view.cluster_id = String::from_utf8(v.to_vec()).map_err(|_| "cluster id: not UTF-8")?;
                }
            }
            None => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: i32) -> NodeRecord {
        NodeRecord { id, rack: None, incarnation: 7, endpoints: vec![Endpoint { listener: "PLAINTEXT".into(), host: "127.0.0.1".into(), port: 9092 + id }] }
    }

    #[test]
    fn a_view_follows_puts_and_deletes_and_skips_what_does_not_decode() {
        let k = keys::Keys::new("c1");
        let mut b = ViewBuilder::default();
        let one = serde_json::to_vec(&rec(1)).unwrap();
        let two = serde_json::to_vec(&rec(2)).unwrap();
        b.apply(&k, KeyEvent::Put { key: &k.cluster_id(), value: b"abc", create_revision: 2 }, 2).unwrap();
        b.apply(&k, KeyEvent::Put { key: &k.node(1), value: &one, create_revision: 3 }, 3).unwrap();
        b.apply(&k, KeyEvent::Put { key: &k.node(2), value: &two, create_revision: 4 }, 4).unwrap();
        b.apply(&k, KeyEvent::Put { key: &k.controller(), value: b"2", create_revision: 5 }, 5).unwrap();
        assert_eq!(b.view().nodes.keys().copied().collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(b.view().controller, Some(Controller { id: 2, epoch: 5 }));
        assert_eq!((b.view().cluster_id.as_str(), b.view().revision), ("abc", 5));

        // Damage: a record that is not JSON, one naming another node, a
        // controller that is not a number. Each is refused, the view kept.
        let before = b.view().clone();
        assert!(b.apply(&k, KeyEvent::Put { key: &k.node(3), value: b"{not json", create_revision: 6 }, 6).is_err());
        assert!(b.apply(&k, KeyEvent::Put { key: &k.node(3), value: &one, create_revision: 7 }, 7).is_err());
        assert!(b.apply(&k, KeyEvent::Put { key: &k.controller(), value: b"two", create_revision: 8 }, 8).is_err());
        assert_eq!((&b.view().nodes, b.view().controller), (&before.nodes, before.controller));
        // Keys of other clusters or unknown kinds change nothing.
        let other = keys::Keys::new("c2");
        b.apply(&k, KeyEvent::Put { key: &other.node(4), value: &one, create_revision: 9 }, 9).unwrap();
        b.apply(&k, KeyEvent::Put { key: b"/canopy/c1/later/x", value: b"", create_revision: 10 }, 10).unwrap();
        assert_eq!(b.view().nodes.len(), 2);

        // A node's lease lapses; the controller with it.
        b.apply(&k, KeyEvent::Delete { key: &k.node(2) }, 11).unwrap();
        b.apply(&k, KeyEvent::Delete { key: &k.controller() }, 11).unwrap();
        assert_eq!(b.view().nodes.keys().copied().collect::<Vec<_>>(), vec![1]);
        assert_eq!((b.view().controller, b.view().revision), (None, 11));
    }

    #[test]
    fn a_fence_holds_until_its_deadline_and_not_after_a_revoke() {
        let f = Fence::lapsed();
        assert!(!f.alive());
        f.extend(Instant::now() + std::time::Duration::from_secs(60));
        assert!(f.alive());
        // An older keep-alive's answer arriving late does not shorten it.
        f.extend(Instant::now());
        assert!(f.alive());
        f.revoke();
        assert!(!f.alive());
        f.extend(Instant::now() - std::time::Duration::from_millis(1));
        assert!(!f.alive(), "a deadline in the past is no standing");
        assert!(Fence::forever().alive());
    }

    #[test]
    fn single_node_mode_is_a_cluster_of_one_controlled_by_itself() {
        let m = Membership::single("id".into(), rec(0));
        assert_eq!((m.node_id(), m.controller_id()), (0, 0));
        assert!(m.in_good_standing());
        assert_eq!(m.view().nodes.len(), 1);
        assert_eq!(m.view().nodes[&0].endpoint("PLAINTEXT").map(|e| e.port), Some(9092));
        assert_eq!(m.view().nodes[&0].endpoint("SSL"), None);
    }
}
