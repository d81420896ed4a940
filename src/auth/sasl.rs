//! SASL mechanisms, independent of the Kafka wire: a mechanism's server
//! side turns client tokens into server tokens until it knows who the
//! client is. The Kafka listener (`kafka/session.rs`) carries the tokens.
//!
//! - PLAIN (RFC 4616): `authzid NUL authcid NUL password`, checked against
//!   the user's SCRAM credential (one PBKDF2).
//! - SCRAM-SHA-256 / SCRAM-SHA-512: see `scram.rs`.
//! - OAUTHBEARER (RFC 7628): a JWT checked against a JWKS, see `oauth.rs`.

use super::oauth::{self, Validator};
use super::scram::{Mechanism, ScramError, ScramServer, Step};
use super::users::UserStore;

/// Longest SASL token accepted (PLAIN: two names and a password; SCRAM:
/// see `scram::MAX_MESSAGE_BYTES`).
pub const MAX_TOKEN_BYTES: usize = 64 << 10;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SaslMechanism {
    Plain,
    Scram(Mechanism),
    OAuthBearer,
}

impl SaslMechanism {
    pub const ALL: [SaslMechanism; 4] = [SaslMechanism::Plain, SaslMechanism::Scram(Mechanism::Sha256), SaslMechanism::Scram(Mechanism::Sha512), SaslMechanism::OAuthBearer];

    pub fn name(self) -> &'static str {
        match self {
            SaslMechanism::Plain => "PLAIN",
            SaslMechanism::Scram(m) => m.name(),
            SaslMechanism::OAuthBearer => "OAUTHBEARER",
        }
    }

    pub fn from_name(name: &str) -> Option<SaslMechanism> {
        SaslMechanism::ALL.into_iter().find(|m| m.name() == name)
    }

    /// PBKDF2 runs in this mechanism's step: run it off the async workers.
    pub fn is_slow(self) -> bool {
        matches!(self, SaslMechanism::Plain)
    }
}

