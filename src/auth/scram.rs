//! SCRAM (RFC 5802, RFC 7677) as Kafka speaks it: SCRAM-SHA-256 and
//! SCRAM-SHA-512, the server's side of the exchange, and the stored
//! credential.
//!
//! ```text
//! client-first   n,,n=<user>,r=<client nonce>[,<extensions>]
//! server-first   r=<client nonce><server nonce>,s=<base64 salt>,i=<iterations>
//! client-final   c=biws,r=<nonce>,p=<base64 proof>
//! server-final   v=<base64 server signature>        (or e=<error>)
//! ```
//!
//! A credential is what Kafka stores (`ScramCredential`): salt, iteration
//! count, `StoredKey = H(HMAC(SaltedPassword, "Client Key"))` and
//! `ServerKey = HMAC(SaltedPassword, "Server Key")`, never the password or
//! the salted password. The proof a client sends is checked against
//! `StoredKey`; the server proves itself with `ServerKey`.
//!
//! An unknown user is not told apart from a wrong password: the server
//! answers the first message with a salt derived from the user name and a
//! per-process secret and the usual iteration count, and refuses the
//! proof. (Kafka refuses an unknown user at the first message, which tells
//! an attacker which names exist.)
//!
//! The primitives (SHA-2, HMAC, PBKDF2, randomness) are ring's; the
//! comparison of secrets is subtle's constant-time one. This file only
//! parses and composes the messages.

use base64::Engine as _;
use ring::{digest, hmac, pbkdf2, rand::SecureRandom};
use subtle::ConstantTimeEq;

/// Kafka's bounds on a SCRAM credential's iteration count
/// (`ScramMechanism.minIterations` / `maxIterations`).
pub const MIN_ITERATIONS: u32 = 4096;
pub const MAX_ITERATIONS: u32 = 16384;
/// Longest SCRAM message accepted: user names and nonces are short, and a
/// message is parsed whole.
pub const MAX_MESSAGE_BYTES: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub enum Mechanism {
    #[serde(rename = "SCRAM-SHA-256")]
    Sha256,
    #[serde(rename = "SCRAM-SHA-512")]
    Sha512,
}

impl Mechanism {
    pub const ALL: [Mechanism; 2] = [Mechanism::Sha256, Mechanism::Sha512];

    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Sha256 => "SCRAM-SHA-256",
            Mechanism::Sha512 => "SCRAM-SHA-512",
        }
    }

    pub fn from_name(name: &str) -> Option<Mechanism> {
        Mechanism::ALL.into_iter().find(|m| m.name() == name)
    }

    /// Kafka's wire number of the mechanism (`ScramMechanism` type): 1 is
    /// SHA-256, 2 SHA-512; 0 is unknown.
    pub fn kafka_type(self) -> i8 {
        match self {
            Mechanism::Sha256 => 1,
            Mechanism::Sha512 => 2,
        }
    }

    pub fn from_kafka_type(t: i8) -> Option<Mechanism> {
        Mechanism::ALL.into_iter().find(|m| m.kafka_type() == t)
    }

    fn hmac(self) -> hmac::Algorithm {
        match self {
            Mechanism::Sha256 => hmac::HMAC_SHA256,
            Mechanism::Sha512 => hmac::HMAC_SHA512,
        }
    }

    fn digest(self) -> &'static digest::Algorithm {
        match self {
            Mechanism::Sha256 => &digest::SHA256,
            Mechanism::Sha512 => &digest::SHA512,
        }
    }

    fn pbkdf2(self) -> pbkdf2::Algorithm {
        match self {
            Mechanism::Sha256 => pbkdf2::PBKDF2_HMAC_SHA256,
            Mechanism::Sha512 => pbkdf2::PBKDF2_HMAC_SHA512,
        }
    }

    /// The hash's output length: the length of every key.
    pub fn key_len(self) -> usize {
        self.digest().output_len()
    }

    fn mac(self, key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
        let mut ctx = hmac::Context::with_key(&hmac::Key::new(self.hmac(), key));
        for p in parts {
            ctx.update(p);
        }
        ctx.sign().as_ref().to_vec()
    }

    fn hash(self, data: &[u8]) -> Vec<u8> {
        digest::digest(self.digest(), data).as_ref().to_vec()
    }

    /// `Hi(password, salt, i)`: PBKDF2 with the mechanism's HMAC.
    pub fn salted_password(self, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
        let mut out = vec![0; self.key_len()];
        let n = std::num::NonZeroU32::new(iterations.max(1)).expect("at least one");
        pbkdf2::derive(self.pbkdf2(), n, salt, password, &mut out);
        out
    }
}

