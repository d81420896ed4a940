//! Request routing. Each API lives in its own file and declares the version
//! range it serves as `VERSIONS`; the table below is the only list of APIs,
//! and ApiVersions is built from it (never from a hand-kept table). A test
//! checks every declared range lies within what the `kafka-protocol` crate
//! can decode and encode for that message.

pub mod add_offsets_to_txn;
pub mod add_partitions_to_txn;
pub mod alter_client_quotas;
pub mod alter_configs;
pub mod alter_user_scram_credentials;
pub mod consumer_group_describe;
pub mod consumer_group_heartbeat;
pub mod api_versions;
pub mod create_acls;
pub mod create_partitions;
pub mod create_topics;
pub mod delete_acls;
pub mod delete_groups;
pub mod delete_records;
pub mod delete_topics;
pub mod describe_groups;
pub mod describe_log_dirs;
pub mod describe_acls;
pub mod describe_client_quotas;
pub mod describe_cluster;
pub mod elect_leaders;
pub mod alter_partition_reassignments;
pub mod list_partition_reassignments;
pub mod write_txn_markers;
pub mod describe_configs;
pub mod describe_producers;
pub mod describe_topic_partitions;
pub mod describe_transactions;
pub mod describe_user_scram_credentials;
pub mod end_txn;
pub mod fetch;
pub mod replica_fetch;
pub mod find_coordinator;
pub mod heartbeat;
pub mod incremental_alter_configs;
pub mod init_producer_id;
pub mod join_group;
pub mod leave_group;
pub mod list_groups;
pub mod list_offsets;
pub mod list_transactions;
pub mod metadata;
pub mod offset_commit;
pub mod offset_delete;
pub mod offset_fetch;
pub mod offset_for_leader_epoch;
pub mod produce;
pub mod sasl_authenticate;
pub mod sasl_handshake;
pub mod sync_group;
pub mod txn_offset_commit;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, VersionRange};

use super::probe::Closed;
use super::Broker;
use crate::protocol::guard;
use crate::protocol::header::RequestHeader;

/// A framed response as parts to write in order (most responses are one
/// part; Fetch splices stored batches in without copying them). No parts:
/// nothing to send (acks=0). `None`: the request could not be answered and
/// the connection closes.
pub type Reply = Pin<Box<dyn Future<Output = Option<Vec<Bytes>>> + Send>>;

/// What a handler returns, turned into the framed response, carrying
/// `throttle_ms` where the response has a throttle time.
pub trait IntoReply {
    fn into_reply(self, correlation_id: i32, version: i16, throttle_ms: i32) -> Option<Vec<Bytes>>;
}

impl<R: Encodable + HeaderVersion + Throttled> IntoReply for Option<R> {
    fn into_reply(self, correlation_id: i32, version: i16, throttle_ms: i32) -> Option<Vec<Bytes>> {
        let mut r = self?;
        r.set_throttle(throttle_ms);
        encode(correlation_id, version, &r)
    }
}

/// A response's `throttle_time_ms`, where it has one (a version without
/// the field does not encode it).
pub trait Throttled {
    fn set_throttle(&mut self, ms: i32);
}

macro_rules! throttled {
    ($($t:ident),* ; without: $($u:ident),*) => {
        $(impl Throttled for kafka_protocol::messages::$t {
            fn set_throttle(&mut self, ms: i32) {
                self.throttle_time_ms = ms;
            }
        })*
        $(impl Throttled for kafka_protocol::messages::$u {
            fn set_throttle(&mut self, _ms: i32) {}
        })*
    };
}

throttled!(
    ProduceResponse, FetchResponse, ListOffsetsResponse, MetadataResponse, OffsetCommitResponse, OffsetFetchResponse,
    FindCoordinatorResponse, JoinGroupResponse, HeartbeatResponse, LeaveGroupResponse, SyncGroupResponse,
    DescribeGroupsResponse, ListGroupsResponse, ApiVersionsResponse, CreateTopicsResponse, DeleteTopicsResponse,
    OffsetForLeaderEpochResponse, DescribeConfigsResponse, CreatePartitionsResponse, DeleteGroupsResponse,
    DescribeClusterResponse, OffsetDeleteResponse, InitProducerIdResponse, AddPartitionsToTxnResponse,
    AddOffsetsToTxnResponse, EndTxnResponse, TxnOffsetCommitResponse, DescribeTransactionsResponse,
    ListTransactionsResponse, DescribeUserScramCredentialsResponse, AlterUserScramCredentialsResponse,
    DescribeAclsResponse, CreateAclsResponse, DeleteAclsResponse, DescribeClientQuotasResponse, AlterClientQuotasResponse,
    AlterConfigsResponse, IncrementalAlterConfigsResponse, DescribeProducersResponse,
    DescribeTopicPartitionsResponse, DeleteRecordsResponse,
    DescribeLogDirsResponse, ConsumerGroupHeartbeatResponse, ConsumerGroupDescribeResponse, ElectLeadersResponse,
    AlterPartitionReassignmentsResponse, ListPartitionReassignmentsResponse;
    without: SaslHandshakeResponse, SaslAuthenticateResponse, WriteTxnMarkersResponse
);

