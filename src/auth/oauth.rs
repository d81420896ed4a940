//! SASL OAUTHBEARER (RFC 7628, KIP-255/KIP-768): the client presents a JWT,
//! checked against the keys of a local JWKS file, as Kafka's JWKS-backed
//! validator does: the signature (asymmetric algorithms only, the key
//! chosen by `kid`), expiry and not-before within a clock skew, the
//! audience and issuer when configured, and the principal from a
//! configured claim (`sub` by default).
//!
//! The exchange: the client's first message is a GS2 header and key-value
//! pairs, `n,[a=<authzid>],\x01auth=Bearer <jwt>\x01[key=value\x01]*\x01`.
//! A valid token completes it with an empty reply; an invalid one is
//! answered with RFC 7628's JSON error (`{"status":"invalid_token"}`), the
//! client acknowledges with `\x01`, and only then does the exchange fail,
//! as Kafka's server does.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};

/// What the operator configures.
#[derive(Debug, Clone)]
pub struct OAuthConfig {
    pub jwks_file: PathBuf,
    /// Accepted audiences (`aud`); empty: the audience is not checked.
    pub audience: Vec<String>,
    /// The expected issuer (`iss`), if checked.
    pub issuer: Option<String>,
    /// The claim naming the principal (Kafka's `sasl.oauthbearer.sub.claim.name`).
    pub sub_claim: String,
    /// Tolerated clock difference, in seconds (Kafka's default: 30).
    pub clock_skew_s: u64,
}

/// A token's verdict: who it names and until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Validated {
    pub principal: String,
    /// Seconds since the Unix epoch.
    pub expires_s: u64,
}

pub struct Validator {
    keys: Vec<(Jwk, DecodingKey)>,
    cfg: OAuthConfig,
}

/// The asymmetric algorithms a JWKS key may verify (a symmetric `HS*`
/// token is refused whatever the file holds).
const ALGORITHMS: [Algorithm; 9] = [
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::EdDSA,
];

impl Validator {
    /// Reads the JWKS file; keys of an unknown or symmetric type are
    /// refused (a mistake in the file is an error at start, not a silent
    /// hole).
    pub fn load(cfg: OAuthConfig) -> Result<Validator, String> {
        let text = std::fs::read_to_string(&cfg.jwks_file).map_err(|e| format!("{}: {e}", cfg.jwks_file.display()))?;
        Validator::from_jwks(&text, cfg)
    }

    pub fn from_jwks(text: &str, cfg: OAuthConfig) -> Result<Validator, String> {
        let set: JwkSet = serde_json::from_str(text).map_err(|e| format!("{}: not a JWKS: {e}", cfg.jwks_file.display()))?;
        let mut keys = Vec::with_capacity(set.keys.len());
        for jwk in set.keys {
            // A key meant for something else never verifies a signature.
            if jwk.common.public_key_use.as_ref().is_some_and(|u| *u != jsonwebtoken::jwk::PublicKeyUse::Signature)
                || jwk.common.key_operations.as_ref().is_some_and(|ops| !ops.contains(&jsonwebtoken::jwk::KeyOperations::Verify))
            {
                continue;
            }
            if matches!(jwk.algorithm, jsonwebtoken::jwk::AlgorithmParameters::OctetKey(_)) {
                return Err(format!("{}: symmetric (oct) keys are not accepted", cfg.jwks_file.display()));
            }
            let key = DecodingKey::from_jwk(&jwk).map_err(|e| format!("{}: key {:?}: {e}", cfg.jwks_file.display(), jwk.common.key_id))?;
            keys.push((jwk, key));
        }
        if keys.is_empty() {
            return Err(format!("{}: the JWKS holds no signature keys", cfg.jwks_file.display()));
        }
        Ok(Validator { keys, cfg })
    }

    pub fn jwks_file(&self) -> &Path {
        &self.cfg.jwks_file
    }

