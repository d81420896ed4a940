//! The cluster's etcd key layout, under `/canopy/<cluster_name>/`:
//!
//! | key | value |
//! | --- | --- |
//! | `cluster_id` | the cluster id (written once, by the first node) |
//! | `nodes/<id>` | a node's [`super::NodeRecord`], JSON, under its lease |
//! | `controller` | the controller's node id, under its lease |
//! | `producer_ids` | every producer id below this was handed out in a block (KIP-730) |
//! | `topics/<name>` | a [`super::TopicEntry`], JSON |
//! | `units/<branch>~<p>` | a [`super::UnitRecord`], JSON |
//! | `acls/<hex of the ACL's key>` | one ACL ([`crate::auth::acl::Acl`]), JSON |
//! | `scram/<hex of the user name>` | a user's SCRAM credentials ([`crate::auth::users::Credentials`]), JSON |
//! | `quotas/<hex of the entity's key>` | an entity's client quotas ([`crate::auth::quota::QuotaRecord`]), JSON |
//! | `configs/broker` | the cluster-wide dynamic broker configs (BROKER ""), a JSON map |

/// What a key under the prefix names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Key {
    ClusterId,
    Node(i32),
    Controller,
    ProducerIds,
    Topic(String),
    Unit(String),
    /// An ACL, by the hex of its key ([`acl_id`]).
    Acl(String),
    /// A user's SCRAM credentials, by name.
    Scram(String),
    /// An entity's client quotas, by the hex of its key ([`quota_id`]).
    Quota(String),
    /// The cluster-wide dynamic broker configs.
    BrokerConfigs,
}

/// A quota entity's name in etcd: the hex of its key.
pub fn quota_id(e: &crate::auth::quota::Entity) -> String {
    hex(e.key().as_bytes())
}

/// Lower-case hex: how names that may hold any character go into keys.
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes of lower-case hex, if `s` is that.
fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.is_empty() || s.len() % 2 != 0 || !s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok()).collect()
}

/// An ACL's name in etcd: the hex of its key (which joins its fields with
/// NUL, and may hold any character a resource name or principal can).
pub fn acl_id(a: &crate::auth::acl::Acl) -> String {
    hex(a.key().as_bytes())
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

    pub fn topic(&self, name: &str) -> Vec<u8> {
        format!("{}topics/{name}", self.prefix).into_bytes()
    }

    pub fn unit(&self, name: &str) -> Vec<u8> {
        format!("{}units/{name}", self.prefix).into_bytes()
    }

    pub fn acl(&self, a: &crate::auth::acl::Acl) -> Vec<u8> {
        format!("{}acls/{}", self.prefix, acl_id(a)).into_bytes()
    }

    pub fn broker_configs(&self) -> Vec<u8> {
        format!("{}configs/broker", self.prefix).into_bytes()
    }

    pub fn quota(&self, e: &crate::auth::quota::Entity) -> Vec<u8> {
        format!("{}quotas/{}", self.prefix, quota_id(e)).into_bytes()
    }

    pub fn scram(&self, user: &str) -> Vec<u8> {
        format!("{}scram/{}", self.prefix, hex(user.as_bytes())).into_bytes()
    }

    /// What `key` names; `None` for keys outside the prefix or of kinds
    /// this version does not know (a newer node's).
    pub fn parse(&self, key: &[u8]) -> Option<Key> {
        let rest = std::str::from_utf8(key).ok()?.strip_prefix(&self.prefix)?;
        match rest {
            "cluster_id" => Some(Key::ClusterId),
            "controller" => Some(Key::Controller),
            "producer_ids" => Some(Key::ProducerIds),
            "configs/broker" => Some(Key::BrokerConfigs),
            _ if rest.starts_with("topics/") => {
                let name = &rest["topics/".len()..];
                if name != super::topics::COORDINATOR_TOPIC {
                    crate::engine::topics::validate_name(name).ok()?;
                }
                Some(Key::Topic(name.to_owned()))
            }
            _ if rest.starts_with("acls/") => {
                let id = &rest["acls/".len()..];
                unhex(id).map(|_| Key::Acl(id.to_owned()))
            }
            _ if rest.starts_with("quotas/") => {
                let id = &rest["quotas/".len()..];
                unhex(id).map(|_| Key::Quota(id.to_owned()))
            }
            _ if rest.starts_with("scram/") => String::from_utf8(unhex(&rest["scram/".len()..])?).ok().map(Key::Scram),
            _ if rest.starts_with("units/") => {
                // `<branch>~<p>`: a branch is a legal topic name (its first
                // one or two segments), p a canonical partition number.
                let (branch, p) = rest["units/".len()..].rsplit_once('~')?;
                if branch != super::topics::COORDINATOR_BRANCH {
                    crate::engine::topics::validate_name(branch).ok()?;
                }
                p.parse::<i32>().ok().filter(|n| *n >= 0 && n.to_string() == p)?;
                Some(Key::Unit(format!("{branch}~{p}")))
            }
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
        assert_eq!(k.parse(&k.broker_configs()), Some(Key::BrokerConfigs));
        assert_eq!(k.parse(&k.scram("ü/ser 1")), Some(Key::Scram("ü/ser 1".into())));
        assert_eq!(k.parse(&k.controller()), Some(Key::Controller));
        assert_eq!(k.parse(&k.cluster_id()), Some(Key::ClusterId));
        assert_eq!(k.parse(&k.producer_ids()), Some(Key::ProducerIds));
        assert_eq!(k.parse(&k.topic("app.web.clicks")), Some(Key::Topic("app.web.clicks".into())));
        assert_eq!(k.parse(&k.unit("app.web~12")), Some(Key::Unit("app.web~12".into())));
        assert_eq!(k.parse(&k.unit("__canopy.coordinators~49")), Some(Key::Unit("__canopy.coordinators~49".into())));
        for bad in [
            "/canopy/prod/nodes/",
            "/canopy/prod/nodes/-1",
            "/canopy/prod/nodes/01",
            "/canopy/prod/nodes/+1",
            "/canopy/prod/nodes/1/x",
            "/canopy/prod/nodes/99999999999",
            "/canopy/prodx/controller",
            "/canopy/prod/topics/",
            "/canopy/prod/topics/a b",
            "/canopy/prod/topics/a~0",
            "/canopy/prod/units/a",
            "/canopy/prod/units/a~",
            "/canopy/prod/units/a~01",
            "/canopy/prod/units/a~-1",
            "/canopy/prod/units/~0",
            "/canopy/prod/units/a/b~0",
            "/canopy/prod/units/__canopy.other~0",
            "/canopy/prod/acls/",
            "/canopy/prod/acls/abc",
            "/canopy/prod/acls/AB",
            "/canopy/prod/acls/zz",
            "/canopy/prod/scram/",
            "/canopy/prod/scram/ff",
            "/canopy/prod/scram/616",
            "controller",
        ] {
            assert_eq!(k.parse(bad.as_bytes()), None, "{bad}");
        }
        assert_eq!(k.parse(&[0xff, 0xfe]), None);
        assert!(valid_cluster_name("canopy-1.eu_west"));
        for bad in ["", "a/b", "a b", &"x".repeat(65)] {
            assert!(!valid_cluster_name(bad), "{bad}");
        }
    }
}
