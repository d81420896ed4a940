//! The cluster's etcd key layout, under `/canopy/<cluster_name>/`:
//!
//! | key | value |
//! | --- | --- |
//! | `cluster_id` | the cluster id (written once, by the first node) |
//! | `nodes/<id>` | a node's [`super::NodeRecord`], JSON, under its lease |
//! | `controller` | the controller's node id, under its lease |
//! | `producer_ids` | every producer id below this was handed out in a block (KIP-730) |
//!
//! Later steps add `topics/` and `units/` (docs/cluster.md).

/// What a key under the prefix names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    ClusterId,
    Node(i32),
    Controller,
    ProducerIds,
}

/// The keys of one cluster.
#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    pub fn new(cluster_name: &str) -> Keys {
        Keys { prefix: format!("/canopy/{cluster_name}/") }
    }

    /// Every key of the cluster starts with this.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn cluster_id(&self) -> Vec<u8> {
        format!("{}cluster_id", self.prefix).into_bytes()
    }

    pub fn node(&self, id: i32) -> Vec<u8> {
        format!("{}nodes/{id}", self.prefix).into_bytes()
    }

    pub fn controller(&self) -> Vec<u8> {
        format!("{}controller", self.prefix).into_bytes()
    }

    pub fn producer_ids(&self) -> Vec<u8> {
        format!("{}producer_ids", self.prefix).into_bytes()
    }

    /// What `key` names; `None` for keys outside the prefix or of kinds
    /// this version does not know (a newer node's).
    pub fn parse(&self, key: &[u8]) -> Option<Key> {
        let rest = std::str::from_utf8(key).ok()?.strip_prefix(&self.prefix)?;
        match rest {
            "cluster_id" => Some(Key::ClusterId),
            "controller" => Some(Key::Controller),
            "producer_ids" => Some(Key::ProducerIds),
            _ => {
                let id = rest.strip_prefix("nodes/")?;
                // Only the canonical spelling (no sign, no leading zero).
                let n: i32 = id.parse().ok().filter(|n: &i32| *n >= 0 && n.to_string() == id)?;
                Some(Key::Node(n))
            }
        }
    }
}

/// The cluster name a key prefix may carry: letters, digits, `-`, `_`, `.`.
pub fn valid_cluster_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 64 && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_read_back_and_strangers_are_unknown() {
        let k = Keys::new("prod");
        assert_eq!(k.parse(&k.node(12)), Some(Key::Node(12)));
        assert_eq!(k.parse(&k.controller()), Some(Key::Controller));
        assert_eq!(k.parse(&k.cluster_id()), Some(Key::ClusterId));
        assert_eq!(k.parse(&k.producer_ids()), Some(Key::ProducerIds));
        for bad in ["/canopy/prod/nodes/", "/canopy/prod/nodes/-1", "/canopy/prod/nodes/01", "/canopy/prod/nodes/+1", "/canopy/prod/nodes/1/x", "/canopy/prod/nodes/99999999999", "/canopy/prodx/controller", "/canopy/prod/units/a~0", "controller"] {
            assert_eq!(k.parse(bad.as_bytes()), None, "{bad}");
        }
        assert_eq!(k.parse(&[0xff, 0xfe]), None);
        assert!(valid_cluster_name("canopy-1.eu_west"));
        for bad in ["", "a/b", "a b", &"x".repeat(65)] {
            assert!(!valid_cluster_name(bad), "{bad}");
        }
    }
}
