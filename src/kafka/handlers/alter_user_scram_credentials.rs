//! AlterUserScramCredentials: upserts (the client sends the salt and the
//! salted password, never the password) and deletions, answered once per
//! user. A user's changes apply together or not at all: one bad change
//! (an unknown mechanism, iterations out of bounds, the same user and
//! mechanism twice, deleting what does not exist) answers the user with
//! its error and leaves the user's credentials as they were. Durable
//! before the answer; a rotated password stops working for new
//! authentications at once (open sessions last until they re-authenticate).

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;

use kafka_protocol::messages::alter_user_scram_credentials_response::AlterUserScramCredentialsResult;
pub use kafka_protocol::messages::{AlterUserScramCredentialsRequest as Request, AlterUserScramCredentialsResponse as Response};
use kafka_protocol::protocol::VersionRange;
use kafka_protocol::ResponseError as E;

use super::{str_bytes, IntoReply, Route};
use crate::protocol::guard;
use crate::protocol::header::RequestHeader;
use crate::auth::acl::Operation;
use crate::auth::scram::{self, Credential, Mechanism};
use crate::kafka::authz::Check;
use crate::auth::users::{AlterError, Alteration};
use crate::kafka::Broker;

pub const VERSIONS: VersionRange = VersionRange { min: 0, max: 0 };

/// librdkafka (2.12, what confluent-kafka ships) ends this request with its
/// empty tag buffer twice: the request writer adds one, and so does the
/// flexible-version framing. Kafka ignores bytes after a body; the guard
/// refuses them, so exactly this quirk is read in place: a body that does
/// not pass whole, but passes without one trailing zero byte.
pub fn special(broker: &Arc<Broker>, h: &RequestHeader, body: &Bytes) -> Option<Route> {
    let limits = super::guard_limits(broker);
    let (&last, trimmed) = body.split_last()?;
    if last != 0 || h.api_version != 0 || body.len() > super::INLINE_DECODE_BYTES {
        return None;
    }
    if guard::check_request_body(h.api_key as i16, h.api_version, body, &limits).is_ok() {
        return None;
    }
    let req: Request = super::decode(&limits, h, body.slice(..trimmed.len())).ok()?;
    let (broker, id, version) = (broker.clone(), h.correlation_id, h.api_version);
    Some(Route::Run(Box::pin(async move { handle(&broker, req, version).await.into_reply(id, version, crate::kafka::conn::throttle::response_ms()) })))
}

/// A user's answer: no error, or (code, message).
type Verdict = Option<(i16, String)>;

fn check(user: &str, mechanism: i8, seen: &mut std::collections::HashSet<(String, i8)>) -> Result<Mechanism, (i16, String)> {
    if user.is_empty() {
        return Err((E::UnacceptableCredential.code(), "Username must not be empty".into()));
    }
    if !seen.insert((user.to_owned(), mechanism)) {
        return Err((E::DuplicateResource.code(), "A user credential cannot be altered twice in the same request".into()));
    }
    Mechanism::from_kafka_type(mechanism).ok_or((E::UnsupportedSaslMechanism.code(), "Unknown SCRAM mechanism".into()))
}

pub async fn handle(broker: &Broker, req: Request, _version: i16) -> Option<Response> {
    let mut order: Vec<String> = Vec::new();
    let mut changes: BTreeMap<String, (Vec<Alteration>, Verdict)> = BTreeMap::new();
    let mut seen = std::collections::HashSet::new();
    let mut note = |user: &str, change: Result<Alteration, (i16, String)>| {
        let entry = changes.entry(user.to_owned()).or_insert_with(|| {
            order.push(user.to_owned());
            (Vec::new(), None)
        });
        match change {
            Ok(a) => entry.0.push(a),
            Err(e) => {
                entry.1.get_or_insert(e);
            }
        }
    };
    let allowed = Check::current(broker).administers(Operation::Alter);
    for d in &req.deletions {
        let user = d.name.as_str();
        note(user, check(user, d.mechanism, &mut seen).map(|mechanism| Alteration::Delete { user: user.to_owned(), mechanism }));
    }
    for u in &req.upsertions {
        let user = u.name.as_str();
        let change = check(user, u.mechanism, &mut seen).and_then(|mechanism| {
            let iterations = u32::try_from(u.iterations).unwrap_or(0);
            if !(scram::MIN_ITERATIONS..=scram::MAX_ITERATIONS).contains(&iterations) {
                return Err((E::UnacceptableCredential.code(), format!("Iterations {} must be between {} and {} for {mechanism}", u.iterations, scram::MIN_ITERATIONS, scram::MAX_ITERATIONS)));
            }
            if u.salt.is_empty() || u.salted_password.len() != mechanism.key_len() {
                return Err((E::UnacceptableCredential.code(), format!("A {mechanism} credential needs a salt and a {}-byte salted password", mechanism.key_len())));
            }
            Ok(Alteration::Upsert { user: user.to_owned(), mechanism, credential: Credential::from_salted(mechanism, &u.salted_password, u.salt.to_vec(), iterations) })
        });
        note(user, change);
    }
    if !allowed {
        for (_, verdict) in changes.values_mut() {
            *verdict = Some((E::ClusterAuthorizationFailed.code(), "Cluster authorization failed.".into()));
        }
    }
    // Only users whose every change is valid are applied.
    let apply: Vec<(String, Vec<Alteration>)> = changes.iter().filter(|(_, (_, v))| v.is_none()).map(|(u, (a, _))| (u.clone(), a.clone())).collect();
    if !apply.is_empty() {
        let groups: Vec<Vec<Alteration>> = apply.iter().map(|(_, a)| a.clone()).collect();
        let users = broker.users.clone();
        let engine = broker.engine.clone();
        let results = tokio::task::spawn_blocking(move || users.alter(engine.catalog(), &groups)).await.ok()?;
        for ((user, _), r) in apply.iter().zip(results) {
            let err = match r {
                Ok(()) => continue,
                Err(AlterError::NotFound) => (E::ResourceNotFound.code(), "Attempt to delete a user credential that does not exist".to_owned()),
                Err(AlterError::Unacceptable(m)) => (E::UnacceptableCredential.code(), m),
                Err(e @ AlterError::Unavailable(_)) => (E::RequestTimedOut.code(), e.to_string()),
            };
            changes.get_mut(user).expect("noted above").1 = Some(err);
        }
    }
    let results = order
        .iter()
        .map(|user| {
            let r = AlterUserScramCredentialsResult::default().with_user(str_bytes(user.clone()));
            match &changes[user].1 {
                None => r,
                Some((code, message)) => r.with_error_code(*code).with_error_message(Some(str_bytes(message.clone()))),
            }
        })
        .collect();
    Some(Response::default().with_results(results))
}
