//! Principals of the REST bridge: API tokens, and where each principal may
//! produce. Loaded from a TOML file (`principals_file`). Passwords are not
//! kept here: HTTP Basic checks the SCRAM users (`users.rs`), the same
//! store SASL uses; an entry without a token limits where the SCRAM user
//! of that name may produce over REST.
//!
//! ```toml
//! [[principal]]
//! name = "ingest-ci"
//! token_sha256 = "<hex sha-256 of the API key / Bearer token>"
//! produce = ["app.codestore.*"]
//!
//! [[principal]]
//! name = "alice"                       # a SCRAM user (canopy user …)
//! produce = ["*"]
//! ```
//!
//! Tokens (long random secrets, not passwords) are stored as SHA-256
//! digests; a presented token is hashed and compared with every digest in
//! constant time. Topic patterns are globs where `*` matches any run of
//! characters (`app.*`, `*.commits`, `*`). A principal `name` is
//! `User:name` to the authorizer and the client quotas.

pub mod acl;
pub mod mapping;
pub mod oauth;
pub mod quota;
pub mod sasl;
pub mod scram;
pub mod users;

use std::path::Path;

use sha2::{Digest, Sha256};

/// Who a Kafka connection acts as (Kafka's `KafkaPrincipal`): `User:alice`
/// after SASL, `User:CN=...` from a client certificate, `User:ANONYMOUS`
/// otherwise. ACLs name principals this way.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KafkaPrincipal {
    pub kind: String,
    pub name: String,
}

impl KafkaPrincipal {
    pub fn user(name: impl Into<String>) -> KafkaPrincipal {
        KafkaPrincipal { kind: "User".into(), name: name.into() }
    }

    pub fn anonymous() -> KafkaPrincipal {
        KafkaPrincipal::user("ANONYMOUS")
    }
}

impl std::fmt::Display for KafkaPrincipal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.kind, self.name)
    }
}

/// A credential as a listener received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential<'a> {
    /// An API key or Bearer token.
    Token(&'a [u8]),
    /// A user name and password (HTTP Basic; SASL PLAIN later).
    Password { user: &'a str, password: &'a [u8] },
}

#[derive(Debug, Clone)]
pub struct Principal {
    pub name: String,
    produce: Vec<String>,
}

impl Principal {
    /// May this principal produce to `topic`?
    pub fn may_produce(&self, topic: &str) -> bool {
        self.produce.iter().any(|p| glob(p.as_bytes(), topic.as_bytes()))
    }
}