impl std::fmt::Display for Mechanism {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What the server keeps of a SCRAM password.
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Credential {
    #[serde(with = "b64")]
    pub salt: Vec<u8>,
    pub iterations: u32,
    #[serde(with = "b64")]
    pub stored_key: Vec<u8>,
    #[serde(with = "b64")]
    pub server_key: Vec<u8>,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Keys are secrets: a log line never carries them.
        f.debug_struct("Credential").field("iterations", &self.iterations).finish_non_exhaustive()
    }
}

mod b64 {
    use base64::Engine as _;
    pub fn serialize<S: serde::Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(v))
    }
    pub fn deserialize<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s: String = serde::Deserialize::deserialize(d)?;
        base64::engine::general_purpose::STANDARD.decode(s).map_err(serde::de::Error::custom)
    }
}

/// Fills `n` bytes from the system's secure random source.
pub fn random_bytes(n: usize) -> Vec<u8> {
    let mut out = vec![0; n];
    ring::rand::SystemRandom::new().fill(&mut out).expect("the system random source works");
    out
}

impl Credential {
    /// From a salted password, as AlterUserScramCredentials carries it.
    pub fn from_salted(mech: Mechanism, salted: &[u8], salt: Vec<u8>, iterations: u32) -> Credential {
        let client_key = mech.mac(salted, &[b"Client Key"]);
        Credential { salt, iterations, stored_key: mech.hash(&client_key), server_key: mech.mac(salted, &[b"Server Key"]) }
    }

    /// From a password, with a fresh random salt.
    pub fn from_password(mech: Mechanism, password: &[u8], iterations: u32) -> Credential {
        let salt = random_bytes(32);
        let salted = mech.salted_password(password, &salt, iterations);
        Credential::from_salted(mech, &salted, salt, iterations)
    }

    /// Does `password` derive this credential? (PLAIN and HTTP Basic check
    /// passwords this way: one PBKDF2, then a constant-time comparison.)
    pub fn verify_password(&self, mech: Mechanism, password: &[u8]) -> bool {
        let salted = mech.salted_password(password, &self.salt, self.iterations);
        let stored = mech.hash(&mech.mac(&salted, &[b"Client Key"]));
        bool::from(stored.ct_eq(&self.stored_key))
    }

    /// Does the credential fit its mechanism (keys of the hash's length,
    /// iterations in Kafka's bounds)?
    pub fn fits(&self, mech: Mechanism) -> bool {
        self.stored_key.len() == mech.key_len() && self.server_key.len() == mech.key_len() && (MIN_ITERATIONS..=MAX_ITERATIONS).contains(&self.iterations) && !self.salt.is_empty()
    }
}

/// Why an exchange failed. The client is told only that it failed; the
/// variant is for the log and the metric.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScramError {
    #[error("malformed SCRAM message: {0}")]
    Malformed(&'static str),
    #[error("the client asked for channel binding, which Kafka does not offer")]
    ChannelBinding,
    #[error("the client's final message does not carry the server's nonce")]
    Nonce,
    #[error("invalid credentials")]
    Credentials,
    #[error("a SCRAM exchange is already complete")]
    Done,
}

/// Where a server-side exchange stands.
enum State {
    /// Waiting for client-first.
    Start,
    /// Server-first sent; waiting for client-final.
    SentFirst(Box<SentFirst>),
    Done,
}

/// What the exchange keeps between the first message and the last.
struct SentFirst {
    user: String,
    client_first_bare: String,
    server_first: String,
    nonce: String,
    credential: Option<Credential>,
    decoy: Credential,
}

/// The server's side of one SCRAM exchange.
pub struct ScramServer {
    mech: Mechanism,
    state: State,
}