pub enum Route {
    /// Run this future; its output (if any) is the framed response.
    Run(Reply),
    /// Close the connection: what went wrong, and its kind.
    Close(String, Closed),
}

/// Limits the wire-shape guard applies to every request body.
pub fn guard_limits(broker: &Broker) -> guard::GuardLimits {
    guard::GuardLimits { max_bytes_len: broker.cfg.max_request_bytes, ..guard::GuardLimits::default() }
}

/// Decodes a body that passed the guard. The guard has checked every count
/// against the bytes present, so the decoder cannot be made to allocate
/// more than the frame's size. Bytes after a complete body are refused:
/// a request is exactly its frame (see `metadata::librdkafka_all_topics`
/// for the one client quirk read in its place).
fn decode<T: Decodable>(limits: &guard::GuardLimits, h: &RequestHeader, mut body: Bytes) -> Result<T, String> {
    match guard::check_request_body(h.api_key as i16, h.api_version, &body, limits) {
        Ok(()) => {}
        Err(e) => return Err(format!("malformed request body: {e}")),
    }
    T::decode(&mut body, h.api_version).map_err(|e| format!("request body does not decode: {e}"))
}

/// Bodies larger than this are checked and decoded on the CPU pool, not on
/// the async worker that read them: a request of many small entries costs
/// real CPU to walk, and the worker serves other connections too.
pub const INLINE_DECODE_BYTES: usize = 64 << 10;

/// [`decode`] on the CPU pool. A body that does not decode closes the
/// connection (`None`), as it would have inline.
async fn decode_off_the_runtime<T: Decodable + Send + 'static>(broker: &Broker, h: RequestHeader, body: Bytes) -> Option<T> {
    let limits = guard_limits(broker);
    let (api, version) = (h.api_key, h.api_version);
    match broker.engine.run_cpu(move || decode(&limits, &h, body)).await? {
        Ok(r) => Some(r),
        Err(why) => {
            tracing::warn!(api = ?api, version, reason = %why, "closing connection");
            super::conn::closing(Closed::BadBody);
            None
        }
    }
}

/// Keeps the first occurrence of each key, in request order: Kafka reads
/// these lists into sets or maps, so a repeated entry is answered once.
pub fn first_occurrences<T, K: std::hash::Hash + Eq>(items: impl IntoIterator<Item = T>, key: impl Fn(&T) -> K) -> Vec<T> {
    let mut seen = std::collections::HashSet::new();
    items.into_iter().filter(|t| seen.insert(key(t))).collect()
}

/// For each key, whether it is the last occurrence of its value. Small
/// lists (most requests name a few partitions) are compared directly.
pub fn last_occurrences<K: std::hash::Hash + Eq>(keys: &[K]) -> Vec<bool> {
    if keys.len() <= 16 {
        return (0..keys.len()).map(|i| !keys[i + 1..].contains(&keys[i])).collect();
    }
    let last: std::collections::HashMap<&K, usize> = keys.iter().enumerate().map(|(i, k)| (k, i)).collect();
    keys.iter().enumerate().map(|(i, k)| last[k] == i).collect()
}

/// The keys that occur more than once (Kafka refuses them in some APIs).
pub fn repeated<K: std::hash::Hash + Eq + Clone>(keys: impl IntoIterator<Item = K>) -> std::collections::HashSet<K> {
    let mut seen = std::collections::HashSet::new();
    keys.into_iter().filter(|k| !seen.insert(k.clone())).collect()
}

/// Frames a response: length, response header, body.
pub fn encode<R: Encodable + HeaderVersion>(correlation_id: i32, version: i16, resp: &R) -> Option<Vec<Bytes>> {
    encode_with_header_version(correlation_id, version, R::header_version(version), resp)
}

pub fn encode_with_header_version<R: Encodable>(correlation_id: i32, version: i16, header_version: i16, resp: &R) -> Option<Vec<Bytes>> {
    let size = resp.compute_size(version).ok()?;
    let mut buf = BytesMut::with_capacity(4 + 8 + size);
    buf.put_i32(0);
    let header = ResponseHeader::default().with_correlation_id(correlation_id);
    let ok = header.encode(&mut buf, header_version).and_then(|_| resp.encode(&mut buf, version));
    if let Err(e) = ok {
        tracing::error!(error = %e, version, "response does not encode; closing connection");
        return None;
    }
    let len = (buf.len() - 4) as i32;
    buf[0..4].copy_from_slice(&len.to_be_bytes());
    Some(vec![buf.freeze()])
}

