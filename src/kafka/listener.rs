//! Kafka's listener model: named listeners, each with a security protocol
//! and an address to bind and one to advertise.
//!
//! ```text
//! listeners                       = "PLAINTEXT://127.0.0.1:9092,SASL_SSL://0.0.0.0:9093"
//! advertised_listeners            = "SASL_SSL://broker.example.com:9093"
//! listener_security_protocol_map  = "INTERNAL:SASL_PLAINTEXT,EXTERNAL:SSL"
//! ```
//!
//! A listener's name is its security protocol unless the map names it
//! otherwise. A client is told the addresses of the listener it came in
//! through (Metadata, FindCoordinator, DescribeCluster), as Kafka does.
//! A listener that is not advertised advertises the address it bound.

use std::sync::Arc;

use crate::auth::sasl::SaslMechanism;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecurityProtocol {
    Plaintext,
    Ssl,
    SaslPlaintext,
    SaslSsl,
}

impl SecurityProtocol {
    pub fn tls(self) -> bool {
        matches!(self, SecurityProtocol::Ssl | SecurityProtocol::SaslSsl)
    }

    pub fn sasl(self) -> bool {
        matches!(self, SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl)
    }

    pub fn name(self) -> &'static str {
        match self {
            SecurityProtocol::Plaintext => "PLAINTEXT",
            SecurityProtocol::Ssl => "SSL",
            SecurityProtocol::SaslPlaintext => "SASL_PLAINTEXT",
            SecurityProtocol::SaslSsl => "SASL_SSL",
        }
    }

    pub fn from_name(s: &str) -> Option<SecurityProtocol> {
        [SecurityProtocol::Plaintext, SecurityProtocol::Ssl, SecurityProtocol::SaslPlaintext, SecurityProtocol::SaslSsl].into_iter().find(|p| p.name() == s)
    }
}

/// A listener as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerSpec {
    pub name: String,
    pub protocol: SecurityProtocol,
    /// `host:port` to bind (an empty host binds every address).
    pub bind: String,
    /// `(host, port)` to advertise, if configured.
    pub advertised: Option<(String, i32)>,
}

/// `NAME://host:port` → (name, host, port).
fn endpoint(s: &str) -> Result<(String, String, u16), String> {
    let (name, addr) = s.split_once("://").ok_or_else(|| format!("{s:?} is not NAME://HOST:PORT"))?;
    let (host, port) = addr.rsplit_once(':').ok_or_else(|| format!("{s:?} has no port"))?;
    let port: u16 = port.parse().map_err(|_| format!("{s:?}: {port:?} is not a port"))?;
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
        return Err(format!("{s:?}: listener names are letters, digits, _ and -"));
    }
    Ok((name.to_ascii_uppercase(), host.trim_start_matches('[').trim_end_matches(']').to_owned(), port))
}

fn list(s: &str) -> impl Iterator<Item = &str> {
    s.split(',').map(str::trim).filter(|x| !x.is_empty())
}

/// Parses the three settings into listeners, checking what Kafka checks:
/// names unique, every name has a protocol, every advertised name is a
/// listener, no two listeners on one fixed port.
pub fn parse(listeners: &str, advertised: &str, protocol_map: &str) -> Result<Vec<ListenerSpec>, String> {
    let mut map = std::collections::HashMap::new();
    for entry in list(protocol_map) {
        let (name, proto) = entry.split_once(':').ok_or_else(|| format!("{entry:?} is not NAME:PROTOCOL"))?;
        let proto = SecurityProtocol::from_name(proto.trim()).ok_or_else(|| format!("{proto:?} is not PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"))?;
        map.insert(name.trim().to_ascii_uppercase(), proto);
    }
    let mut out: Vec<ListenerSpec> = Vec::new();
    for entry in list(listeners) {
        let (name, host, port) = endpoint(entry)?;
        let protocol = match map.get(&name) {
            Some(p) => *p,
            None => SecurityProtocol::from_name(&name).ok_or_else(|| format!("listener {name} has no security protocol (name it after one, or map it in listener_security_protocol_map)"))?,
        };
        if out.iter().any(|l| l.name == name) {
            return Err(format!("listener {name} is named twice"));
        }
        let bind = if host.is_empty() { format!("0.0.0.0:{port}") } else if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") };
        if port != 0 && out.iter().any(|l| l.bind.rsplit_once(':').map(|(_, p)| p) == Some(&port.to_string())) {
            return Err(format!("listener {name}: port {port} is taken by another listener"));
        }
        out.push(ListenerSpec { name, protocol, bind, advertised: None });
    }
    if out.is_empty() {
        return Err("no listener".into());
    }
    for entry in list(advertised) {
        let (name, host, port) = endpoint(entry)?;
        let l = out.iter_mut().find(|l| l.name == name).ok_or_else(|| format!("advertised listener {name} is not in listeners"))?;
        if host.is_empty() {
            return Err(format!("advertised listener {name} needs a host"));
        }
        l.advertised = Some((host, port as i32));
    }
    Ok(out)
}