/// What a step produced: a message for the client, and once the proof is
/// accepted, who the client is.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    Continue(Vec<u8>),
    Done { user: String, reply: Vec<u8> },
}

/// Decodes a SCRAM `saslname`: `=2C` is `,` and `=3D` is `=`; any other
/// `=` is malformed.
fn saslname(s: &str) -> Result<String, ScramError> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('=') {
        out.push_str(&rest[..i]);
        match rest.get(i..i + 3) {
            Some("=2C") => out.push(','),
            Some("=3D") => out.push('='),
            _ => return Err(ScramError::Malformed("bad escape in the user name")),
        }
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    if out.is_empty() {
        return Err(ScramError::Malformed("empty user name"));
    }
    Ok(out)
}

/// Does the client's final message carry this exchange's nonce? RFC 5802
/// asks for exactly the server's nonce. librdkafka before 2.6.1 (Debian
/// 12's 2.0.2 under kcat, Ubuntu's 2.3.0) sends its own nonce in front of
/// it once more (librdkafka PR 4895; Kafka 3.8.1 to 3.9 accepted that
/// with `endsWith`). That form is accepted too, and only it: it still
/// holds the whole fresh server nonce, so a final message from another
/// exchange cannot be replayed, and the proof covers what was sent.
fn nonce_echoed(got: &str, nonce: &str, client_first_bare: &str) -> bool {
    if got == nonce {
        return true;
    }
    let client_nonce = client_first_bare.split(',').find_map(|a| a.strip_prefix("r=")).unwrap_or("");
    !client_nonce.is_empty() && got.strip_prefix(client_nonce) == Some(nonce)
}

/// A printable nonce (RFC 5802: printable ASCII but `,`).
fn valid_nonce(n: &str) -> bool {
    !n.is_empty() && n.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b',')
}

impl ScramServer {
    pub fn new(mech: Mechanism) -> ScramServer {
        ScramServer { mech, state: State::Start }
    }

    pub fn mechanism(&self) -> Mechanism {
        self.mech
    }

    /// One client message in, one server message out. `lookup` finds the
    /// user's credential for this mechanism; `decoy_secret` seeds the fake
    /// salt of unknown users.
    pub fn step(&mut self, msg: &[u8], lookup: impl FnOnce(&str) -> Option<Credential>, decoy_secret: &[u8]) -> Result<Step, ScramError> {
        if msg.len() > MAX_MESSAGE_BYTES {
            return Err(ScramError::Malformed("message too long"));
        }
        let msg = std::str::from_utf8(msg).map_err(|_| ScramError::Malformed("not UTF-8"))?;
        match std::mem::replace(&mut self.state, State::Done) {
            State::Start => self.client_first(msg, lookup, decoy_secret),
            State::SentFirst(f) => {
                let SentFirst { user, client_first_bare, server_first, nonce, credential, decoy } = *f;
                self.client_final(msg, user, &client_first_bare, &server_first, &nonce, credential, decoy)
            }
            State::Done => Err(ScramError::Done),
        }
    }