macro_rules! apis {
    ($( $key:ident => $module:ident $(+ $special:ident)? ),* $(,)?) => {
        /// Every API this broker serves, with the versions it serves.
        pub fn supported() -> Vec<(ApiKey, VersionRange)> {
            vec![ $( (ApiKey::$key, $module::VERSIONS) ),* ]
        }

        /// The request and response types' own ranges, for the test that
        /// our declared ranges lie inside them.
        #[cfg(test)]
        pub fn codec_ranges() -> Vec<(ApiKey, VersionRange, VersionRange, VersionRange)> {
            use kafka_protocol::protocol::Message;
            vec![ $( (ApiKey::$key, $module::VERSIONS, <$module::Request as Message>::VERSIONS, <$module::Response as Message>::VERSIONS) ),* ]
        }

        pub fn route(broker: &Arc<Broker>, h: &RequestHeader, body: Bytes) -> Route {
            match h.api_key {
                $( ApiKey::$key => {
                    // `+ special`: the module answers some requests itself,
                    // before the declared range is enforced.
                    $(
                        let _ = stringify!($special);
                        if let Some(route) = $module::special(broker, h, &body) {
                            return route;
                        }
                    )?
                    let v = $module::VERSIONS;
                    if h.api_version < v.min || h.api_version > v.max {
                        return Route::Close(format!("unsupported version (serving {v})"), Closed::Unsupported);
                    }
                    let (id, version) = (h.correlation_id, h.api_version);
                    if body.len() <= INLINE_DECODE_BYTES {
                        let req: $module::Request = match decode(&guard_limits(broker), h, body) {
                            Ok(r) => r,
                            Err(why) => return Route::Close(why, Closed::BadBody),
                        };
                        let broker = broker.clone();
                        return Route::Run(Box::pin(async move {
                            $module::handle(&broker, req, version).await.into_reply(id, version, super::conn::throttle::response_ms())
                        }));
                    }
                    let (broker, h) = (broker.clone(), h.clone());
                    Route::Run(Box::pin(async move {
                        let req: $module::Request = decode_off_the_runtime(&broker, h, body).await?;
                        $module::handle(&broker, req, version).await.into_reply(id, version, super::conn::throttle::response_ms())
                    }))
                } )*
                other => Route::Close(format!("api {other:?} is not served"), Closed::Unsupported),
            }
        }
    };
}

apis! {
    Produce => produce + special,
    Fetch => fetch,
    ListOffsets => list_offsets,
    Metadata => metadata + special,
    OffsetCommit => offset_commit,
    OffsetFetch => offset_fetch,
    FindCoordinator => find_coordinator,
    JoinGroup => join_group,
    Heartbeat => heartbeat,
    LeaveGroup => leave_group,
    SyncGroup => sync_group,
    DescribeGroups => describe_groups,
    ListGroups => list_groups,
    ApiVersions => api_versions + special,
    CreateTopics => create_topics,
    DeleteTopics => delete_topics,
    OffsetForLeaderEpoch => offset_for_leader_epoch,
    DescribeConfigs => describe_configs,
    CreatePartitions => create_partitions,
    DeleteGroups => delete_groups,
    DescribeCluster => describe_cluster,
    ElectLeaders => elect_leaders,
    AlterPartitionReassignments => alter_partition_reassignments,
    ListPartitionReassignments => list_partition_reassignments,
    WriteTxnMarkers => write_txn_markers,
    OffsetDelete => offset_delete,
    InitProducerId => init_producer_id,
    AddPartitionsToTxn => add_partitions_to_txn,
    AddOffsetsToTxn => add_offsets_to_txn,
    EndTxn => end_txn,
    TxnOffsetCommit => txn_offset_commit,
    DescribeTransactions => describe_transactions,
    ListTransactions => list_transactions,
    SaslHandshake => sasl_handshake,
    SaslAuthenticate => sasl_authenticate,
    DescribeUserScramCredentials => describe_user_scram_credentials,
    AlterUserScramCredentials => alter_user_scram_credentials + special,
    DescribeAcls => describe_acls,
    CreateAcls => create_acls,
    DeleteAcls => delete_acls,
    DescribeClientQuotas => describe_client_quotas,
    AlterClientQuotas => alter_client_quotas,
    AlterConfigs => alter_configs,
    IncrementalAlterConfigs => incremental_alter_configs,
    DescribeProducers => describe_producers,
    DescribeTopicPartitions => describe_topic_partitions,
    DeleteRecords => delete_records,
    DescribeLogDirs => describe_log_dirs,
    ConsumerGroupHeartbeat => consumer_group_heartbeat,
    ConsumerGroupDescribe => consumer_group_describe,
}