    /// Checks `token`; the error says why (for the log, never the client).
    pub fn validate(&self, token: &str) -> Result<Validated, String> {
        let header = jsonwebtoken::decode_header(token).map_err(|e| format!("malformed token: {e}"))?;
        if !ALGORITHMS.contains(&header.alg) {
            return Err(format!("algorithm {:?} is not accepted", header.alg));
        }
        // The key named by `kid`; without one, the only key there is.
        let (jwk, key) = match &header.kid {
            Some(kid) => self.keys.iter().find(|(j, _)| j.common.key_id.as_deref() == Some(kid)).ok_or_else(|| format!("no key {kid:?} in the JWKS"))?,
            None if self.keys.len() == 1 => &self.keys[0],
            None => return Err("the token names no key (kid) and the JWKS holds several".into()),
        };
        if let Some(alg) = jwk.common.key_algorithm {
            if format!("{alg:?}") != format!("{:?}", header.alg) {
                return Err(format!("key {:?} is for {alg:?}, the token is {:?}", header.kid, header.alg));
            }
        }
        let mut v = Validation::new(header.alg);
        v.leeway = self.cfg.clock_skew_s;
        v.validate_nbf = true;
        // A configured audience or issuer makes its claim required (a token
        // that leaves it out does not pass), as in Kafka.
        let mut required = vec!["exp"];
        if self.cfg.audience.is_empty() {
            v.validate_aud = false;
        } else {
            v.set_audience(&self.cfg.audience);
            required.push("aud");
        }
        if let Some(iss) = &self.cfg.issuer {
            v.set_issuer(&[iss]);
            required.push("iss");
        }
        v.set_required_spec_claims(&required);
        let data = jsonwebtoken::decode::<HashMap<String, serde_json::Value>>(token, key, &v).map_err(|e| format!("invalid token: {e}"))?;
        let principal = match data.claims.get(&self.cfg.sub_claim) {
            Some(serde_json::Value::String(s)) if !s.is_empty() => s.clone(),
            _ => return Err(format!("the token has no {} claim naming the principal", self.cfg.sub_claim)),
        };
        let expires_s = data.claims.get("exp").and_then(|e| e.as_f64()).map(|e| e.max(0.0) as u64).ok_or("the token has no numeric exp claim")?;
        Ok(Validated { principal, expires_s })
    }
}

/// RFC 7628's error answer, sent before the exchange fails.
pub const INVALID_TOKEN: &[u8] = br#"{"status":"invalid_token"}"#;