    fn client_first(&mut self, msg: &str, lookup: impl FnOnce(&str) -> Option<Credential>, decoy_secret: &[u8]) -> Result<Step, ScramError> {
        // gs2-header: a channel-binding flag, an optional authzid, then the
        // bare message.
        let (cbind, rest) = msg.split_once(',').ok_or(ScramError::Malformed("no GS2 header"))?;
        match cbind {
            "n" | "y" => {}
            c if c.starts_with("p=") => return Err(ScramError::ChannelBinding),
            _ => return Err(ScramError::Malformed("bad channel-binding flag")),
        }
        let (authzid, bare) = rest.split_once(',').ok_or(ScramError::Malformed("no GS2 header"))?;
        let mut attrs = bare.split(',');
        let user = match attrs.next() {
            Some(a) if a.starts_with("m=") => return Err(ScramError::Malformed("mandatory extension")),
            Some(a) => saslname(a.strip_prefix("n=").ok_or(ScramError::Malformed("no user name"))?)?,
            None => return Err(ScramError::Malformed("no user name")),
        };
        if !authzid.is_empty() {
            let authz = saslname(authzid.strip_prefix("a=").ok_or(ScramError::Malformed("bad authorization id"))?)?;
            // Kafka acts for nobody else: an authorization id must be the
            // user's own.
            if authz != user {
                return Err(ScramError::Credentials);
            }
        }
        let client_nonce = attrs.next().and_then(|a| a.strip_prefix("r=")).ok_or(ScramError::Malformed("no nonce"))?;
        if !valid_nonce(client_nonce) {
            return Err(ScramError::Malformed("bad nonce"));
        }
        // Extensions (Kafka's `tokenauth=true` and the like) are allowed
        // but none is acted on; each must be `key=value`.
        for ext in attrs {
            if !ext.contains('=') {
                return Err(ScramError::Malformed("bad extension"));
            }
        }
        let credential = lookup(&user).filter(|c| c.fits(self.mech));
        let decoy = {
            let salt = self.mech.mac(decoy_secret, &[user.as_bytes()]);
            Credential { salt: salt[..16].to_vec(), iterations: MIN_ITERATIONS, stored_key: random_bytes(self.mech.key_len()), server_key: random_bytes(self.mech.key_len()) }
        };
        let shown = credential.as_ref().unwrap_or(&decoy);
        let b64 = base64::engine::general_purpose::STANDARD;
        let nonce = format!("{client_nonce}{}", b64.encode(random_bytes(24)));
        let server_first = format!("r={nonce},s={},i={}", b64.encode(&shown.salt), shown.iterations);
        let reply = server_first.clone().into_bytes();
        self.state = State::SentFirst(Box::new(SentFirst { user, client_first_bare: bare.to_owned(), server_first, nonce, credential, decoy }));
        Ok(Step::Continue(reply))
    }

    #[allow(clippy::too_many_arguments)]
    fn client_final(&mut self, msg: &str, user: String, client_first_bare: &str, server_first: &str, nonce: &str, credential: Option<Credential>, decoy: Credential) -> Result<Step, ScramError> {
        let (without_proof, proof) = msg.rsplit_once(",p=").ok_or(ScramError::Malformed("no proof"))?;
        let mut attrs = without_proof.split(',');
        let binding = attrs.next().and_then(|a| a.strip_prefix("c=")).ok_or(ScramError::Malformed("no channel binding"))?;
        let b64 = base64::engine::general_purpose::STANDARD;
        // The GS2 header echoed: `n,,` or `y,,`, or with the authorization
        // id already checked to be the user's own.
        let header = b64.decode(binding).map_err(|_| ScramError::Malformed("channel binding is not base64"))?;
        if !(header.starts_with(b"n,") || header.starts_with(b"y,")) || !header.ends_with(b",") {
            return Err(ScramError::ChannelBinding);
        }
        let got_nonce = attrs.next().and_then(|a| a.strip_prefix("r=")).ok_or(ScramError::Malformed("no nonce"))?;
        if !nonce_echoed(got_nonce, nonce, client_first_bare) {
            return Err(ScramError::Nonce);
        }
        let proof = b64.decode(proof).map_err(|_| ScramError::Malformed("proof is not base64"))?;
        let auth_message = format!("{client_first_bare},{server_first},{without_proof}");
        let known = credential.is_some();
        let cred = credential.unwrap_or(decoy);
        if proof.len() != self.mech.key_len() {
            return Err(ScramError::Credentials);
        }
        let signature = self.mech.mac(&cred.stored_key, &[auth_message.as_bytes()]);
        let client_key: Vec<u8> = proof.iter().zip(&signature).map(|(p, s)| p ^ s).collect();
        let matches = bool::from(self.mech.hash(&client_key).ct_eq(&cred.stored_key));
        if !(matches && known) {
            return Err(ScramError::Credentials);
        }
        let server_signature = self.mech.mac(&cred.server_key, &[auth_message.as_bytes()]);
        Ok(Step::Done { user, reply: format!("v={}", b64.encode(server_signature)).into_bytes() })
    }
}

/// The client's side, for tests and the benchmark: what a real client
/// computes, step by step.
pub mod client {
    use super::*;