/// `*` matches any run of bytes; everything else itself.
pub(crate) fn glob(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, t));
            p += 1;
        } else if p < pattern.len() && pattern[p] == text[t] {
            p += 1;
            t += 1;
        } else if let Some((sp, st)) = star {
            p = sp + 1;
            t = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

fn digest(secret: &[u8]) -> [u8; 32] {
    Sha256::digest(secret).into()
}

/// Equal in time independent of where they differ.
fn same(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[derive(Debug, Default)]
pub struct Principals {
    principals: Vec<Principal>,
    tokens: Vec<([u8; 32], usize)>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    principal: Vec<Entry>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    name: String,
    token_sha256: Option<String>,
    password_sha256: Option<String>,
    #[serde(default)]
    produce: Vec<String>,
}

fn unhex32(s: &str) -> Option<[u8; 32]> {
    let s = s.trim();
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

impl Principals {
    pub fn load(path: &Path) -> Result<Principals, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Principals::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Principals, String> {
        let file: File = toml::from_str(text).map_err(|e| e.to_string())?;
        let mut out = Principals::default();
        for (i, e) in file.principal.into_iter().enumerate() {
            if e.name.is_empty() {
                return Err(format!("principal {i} has no name"));
            }
            if e.password_sha256.is_some() {
                return Err(format!(
                    "principal {}: password_sha256 is no longer accepted (an unsalted digest of a password is weak): give the user a SCRAM credential with `canopy user --name {}` (HTTP Basic checks those) and keep only its produce list here",
                    e.name, e.name
                ));
            }
            if out.principals.iter().any(|p| p.name == e.name) {
                return Err(format!("principal {} is defined twice", e.name));
            }
            let n = out.principals.len();
            if let Some(t) = &e.token_sha256 {
                let d = unhex32(t).ok_or_else(|| format!("principal {}: token_sha256 must be 64 hex digits", e.name))?;
                if out.tokens.iter().any(|(x, _)| same(x, &d)) {
                    return Err(format!("principal {}: its token is another principal's", e.name));
                }
                out.tokens.push((d, n));
            }
            out.principals.push(Principal { name: e.name, produce: e.produce });
        }
        Ok(out)
    }

    pub fn is_empty(&self) -> bool {
        self.principals.is_empty()
    }

    /// The principal named `name`.
    pub fn find(&self, name: &str) -> Option<&Principal> {
        self.principals.iter().find(|p| p.name == name)
    }

    /// The principal a token proves, if any (passwords are the SCRAM
    /// users', checked by the caller).
    pub fn authenticate(&self, c: &Credential<'_>) -> Option<&Principal> {
        match c {
            Credential::Token(t) => {
                let d = digest(t);
                // Every token is compared, so the time does not tell which.
                let mut found = None;
                for (x, i) in &self.tokens {
                    if same(x, &d) {
                        found = Some(*i);
                    }
                }
                found.map(|i| &self.principals[i])
            }
            Credential::Password { .. } => None,
        }
    }
}

/// The hex SHA-256 of a secret, for the principals file.
pub fn hash_secret(secret: &[u8]) -> String {
    digest(secret).iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> Principals {
        Principals::parse(&format!(
            "[[principal]]\nname = \"ci\"\ntoken_sha256 = \"{}\"\nproduce = [\"app.codestore.*\", \"logs\"]\n\n[[principal]]\nname = \"alice\"\nproduce = [\"*\"]\n",
            hash_secret(b"s3cret-token"),
        ))
        .unwrap()
    }

    #[test]
    fn credentials_and_patterns() {
        let s = store();
        let ci = s.authenticate(&Credential::Token(b"s3cret-token")).unwrap();
        assert_eq!(ci.name, "ci");
        assert!(ci.may_produce("app.codestore.commits") && ci.may_produce("logs"));
        assert!(!ci.may_produce("app.billing.x") && !ci.may_produce("logs.x") && !ci.may_produce("app.codestore"));
        assert!(s.authenticate(&Credential::Token(b"s3cret-tokem")).is_none());
        assert!(s.authenticate(&Credential::Token(b"")).is_none());
        // Passwords are the SCRAM users': the file proves none.
        assert!(s.authenticate(&Credential::Password { user: "alice", password: b"pw" }).is_none());
        assert!(s.authenticate(&Credential::Password { user: "ci", password: b"s3cret-token" }).is_none(), "a token is not a password");
        assert!(s.find("alice").unwrap().may_produce("anything.at.all"), "alice's produce list, for her SCRAM login");
    }

    #[test]
    fn globs() {
        for (p, t, m) in [("*", "", true), ("a*", "abc", true), ("*.c", "a.b.c", true), ("a.*.c", "a.b.c", true), ("a.*.c", "a.c", false), ("a**b", "ab", true), ("abc", "abd", false), ("", "x", false)] {
            assert_eq!(glob(p.as_bytes(), t.as_bytes()), m, "{p} ~ {t}");
        }
    }

    #[test]
    fn bad_files_are_refused_with_a_reason() {
        let with_password = format!("[[principal]]\nname = \"x\"\npassword_sha256 = \"{}\"\n", hash_secret(b"pw"));
        for (text, why) in [
            (with_password.as_str(), "no longer accepted"),
            ("[[principal]]\nname = \"x\"\n[[principal]]\nname = \"x\"\n", "twice"),
            ("[[principal]]\nname = \"x\"\ntoken_sha256 = \"abc\"\n", "64 hex"),
            ("[[principal]]\nname = \"x\"\ntoken_sha256 = \"zz\"\nextra = 1\n", "unknown field"),
            ("[[principal]]\nname = \"\"\ntoken_sha256 = \"00\"\n", "no name"),
            ("not toml [", ""),
        ] {
            let e = Principals::parse(text).unwrap_err();
            assert!(e.contains(why), "{text}: {e}");
        }
        let dup = format!("[[principal]]\nname = \"a\"\ntoken_sha256 = \"{0}\"\n[[principal]]\nname = \"b\"\ntoken_sha256 = \"{0}\"\n", hash_secret(b"t"));
        assert!(Principals::parse(&dup).unwrap_err().contains("another principal"));
    }
}