/// The client's first message: its authorization id, if any, and the
/// bearer token.
pub fn initial_response(msg: &[u8]) -> Result<(Option<&str>, &str), &'static str> {
    let msg = std::str::from_utf8(msg).map_err(|_| "not UTF-8")?;
    let rest = msg.strip_prefix("n,").ok_or("no GS2 header (n,)")?;
    let (authzid, rest) = rest.split_once(',').ok_or("no GS2 header end")?;
    let authzid = match authzid {
        "" => None,
        a => Some(a.strip_prefix("a=").filter(|a| !a.is_empty()).ok_or("malformed authorization id")?),
    };
    let pairs = rest.strip_prefix('\u{1}').and_then(|r| r.strip_suffix("\u{1}\u{1}")).ok_or("key-value pairs not framed by \\x01")?;
    let mut token = None;
    for kv in pairs.split('\u{1}') {
        let (k, v) = kv.split_once('=').ok_or("a key without a value")?;
        if k.is_empty() || !k.bytes().all(|b| b.is_ascii_alphabetic()) {
            return Err("malformed key");
        }
        if k == "auth" {
            if token.is_some() {
                return Err("auth given twice");
            }
            let t = v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")).ok_or("auth is not a Bearer token")?;
            token = Some(t.trim());
        }
    }
    let token = token.filter(|t| !t.is_empty()).ok_or("no auth=Bearer token")?;
    Ok((authzid, token))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn initial_responses_are_parsed_as_rfc_7628_frames_them() {
        assert_eq!(initial_response(b"n,,\x01auth=Bearer abc.def.ghi\x01\x01"), Ok((None, "abc.def.ghi")));
        assert_eq!(initial_response(b"n,a=alice,\x01auth=Bearer t\x01ext=1\x01\x01"), Ok((Some("alice"), "t")));
        for bad in [
            &b""[..],
            b"n,,",
            b"y,,\x01auth=Bearer t\x01\x01",
            b"n,,\x01auth=Bearer t\x01",
            b"n,,\x01auth=Basic t\x01\x01",
            b"n,,\x01auth=Bearer \x01\x01",
            b"n,,\x01auth=Bearer t\x01auth=Bearer u\x01\x01",
            b"n,,\x01host\x01\x01",
            b"n,b=x,\x01auth=Bearer t\x01\x01",
            b"n,,\x01\xff=1\x01\x01",
        ] {
            assert!(initial_response(bad).is_err(), "{bad:?}");
        }
    }

    use base64::Engine as _;
    use jsonwebtoken::{EncodingKey, Header};

    /// A P-256 key, and its public half as a JWKS entry named `kid`.
    pub(crate) fn es256_key(kid: &str) -> (EncodingKey, serde_json::Value) {
        let kp = rcgen::KeyPair::generate().unwrap();
        let raw = kp.public_key_raw();
        let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
        let jwk = serde_json::json!({"kty": "EC", "crv": "P-256", "x": b64(&raw[1..33]), "y": b64(&raw[33..65]), "kid": kid, "alg": "ES256", "use": "sig"});
        (EncodingKey::from_ec_der(&kp.serialize_der()), jwk)
    }

    fn now() -> u64 {
        jsonwebtoken::get_current_timestamp()
    }

    fn sign(key: &EncodingKey, kid: Option<&str>, claims: serde_json::Value) -> String {
        let mut h = Header::new(Algorithm::ES256);
        h.kid = kid.map(str::to_owned);
        jsonwebtoken::encode(&h, &claims, key).unwrap()
    }

    fn validator(jwks: &[&serde_json::Value], audience: &[&str], issuer: Option<&str>) -> Validator {
        let cfg = OAuthConfig { jwks_file: "jwks.json".into(), audience: audience.iter().map(|a| a.to_string()).collect(), issuer: issuer.map(str::to_owned), sub_claim: "sub".into(), clock_skew_s: 30 };
        Validator::from_jwks(&serde_json::json!({ "keys": jwks }).to_string(), cfg).unwrap()
    }

    #[test]
    fn tokens_are_checked_for_signature_time_audience_issuer_and_subject() {
        let (key, jwk) = es256_key("k1");
        let (other, other_jwk) = es256_key("k2");
        let v = validator(&[&jwk, &other_jwk], &["kafka"], Some("https://idp"));
        let good = serde_json::json!({"sub": "alice", "exp": now() + 300, "iat": now(), "aud": "kafka", "iss": "https://idp"});
        let expires_s = good["exp"].as_u64().unwrap();
        assert_eq!(v.validate(&sign(&key, Some("k1"), good.clone())), Ok(Validated { principal: "alice".into(), expires_s }));
        let without = |c: &serde_json::Value, k: &str| {
            let mut c = c.clone();
            c.as_object_mut().unwrap().remove(k);
            c
        };
        let with = |k: &str, val: serde_json::Value| {
            let mut c = good.clone();
            c[k] = val;
            c
        };
        let refused = [
            ("expired beyond the skew", sign(&key, Some("k1"), with("exp", (now() - 60).into()))),
            ("not yet valid", sign(&key, Some("k1"), with("nbf", (now() + 120).into()))),
            ("another audience", sign(&key, Some("k1"), with("aud", "other".into()))),
            ("another issuer", sign(&key, Some("k1"), with("iss", "https://evil".into()))),
            ("no subject", sign(&key, Some("k1"), with("sub", serde_json::Value::Null))),
            ("no audience", sign(&key, Some("k1"), without(&good, "aud"))),
            ("no issuer", sign(&key, Some("k1"), without(&good, "iss"))),
            ("no expiry", sign(&key, Some("k1"), without(&good, "exp"))),
            ("signed by k2's key but naming k1 (forged)", sign(&other, Some("k1"), good.clone())),
            ("an unknown key", sign(&key, Some("k9"), good.clone())),
            ("no kid with several keys", sign(&key, None, good.clone())),
        ];
        for (what, token) in refused {
            assert!(v.validate(&token).is_err(), "{what}");
        }
        // A tampered payload: the signature no longer matches.
        let t = sign(&key, Some("k1"), good.clone());
        let mut parts: Vec<String> = t.split('.').map(str::to_owned).collect();
        parts[1] = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(with("sub", "admin".into()).to_string());
        assert!(v.validate(&parts.join(".")).is_err(), "tampered");
        // alg none, and HS256 keyed with the public key (key confusion).
        let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        let none = format!("{}.{}.", b64(r#"{"alg":"none","kid":"k1"}"#), b64(&good.to_string()));
        assert!(v.validate(&none).is_err(), "alg none");
        let mut h = Header::new(Algorithm::HS256);
        h.kid = Some("k1".into());
        let hs = jsonwebtoken::encode(&h, &good, &EncodingKey::from_secret(jwk["x"].as_str().unwrap().as_bytes())).unwrap();
        assert!(v.validate(&hs).is_err(), "HS256");
        assert!(v.validate("not.a.jwt").is_err());
        // Without audience and issuer settings, neither is checked; one
        // key and no kid is that key.
        let open = validator(&[&jwk], &[], None);
        assert!(open.validate(&sign(&key, None, with("aud", "anything".into()))).is_ok());
    }

    #[test]
    fn symmetric_and_empty_key_sets_are_refused() {
        let cfg = OAuthConfig { jwks_file: "jwks.json".into(), audience: vec![], issuer: None, sub_claim: "sub".into(), clock_skew_s: 30 };
        assert!(Validator::from_jwks(r#"{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}"#, cfg.clone()).is_err());
        assert!(Validator::from_jwks(r#"{"keys":[]}"#, cfg.clone()).is_err());
        let enc = r#"{"keys":[{"kty":"EC","crv":"P-256","use":"enc","x":"pg6y13ZljaF6Z6MTQ7zCuf8kn8rT4mkFaidRl7Im-4o","y":"L5Uq7_3BUjT6Yb9DeVUTVkXy6G7PyBKUsAgGk0pLdkE"}]}"#;
        assert!(Validator::from_jwks(enc, cfg.clone()).is_err(), "an encryption key verifies nothing");
        assert!(Validator::from_jwks("not json", cfg).is_err());
    }
}