    pub struct ScramClient {
        pub mech: Mechanism,
        pub user: String,
        pub password: Vec<u8>,
        pub nonce: String,
        client_first_bare: String,
        auth_message: String,
        salted: Vec<u8>,
    }

    impl ScramClient {
        pub fn new(mech: Mechanism, user: &str, password: &[u8]) -> ScramClient {
            let nonce = base64::engine::general_purpose::STANDARD.encode(random_bytes(18));
            let name = user.replace('=', "=3D").replace(',', "=2C");
            ScramClient { mech, user: user.into(), password: password.into(), client_first_bare: format!("n={name},r={nonce}"), nonce, auth_message: String::new(), salted: Vec::new() }
        }

        pub fn first(&self) -> Vec<u8> {
            format!("n,,{}", self.client_first_bare).into_bytes()
        }

        /// Answers the server's first message: client-final.
        pub fn last(&mut self, server_first: &[u8]) -> Result<Vec<u8>, ScramError> {
            self.last_sending(server_first, |n| n.to_owned())
        }

        /// [`ScramClient::last`], sending `echo(server nonce)` as the nonce
        /// (what old librdkafka did, or a tampered one).
        pub fn last_sending(&mut self, server_first: &[u8], echo: impl Fn(&str) -> String) -> Result<Vec<u8>, ScramError> {
            let sf = std::str::from_utf8(server_first).map_err(|_| ScramError::Malformed("not UTF-8"))?;
            let mut nonce = None;
            let mut salt = None;
            let mut iterations = None;
            for a in sf.split(',') {
                match a.split_at_checked(2) {
                    Some(("r=", v)) => nonce = Some(v.to_owned()),
                    Some(("s=", v)) => salt = base64::engine::general_purpose::STANDARD.decode(v).ok(),
                    Some(("i=", v)) => iterations = v.parse::<u32>().ok(),
                    _ => {}
                }
            }
            let (nonce, salt, iterations) = (nonce.ok_or(ScramError::Nonce)?, salt.ok_or(ScramError::Malformed("salt"))?, iterations.ok_or(ScramError::Malformed("iterations"))?);
            if !nonce.starts_with(&self.nonce) {
                return Err(ScramError::Nonce);
            }
            self.salted = self.mech.salted_password(&self.password, &salt, iterations);
            let without_proof = format!("c=biws,r={}", echo(&nonce));
            self.auth_message = format!("{},{sf},{without_proof}", self.client_first_bare);
            let client_key = self.mech.mac(&self.salted, &[b"Client Key"]);
            let stored = self.mech.hash(&client_key);
            let signature = self.mech.mac(&stored, &[self.auth_message.as_bytes()]);
            let proof: Vec<u8> = client_key.iter().zip(&signature).map(|(k, s)| k ^ s).collect();
            Ok(format!("{without_proof},p={}", base64::engine::general_purpose::STANDARD.encode(proof)).into_bytes())
        }