/// Turns a topic name from the wire into a `&str`.
pub fn name(n: &kafka_protocol::messages::TopicName) -> &str {
    n.0.as_str()
}

pub fn topic_name(s: &str) -> kafka_protocol::messages::TopicName {
    kafka_protocol::messages::TopicName(kafka_protocol::protocol::StrBytes::from_string(s.to_owned()))
}

/// A request's partitions, by topic: each refused with its error code
/// (TOPIC_AUTHORIZATION_FAILED without `op` on the topic,
/// UNKNOWN_TOPIC_OR_PARTITION, or NOT_LEADER_OR_FOLLOWER: these are
/// requests for the partition's leader) or handed on as `asks[i]`. A
/// topic or a partition named twice counts once.
pub struct PartitionAsks<A> {
    pub topics: Vec<(kafka_protocol::messages::TopicName, Vec<(i32, Result<usize, i16>)>)>,
    pub asks: Vec<A>,
}

impl<A> PartitionAsks<A> {
    /// `partitions` lists a topic's partition items, `index` names one's
    /// partition, `ask` makes what is handed on from its tp and the item.
    pub fn of<T, P>(
        broker: &Broker,
        op: crate::auth::acl::Operation,
        topics: Vec<T>,
        name: impl Fn(&T) -> &kafka_protocol::messages::TopicName,
        partitions: impl Fn(T) -> Vec<P>,
        index: impl Fn(&P) -> i32,
        ask: impl Fn(crate::storage::Tp, P) -> A,
    ) -> PartitionAsks<A> {
        use kafka_protocol::ResponseError as E;
        let check = broker.authorizer.enabled().then(|| crate::kafka::authz::Check::current(broker));
        let mut out = PartitionAsks { topics: Vec::new(), asks: Vec::new() };
        let view = broker.cluster.view();
        for t in first_occurrences(topics, |t| name(t).0.clone()) {
            let topic_name = name(&t).clone();
            let denied = check.as_ref().is_some_and(|c| !c.topic(op, self::name(&topic_name)));
            let topic = broker.engine.topic(self::name(&topic_name));
            let parts = first_occurrences(partitions(t), &index)
                .into_iter()
                .map(|p| {
                    let i = index(&p);
                    let r = match &topic {
                        _ if denied => Err(E::TopicAuthorizationFailed.code()),
                        Some(topic) if i >= 0 && i < topic.partitions() && broker.lead(&view, topic.name(), i).is_err() => Err(E::NotLeaderOrFollower.code()),
                        Some(topic) if i >= 0 && i < topic.partitions() => {
                            out.asks.push(ask(topic.tp(i), p));
                            Ok(out.asks.len() - 1)
                        }
                        _ => Err(E::UnknownTopicOrPartition.code()),
                    };
                    (i, r)
                })
                .collect();
            out.topics.push((topic_name, parts));
        }
        out
    }
}

pub fn str_bytes(s: impl Into<String>) -> kafka_protocol::protocol::StrBytes {
    kafka_protocol::protocol::StrBytes::from_string(s.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The guard's tables are generated from these declarations
    /// (`src/protocol/guard/generate.py`): a handler whose range changed
    /// without regenerating them fails here.
    #[test]
    fn the_guard_covers_exactly_the_declared_versions() {
        let mut declared: Vec<(i16, i16, i16)> = supported()
            .into_iter()
            .map(|(key, v)| if key == ApiKey::Produce { (key, produce::DECODED) } else { (key, v) })
            .map(|(key, v)| (key as i16, v.min, v.max))
            .collect();
        let mut guarded: Vec<(i16, i16, i16)> = guard::guarded_apis().map(|(key, _, min, max)| (key, min, max)).collect();
        declared.sort_unstable();
        guarded.sort_unstable();
        assert_eq!(guarded, declared, "run python3 src/protocol/guard/generate.py");
    }

    #[test]
    fn declared_ranges_lie_within_the_codec() {
        for (key, ours, req, resp) in codec_ranges() {
            let r = ours.intersect(&req).intersect(&resp);
            // Produce is advertised from 0 but serves 0-2 with a hand-encoded
            // UNSUPPORTED_VERSION answer; its decoded range is checked below.
            if key == ApiKey::Produce {
                assert_eq!(produce::DECODED.intersect(&req), produce::DECODED);
                continue;
            }
            assert_eq!(r, ours, "{key:?}: ours {ours}, request codec {req}, response codec {resp}");
        }
    }
}