/// A listener that is bound: what a connection through it needs.
#[derive(Clone)]
pub struct Listener {
    pub name: String,
    pub protocol: SecurityProtocol,
    pub advertised_host: String,
    pub advertised_port: i32,
    pub tls: Option<Arc<crate::tls::Reloading>>,
    /// SASL mechanisms offered (SASL listeners).
    pub mechanisms: Vec<SaslMechanism>,
    /// How a client certificate's subject becomes a principal name.
    pub principal_mapping: Arc<crate::auth::mapping::PrincipalMapper>,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener").field("name", &self.name).field("protocol", &self.protocol).field("advertised", &(&self.advertised_host, self.advertised_port)).finish()
    }
}

impl Listener {
    /// A plaintext listener advertising `host:port` (tests, the fuzz
    /// target).
    pub fn plaintext(host: impl Into<String>, port: i32) -> Listener {
        Listener { name: "PLAINTEXT".into(), protocol: SecurityProtocol::Plaintext, advertised_host: host.into(), advertised_port: port, tls: None, mechanisms: Vec::new(), principal_mapping: Default::default() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listeners_parse_as_kafka_writes_them() {
        let l = parse("PLAINTEXT://127.0.0.1:9092, sasl_ssl://:9093,INTERNAL://[::1]:0", "SASL_SSL://broker.example.com:19093", "INTERNAL:SASL_PLAINTEXT").unwrap();
        assert_eq!(l.len(), 3);
        assert_eq!((l[0].name.as_str(), l[0].protocol, l[0].bind.as_str(), &l[0].advertised), ("PLAINTEXT", SecurityProtocol::Plaintext, "127.0.0.1:9092", &None));
        assert_eq!((l[1].name.as_str(), l[1].protocol, l[1].bind.as_str()), ("SASL_SSL", SecurityProtocol::SaslSsl, "0.0.0.0:9093"));
        assert_eq!(l[1].advertised, Some(("broker.example.com".into(), 19093)));
        assert_eq!((l[2].protocol, l[2].bind.as_str()), (SecurityProtocol::SaslPlaintext, "[::1]:0"));
    }

    #[test]
    fn bad_listeners_are_refused_with_a_reason() {
        for (listeners, adv, map, why) in [
            ("", "", "", "no listener"),
            ("PLAINTEXT://a:1,PLAINTEXT://a:2", "", "", "twice"),
            ("PLAINTEXT://a:1,SSL://b:1", "", "", "taken"),
            ("FOO://a:1", "", "", "no security protocol"),
            ("FOO://a:1", "", "FOO:TLS", "is not PLAINTEXT"),
            ("PLAINTEXT://a", "", "", "no port"),
            ("PLAINTEXT://a:x", "", "", "not a port"),
            ("a:1", "", "", "NAME://"),
            ("PLAINTEXT://a:1", "SSL://b:1", "", "not in listeners"),
            ("PLAINTEXT://a:1", "PLAINTEXT://:1", "", "needs a host"),
            ("PLAIN TEXT://a:1", "", "", "letters"),
        ] {
            let e = parse(listeners, adv, map).unwrap_err();
            assert!(e.contains(why), "{listeners} / {adv} / {map}: {e}");
        }
    }
}