impl std::fmt::Display for SaslMechanism {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Why an exchange failed: for the log and the metric. The client sees
/// only `client_message`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SaslError {
    #[error("malformed PLAIN token: {0}")]
    MalformedPlain(&'static str),
    #[error("invalid user name or password")]
    Password,
    #[error("{0}")]
    Scram(#[from] ScramError),
    #[error("token of {0} bytes is over the limit")]
    TooLong(usize),
    #[error("malformed OAUTHBEARER message: {0}")]
    MalformedOAuth(&'static str),
    #[error("{0}")]
    Token(String),
    #[error("OAUTHBEARER is not configured (no JWKS)")]
    NoValidator,
}

impl SaslError {
    /// What the client is told (Kafka's wording): never which part failed.
    pub fn client_message(&self, mech: SaslMechanism) -> String {
        match self {
            SaslError::MalformedPlain(_) | SaslError::TooLong(_) | SaslError::Scram(ScramError::Malformed(_)) => format!("Authentication failed: malformed {mech} token"),
            SaslError::Password => "Authentication failed: Invalid username or password".into(),
            SaslError::Scram(_) => format!("Authentication failed during authentication due to invalid credentials with SASL mechanism {mech}"),
            // Kafka fails the exchange with RFC 7628's error document.
            SaslError::MalformedOAuth(_) | SaslError::Token(_) | SaslError::NoValidator => String::from_utf8_lossy(oauth::INVALID_TOKEN).into_owned(),
        }
    }
}

/// What a step produced.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Send this token and wait for the client's next.
    Continue(Vec<u8>),
    /// The client is `user`; send `reply` (possibly empty). A credential
    /// that expires (an OAUTHBEARER token) says when, in seconds since the
    /// Unix epoch.
    Done { user: String, reply: Vec<u8>, expires_s: Option<u64> },
}

/// The server's side of one SASL exchange.
pub struct Exchange {
    mech: SaslMechanism,
    scram: Option<ScramServer>,
    /// OAUTHBEARER: why the token was refused, once the error document has
    /// been sent and the client's `\x01` is awaited.
    refused: Option<SaslError>,
}

impl Exchange {
    pub fn new(mech: SaslMechanism) -> Exchange {
        let scram = match mech {
            SaslMechanism::Scram(m) => Some(ScramServer::new(m)),
            SaslMechanism::Plain | SaslMechanism::OAuthBearer => None,
        };
        Exchange { mech, scram, refused: None }
    }

    pub fn mechanism(&self) -> SaslMechanism {
        self.mech
    }

    pub fn step(&mut self, token: &[u8], users: &UserStore, oauth: Option<&Validator>) -> Result<Outcome, SaslError> {
        if token.len() > MAX_TOKEN_BYTES {
            return Err(SaslError::TooLong(token.len()));
        }
        if self.mech == SaslMechanism::OAuthBearer {
            return self.oauth_step(token, oauth);
        }
        match &mut self.scram {
            Some(s) => {
                let m = s.mechanism();
                match s.step(token, |u| users.scram(u, m), users.decoy_secret())? {
                    Step::Continue(t) => Ok(Outcome::Continue(t)),
                    Step::Done { user, reply } => Ok(Outcome::Done { user, reply, expires_s: None }),
                }
            }
            None => {
                let (user, password) = plain(token)?;
                if users.verify_password(user, password) {
                    Ok(Outcome::Done { user: user.to_owned(), reply: Vec::new(), expires_s: None })
                } else {
                    Err(SaslError::Password)
                }
            }
        }
    }

    /// OAUTHBEARER: a valid token completes; an invalid one is answered
    /// with the error document, and the exchange fails on the client's
    /// next message (its `\x01`, or anything else).
    fn oauth_step(&mut self, token: &[u8], oauth: Option<&Validator>) -> Result<Outcome, SaslError> {
        if let Some(why) = self.refused.take() {
            return Err(why);
        }
        let checked = (|| {
            let (authzid, jwt) = oauth::initial_response(token).map_err(SaslError::MalformedOAuth)?;
            let v = oauth.ok_or(SaslError::NoValidator)?.validate(jwt).map_err(SaslError::Token)?;
            // Kafka acts for nobody else: an authorization id must name
            // the token's own principal.
            if authzid.is_some_and(|a| a != v.principal) {
                return Err(SaslError::Token(format!("the authorization id is not the token's principal {}", v.principal)));
            }
            Ok(v)
        })();
        match checked {
            Ok(v) => Ok(Outcome::Done { user: v.principal, reply: Vec::new(), expires_s: Some(v.expires_s) }),
            Err(e) => {
                self.refused = Some(e);
                Ok(Outcome::Continue(oauth::INVALID_TOKEN.to_vec()))
            }
        }
    }
}

/// Splits a PLAIN token into the user and the password.
fn plain(token: &[u8]) -> Result<(&str, &[u8]), SaslError> {
    let mut parts = token.splitn(3, |&b| b == 0);
    let (authzid, authcid, password) = match (parts.next(), parts.next(), parts.next()) {
        (Some(a), Some(b), Some(c)) => (a, b, c),
        _ => return Err(SaslError::MalformedPlain("expected authzid NUL user NUL password")),
    };
    let user = std::str::from_utf8(authcid).map_err(|_| SaslError::MalformedPlain("user name is not UTF-8"))?;
    if user.is_empty() {
        return Err(SaslError::MalformedPlain("empty user name"));
    }
    if password.is_empty() {
        return Err(SaslError::MalformedPlain("empty password"));
    }
    // Kafka acts for nobody else: an authorization id must be the user's own.
    if !authzid.is_empty() && authzid != authcid {
        return Err(SaslError::Password);
    }
    Ok((user, password))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> (tempfile::TempDir, UserStore) {
        let dir = tempfile::tempdir().unwrap();
        super::super::users::set_password(dir.path(), "alice", b"pw", &Mechanism::ALL, 4096).unwrap();
        let catalog = crate::meta::Catalog::open(&dir.path().join("catalog")).unwrap();
        let users = UserStore::load(&catalog).unwrap();
        (dir, users)
    }

    #[test]
    fn plain_checks_the_password_and_the_authorization_id() {
        let (_d, users) = store();
        let run = |t: &[u8]| Exchange::new(SaslMechanism::Plain).step(t, &users, None);
        assert_eq!(run(b"\0alice\0pw"), Ok(Outcome::Done { user: "alice".into(), reply: vec![], expires_s: None }));
        assert_eq!(run(b"alice\0alice\0pw"), Ok(Outcome::Done { user: "alice".into(), reply: vec![], expires_s: None }));
        assert_eq!(run(b"bob\0alice\0pw"), Err(SaslError::Password));
        assert_eq!(run(b"\0alice\0pW"), Err(SaslError::Password));
        assert_eq!(run(b"\0bob\0pw"), Err(SaslError::Password));
        // A NUL in the password is part of it. (Trailing NULs are not:
        // PBKDF2 keys HMAC with the password, and HMAC pads keys with
        // zeros, in Kafka as here.)
        assert_eq!(run(b"\0alice\0pw\0x"), Err(SaslError::Password));
        for bad in [&b""[..], b"alice", b"\0alice", b"\0\0pw", b"\0alice\0", b"\0\xff\0pw"] {
            assert!(matches!(run(bad), Err(SaslError::MalformedPlain(_))), "{bad:?}");
        }
        assert_eq!(run(&vec![0; MAX_TOKEN_BYTES + 1]), Err(SaslError::TooLong(MAX_TOKEN_BYTES + 1)));
    }

    #[test]
    fn scram_through_the_exchange() {
        let (_d, users) = store();
        for m in Mechanism::ALL {
            let mut ex = Exchange::new(SaslMechanism::Scram(m));
            let mut client = super::super::scram::client::ScramClient::new(m, "alice", b"pw");
            let Ok(Outcome::Continue(first)) = ex.step(&client.first(), &users, None) else { panic!() };
            let last = client.last(&first).unwrap();
            let Ok(Outcome::Done { user, reply, .. }) = ex.step(&last, &users, None) else { panic!() };
            assert_eq!(user, "alice");
            assert!(client.verify(&reply));
        }
    }
}