        /// Checks the server's signature.
        pub fn verify(&self, server_final: &[u8]) -> bool {
            let server_key = self.mech.mac(&self.salted, &[b"Server Key"]);
            let expected = format!("v={}", base64::engine::general_purpose::STANDARD.encode(self.mech.mac(&server_key, &[self.auth_message.as_bytes()])));
            server_final == expected.as_bytes()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::client::ScramClient;
    use super::*;

    fn exchange(mech: Mechanism, stored: Option<Credential>, user: &str, password: &[u8]) -> Result<String, ScramError> {
        let mut server = ScramServer::new(mech);
        let mut client = ScramClient::new(mech, user, password);
        let Step::Continue(first) = server.step(&client.first(), |_| stored.clone(), b"decoy")? else { panic!("first step finishes nothing") };
        let last = client.last(&first)?;
        match server.step(&last, |_| unreachable!(), b"decoy")? {
            Step::Done { user, reply } => {
                assert!(client.verify(&reply), "the server proves it knows the credential");
                Ok(user)
            }
            Step::Continue(_) => panic!("two steps end SCRAM"),
        }
    }

    /// RFC 7677's example: user "user", password "pencil", with the RFC's
    /// nonces and salt, gives the RFC's proof and server signature.
    #[test]
    fn rfc7677_vector() {
        let mech = Mechanism::Sha256;
        let b64 = base64::engine::general_purpose::STANDARD;
        let salt = b64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let salted = mech.salted_password(b"pencil", &salt, 4096);
        let cred = Credential::from_salted(mech, &salted, salt, 4096);
        let client_first_bare = "n=user,r=rOprNGfwEbeRWgbNEkqO";
        let server_first = "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
        let without_proof = "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
        let proof = "dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=";
        let step = ScramServer { mech, state: State::Start }.client_final(
            &format!("{without_proof},p={proof}"),
            "user".into(),
            client_first_bare,
            server_first,
            "rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0",
            Some(cred.clone()),
            cred,
        );
        assert_eq!(step, Ok(Step::Done { user: "user".into(), reply: b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=".to_vec() }));
    }

    #[test]
    fn a_right_password_passes_and_a_wrong_one_fails() {
        for mech in Mechanism::ALL {
            let cred = Credential::from_password(mech, b"s3cret", 4096);
            assert_eq!(exchange(mech, Some(cred.clone()), "alice", b"s3cret"), Ok("alice".into()));
            assert_eq!(exchange(mech, Some(cred.clone()), "alice", b"s3creT"), Err(ScramError::Credentials));
            assert_eq!(exchange(mech, None, "nobody", b"s3cret"), Err(ScramError::Credentials));
            assert!(cred.verify_password(mech, b"s3cret") && !cred.verify_password(mech, b"s3cre"));
        }
        // A credential of the other mechanism's key length is not used.
        let cred256 = Credential::from_password(Mechanism::Sha256, b"pw", 4096);
        assert_eq!(exchange(Mechanism::Sha512, Some(cred256), "alice", b"pw"), Err(ScramError::Credentials));
    }

    #[test]
    fn an_unknown_user_sees_a_stable_salt_and_the_usual_iterations() {
        let first = |user: &str| {
            let mut s = ScramServer::new(Mechanism::Sha256);
            let Ok(Step::Continue(m)) = s.step(format!("n,,n={user},r=abc").as_bytes(), |_| None, b"k") else { panic!() };
            let m = String::from_utf8(m).unwrap();
            m.split(',').skip(1).map(str::to_owned).collect::<Vec<_>>()
        };
        assert_eq!(first("ghost"), first("ghost"), "the same salt each time, as a real user's");
        assert_ne!(first("ghost"), first("ghost2"));
        assert_eq!(first("ghost")[1], "i=4096");
    }

    #[test]
    fn tampered_messages_fail() {
        let mech = Mechanism::Sha256;
        let cred = Credential::from_password(mech, b"pw", 4096);
        let run = |tamper: &dyn Fn(String) -> String| {
            let mut server = ScramServer::new(mech);
            let mut client = ScramClient::new(mech, "alice", b"pw");
            let Step::Continue(first) = server.step(&client.first(), |_| Some(cred.clone()), b"d").unwrap() else { panic!() };
            let last = String::from_utf8(client.last(&first).unwrap()).unwrap();
            server.step(tamper(last).as_bytes(), |_| None, b"d")
        };
        assert!(matches!(run(&|m| m), Ok(Step::Done { .. })));
        // The nonce changed: the server's part of it is not echoed.
        assert_eq!(run(&|m| m.replacen("r=", "r=x", 1)), Err(ScramError::Nonce));
        // One bit of the proof flipped.
        assert_eq!(
            run(&|m| {
                let (head, p) = m.rsplit_once(",p=").unwrap();
                let b64 = base64::engine::general_purpose::STANDARD;
                let mut proof = b64.decode(p).unwrap();
                proof[0] ^= 1;
                format!("{head},p={}", b64.encode(proof))
            }),
            Err(ScramError::Credentials)
        );
        // A proof of the wrong length, a missing proof, a channel binding asked.
        assert_eq!(run(&|m| format!("{},p=AAAA", m.rsplit_once(",p=").unwrap().0)), Err(ScramError::Credentials));
        assert_eq!(run(&|m| m.rsplit_once(",p=").unwrap().0.to_owned()), Err(ScramError::Malformed("no proof")));
        assert_eq!(run(&|m| m.replacen("c=biws", "c=cD10bHMtdW5pcXVlLCw=", 1)), Err(ScramError::ChannelBinding));
        // Replay: a finished exchange takes nothing more.
        let mut server = ScramServer::new(mech);
        let mut client = ScramClient::new(mech, "alice", b"pw");
        let Step::Continue(first) = server.step(&client.first(), |_| Some(cred.clone()), b"d").unwrap() else { panic!() };
        let last = client.last(&first).unwrap();
        assert!(matches!(server.step(&last, |_| None, b"d"), Ok(Step::Done { .. })));
        assert_eq!(server.step(&last, |_| None, b"d"), Err(ScramError::Done));
        // A final message replayed into a fresh exchange fails: its nonce
        // is not this exchange's.
        let mut again = ScramServer::new(mech);
        let Step::Continue(_) = again.step(&client.first(), |_| Some(cred.clone()), b"d").unwrap() else { panic!() };
        assert_eq!(again.step(&last, |_| None, b"d"), Err(ScramError::Nonce));
    }

    /// librdkafka before 2.6.1 repeats its nonce in front of the server's:
    /// the exchange passes with that form, and with no other.
    #[test]
    fn old_librdkafkas_doubled_nonce_is_accepted_and_nothing_looser() {
        let mech = Mechanism::Sha512;
        let cred = Credential::from_password(mech, b"pw", 4096);
        let run = |double: &dyn Fn(&str, &str) -> String| {
            let mut server = ScramServer::new(mech);
            let mut client = ScramClient::new(mech, "alice", b"pw");
            let Step::Continue(first) = server.step(&client.first(), |_| Some(cred.clone()), b"d").unwrap() else { panic!() };
            let client_nonce = client.nonce.clone();
            let last = client.last_sending(&first, |server_nonce| double(&client_nonce, server_nonce)).unwrap();
            server.step(&last, |_| None, b"d")
        };
        assert!(matches!(run(&|_, s| s.to_owned()), Ok(Step::Done { .. })));
        assert!(matches!(run(&|c, s| format!("{c}{s}")), Ok(Step::Done { .. })), "librdkafka < 2.6.1");
        assert_eq!(run(&|c, s| format!("{c}{c}{s}")), Err(ScramError::Nonce));
        assert_eq!(run(&|_, s| format!("x{s}")), Err(ScramError::Nonce), "any prefix is not enough");
        assert_eq!(run(&|_, s| s[..s.len() - 1].to_owned()), Err(ScramError::Nonce));
    }

    #[test]
    fn malformed_first_messages_fail() {
        for m in [&b""[..], b"n", b"n,,", b"n,,r=abc", b"x,,n=a,r=b", b"p=tls-unique,,n=a,r=b", b"n,,n=,r=b", b"n,,n=a=2,r=b", b"n,,n=a", b"n,,n=a,r=", b"n,,n=a,r=a,b", b"n,,m=ext,n=a,r=b", b"n,a=bob,n=a,r=b", &[0xff, 0xfe]] {
            let r = ScramServer::new(Mechanism::Sha512).step(m, |_| None, b"d");
            assert!(r.is_err(), "{:?} passed", String::from_utf8_lossy(m));
        }
        let long = format!("n,,n={},r=abc", "a".repeat(MAX_MESSAGE_BYTES));
        assert_eq!(ScramServer::new(Mechanism::Sha512).step(long.as_bytes(), |_| None, b"d"), Err(ScramError::Malformed("message too long")));
        // Escaped names decode; the authorization id may repeat the user.
        let mut s = ScramServer::new(Mechanism::Sha256);
        assert!(s.step(b"n,a=a=2Cb,n=a=2Cb,r=abc", |u| { assert_eq!(u, "a,b"); None }, b"d").is_ok());
    }

    #[test]
    fn credentials_out_of_bounds_do_not_fit() {
        let mut c = Credential::from_password(Mechanism::Sha256, b"pw", 4096);
        assert!(c.fits(Mechanism::Sha256) && !c.fits(Mechanism::Sha512));
        c.iterations = 4095;
        assert!(!c.fits(Mechanism::Sha256));
        c.iterations = 16385;
        assert!(!c.fits(Mechanism::Sha256));
    }
}
