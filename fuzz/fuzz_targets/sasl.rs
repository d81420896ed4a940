//! The SASL exchange's server side (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512,
//! OAUTHBEARER) on client tokens from the fuzzer: it never panics, and no
//! token gets an unknown client in (OAUTHBEARER's JWKS holds a public key
//! whose private half nobody has). The first byte picks the mechanism; the rest is
//! split at 0xFF into the tokens of one exchange. A known user's honest
//! first message is tried with the fuzzer's later tokens too, so the
//! client-final parser sees inputs after a real server-first.
#![no_main]

use canopy::auth::oauth::{OAuthConfig, Validator};
use canopy::auth::sasl::{Exchange, Outcome, SaslMechanism};
use canopy::auth::users::UserStore;
use libfuzzer_sys::fuzz_target;

fn store() -> &'static UserStore {
    static STORE: std::sync::OnceLock<UserStore> = std::sync::OnceLock::new();
    STORE.get_or_init(|| UserStore::in_memory(&[("alice", b"alice-pw")]))
}

fn validator() -> &'static Validator {
    static V: std::sync::OnceLock<Validator> = std::sync::OnceLock::new();
    V.get_or_init(|| {
        let jwks = r#"{"keys":[{"kty":"EC","crv":"P-256","kid":"k","alg":"ES256","x":"pg6y13ZljaF6Z6MTQ7zCuf8kn8rT4mkFaidRl7Im-4o","y":"L5Uq7_3BUjT6Yb9DeVUTVkXy6G7PyBKUsAgGk0pLdkE"}]}"#;
        let cfg = OAuthConfig { jwks_file: "fuzz.jwks".into(), audience: vec![], issuer: None, sub_claim: "sub".into(), clock_skew_s: 30 };
        Validator::from_jwks(jwks, cfg).expect("the fuzz JWKS loads")
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else { return };
    let mech = SaslMechanism::ALL[pick as usize % SaslMechanism::ALL.len()];
    let honest_first = (pick as usize / SaslMechanism::ALL.len()) % 2 == 1;
    let mut ex = Exchange::new(mech);
    let mut tokens: Vec<&[u8]> = rest.split(|&b| b == 0xff).take(4).collect();
    let first = b"n,,n=alice,r=fuzznonce".to_vec();
    if honest_first && matches!(mech, SaslMechanism::Scram(_)) {
        tokens.insert(0, &first);
    }
    for t in tokens {
        match ex.step(t, store(), Some(validator())) {
            Ok(Outcome::Continue(_)) => {}
            Ok(Outcome::Done { user, .. }) => {
                // Only alice's password gets in (PLAIN with the right
                // password is a token the fuzzer may find; SCRAM needs the
                // proof, which it cannot).
                assert_eq!(user, "alice");
                assert!(mech == SaslMechanism::Plain, "a SCRAM proof or a JWT forged by the fuzzer");
                return;
            }
            Err(_) => return,
        }
    }
});
