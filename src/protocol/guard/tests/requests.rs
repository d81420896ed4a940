//! Real requests of every guarded API, built with kafka-protocol: each
//! field populated at a version (and an unknown tagged field where the
//! version is flexible), for the differential tests beside.

use bytes::Bytes;
use kafka_protocol::messages as km;
use kafka_protocol::messages::{BrokerId, GroupId, ProducerId, TopicName, TransactionalId};
use kafka_protocol::protocol::{Decodable, StrBytes};
use std::collections::BTreeMap;

pub(super) fn st(s: &'static str) -> StrBytes {
    StrBytes::from_static_str(s)
}
pub(super) fn topic(i: usize) -> TopicName {
    TopicName(st(["app.codestore.commits", "tōpic-ünicode"][i]))
}
pub(super) fn group() -> GroupId {
    GroupId(st("group-1"))
}
pub(super) fn two<T>(make: impl Fn(usize) -> T) -> Vec<T> {
    (0..2).map(make).collect()
}
/// An unknown tagged field, which flexible versions must skip.
pub(super) fn extra() -> BTreeMap<i32, Bytes> {
    BTreeMap::from([(99, Bytes::from_static(b"xyz"))])
}
/// A non-nil UUID without depending on the `uuid` crate: decode one.
macro_rules! uuid {
    () => {{
        let wire = [[7u8; 16].as_slice(), &[1, 0]].concat();
        km::metadata_request::MetadataRequestTopic::decode(&mut wire.as_slice(), 10)
            .unwrap()
            .topic_id
    }};
}

pub(super) fn api_versions(_v: i16) -> km::ApiVersionsRequest {
    km::ApiVersionsRequest::default()
        .with_client_software_name(st("canopy-test"))
        .with_client_software_version(st("1.0"))
}

pub(super) fn metadata(v: i16) -> km::MetadataRequest {
    use km::metadata_request::*;
    let mut r = MetadataRequest::default().with_topics(Some(two(|i| {
        let mut t = MetadataRequestTopic::default().with_name(Some(topic(i)));
        t.topic_id = uuid!();
        t.unknown_tagged_fields = extra();
        t
    })));
    if v >= 4 {
        r.allow_auto_topic_creation = false;
    }
    if (8..=10).contains(&v) {
        r.include_cluster_authorized_operations = true;
    }
    if v >= 8 {
        r.include_topic_authorized_operations = true;
    }
    r
}

pub(super) fn produce(_v: i16) -> km::ProduceRequest {
    use km::produce_request::*;
    ProduceRequest::default()
        .with_transactional_id(Some(TransactionalId(st("tx-1"))))
        .with_acks(-1)
        .with_timeout_ms(1000)
        .with_topic_data(two(|i| {
            let mut t = TopicProduceData::default()
                .with_name(topic(i))
                .with_topic_id(uuid!())
                .with_partition_data(two(|p| {
                    PartitionProduceData::default()
                        .with_index(p as i32)
                        .with_records(Some(Bytes::from_static(b"opaque record batch")))
                }));
            t.unknown_tagged_fields = extra();
            t
        }))
}

pub(super) fn fetch(v: i16) -> km::FetchRequest {
    use km::fetch_request::*;
    let mut r = FetchRequest::default()
        .with_max_wait_ms(500)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_isolation_level(1)
        .with_session_id(3)
        .with_session_epoch(4)
        .with_rack_id(st("rack-a"))
        .with_topics(two(|i| {
            FetchTopic::default()
                .with_topic(topic(i))
                .with_topic_id(uuid!())
                .with_partitions(two(|p| {
                    let mut x = FetchPartition::default()
                        .with_partition(p as i32)
                        .with_current_leader_epoch(2)
                        .with_fetch_offset(100)
                        .with_log_start_offset(0)
                        .with_partition_max_bytes(1024);
                    if v >= 12 {
                        x.last_fetched_epoch = 1;
                        x.unknown_tagged_fields = extra();
                    }
                    if v >= 17 {
                        x.replica_directory_id = uuid!();
                    }
                    if v >= 18 {
                        x.high_watermark = 42;
                    }
                    x
                }))
        }));
    if v <= 14 {
        r.replica_id = BrokerId(5);
    }
    if v >= 7 {
        r.forgotten_topics_data = two(|i| {
            ForgottenTopic::default()
                .with_topic(topic(i))
                .with_topic_id(uuid!())
                .with_partitions(vec![1, 2])
        });
    }
    if v >= 12 {
        r.cluster_id = Some(st("cluster-1"));
    }
    if v >= 15 {
        r.replica_state = ReplicaState::default()
            .with_replica_id(BrokerId(3))
            .with_replica_epoch(9);
    }
    r
}

pub(super) fn list_offsets(v: i16) -> km::ListOffsetsRequest {
    use km::list_offsets_request::*;
    let mut r = ListOffsetsRequest::default()
        .with_timeout_ms(5000)
        .with_topics(two(|i| {
            ListOffsetsTopic::default()
                .with_name(topic(i))
                .with_partitions(two(|p| {
                    ListOffsetsPartition::default()
                        .with_partition_index(p as i32)
                        .with_current_leader_epoch(1)
                        .with_timestamp(-1)
                }))
        }));
    if v >= 2 {
        r.isolation_level = 1;
    }
    r
}

pub(super) fn offset_for_leader_epoch(_v: i16) -> km::OffsetForLeaderEpochRequest {
    use km::offset_for_leader_epoch_request::*;
    OffsetForLeaderEpochRequest::default()
        .with_replica_id(BrokerId(-2))
        .with_topics(two(|i| {
            OffsetForLeaderTopic::default()
                .with_topic(topic(i))
                .with_partitions(two(|p| {
                    OffsetForLeaderPartition::default()
                        .with_partition(p as i32)
                        .with_current_leader_epoch(3)
                        .with_leader_epoch(2)
                }))
        }))
}

pub(super) fn create_topics(_v: i16) -> km::CreateTopicsRequest {
    use km::create_topics_request::*;
    CreateTopicsRequest::default()
        .with_timeout_ms(30_000)
        .with_validate_only(true)
        .with_topics(two(|i| {
            CreatableTopic::default()
                .with_name(topic(i))
                .with_num_partitions(-1)
                .with_replication_factor(-1)
                .with_assignments(two(|p| {
                    CreatableReplicaAssignment::default()
                        .with_partition_index(p as i32)
                        .with_broker_ids(vec![BrokerId(1), BrokerId(2)])
                }))
                .with_configs(two(|c| {
                    CreatableTopicConfig::default()
                        .with_name(st("cleanup.policy"))
                        .with_value([Some(st("compact")), None][c].clone())
                }))
        }))
}

pub(super) fn delete_topics(v: i16) -> km::DeleteTopicsRequest {
    use km::delete_topics_request::*;
    let mut r = DeleteTopicsRequest::default().with_timeout_ms(30_000);
    if v >= 6 {
        r.topics = two(|i| {
            DeleteTopicState::default()
                .with_name(Some(topic(i)))
                .with_topic_id(uuid!())
        });
    } else {
        r.topic_names = two(topic);
    }
    r
}

pub(super) fn create_partitions(_v: i16) -> km::CreatePartitionsRequest {
    use km::create_partitions_request::*;
    CreatePartitionsRequest::default()
        .with_timeout_ms(1000)
        .with_validate_only(true)
        .with_topics(two(|i| {
            CreatePartitionsTopic::default()
                .with_name(topic(i))
                .with_count(4)
                .with_assignments(Some(two(|_| {
                    CreatePartitionsAssignment::default()
                        .with_broker_ids(vec![BrokerId(1), BrokerId(2)])
                })))
        }))
}

pub(super) fn describe_configs(v: i16) -> km::DescribeConfigsRequest {
    use km::describe_configs_request::*;
    let mut r = DescribeConfigsRequest::default()
        .with_include_synonyms(true)
        .with_resources(two(|i| {
            DescribeConfigsResource::default()
                .with_resource_type(2)
                .with_resource_name(topic(i).0)
                .with_configuration_keys([Some(vec![st("a"), st("b")]), None][i].clone())
        }));
    if v >= 3 {
        r.include_documentation = true;
    }
    r
}

pub(super) fn alter_configs(_v: i16) -> km::AlterConfigsRequest {
    use km::alter_configs_request::*;
    AlterConfigsRequest::default()
        .with_validate_only(true)
        .with_resources(two(|i| {
            AlterConfigsResource::default()
                .with_resource_type(2)
                .with_resource_name(topic(i).0)
                .with_configs(two(|c| {
                    AlterableConfig::default()
                        .with_name(st("retention.ms"))
                        .with_value([Some(st("1000")), None][c].clone())
                }))
        }))
}

pub(super) fn incremental_alter_configs(_v: i16) -> km::IncrementalAlterConfigsRequest {
    use km::incremental_alter_configs_request::*;
    IncrementalAlterConfigsRequest::default()
        .with_validate_only(true)
        .with_resources(two(|i| {
            AlterConfigsResource::default()
                .with_resource_type(2)
                .with_resource_name(topic(i).0)
                .with_configs(two(|c| {
                    AlterableConfig::default()
                        .with_name(st("retention.ms"))
                        .with_config_operation(c as i8)
                        .with_value([Some(st("1000")), None][c].clone())
                }))
        }))
}

pub(super) fn describe_cluster(v: i16) -> km::DescribeClusterRequest {
    let mut r =
        km::DescribeClusterRequest::default().with_include_cluster_authorized_operations(true);
    if v >= 1 {
        r.endpoint_type = 2;
    }
    if v >= 2 {
        r.include_fenced_brokers = true;
    }
    r
}

pub(super) fn alter_partition_reassignments(v: i16) -> km::AlterPartitionReassignmentsRequest {
    use km::alter_partition_reassignments_request::{ReassignablePartition, ReassignableTopic};
    let mut r = km::AlterPartitionReassignmentsRequest::default().with_timeout_ms(30_000).with_topics(vec![
        ReassignableTopic::default().with_name(TopicName(st("a.b"))).with_partitions(vec![
            ReassignablePartition::default().with_partition_index(0).with_replicas(Some(vec![BrokerId(3), BrokerId(1)])),
            ReassignablePartition::default().with_partition_index(2).with_replicas(None),
        ]),
        ReassignableTopic::default().with_name(TopicName(st("c"))).with_partitions(vec![ReassignablePartition::default().with_partition_index(1).with_replicas(Some(vec![BrokerId(2)]))]),
    ]);
    if v >= 1 {
        r.allow_replication_factor_change = false;
    }
    r
}

pub(super) fn list_partition_reassignments(_v: i16) -> km::ListPartitionReassignmentsRequest {
    use km::list_partition_reassignments_request::ListPartitionReassignmentsTopics;
    km::ListPartitionReassignmentsRequest::default().with_timeout_ms(30_000).with_topics(Some(vec![
        ListPartitionReassignmentsTopics::default().with_name(TopicName(st("a.b"))).with_partition_indexes(vec![0, 1]),
        ListPartitionReassignmentsTopics::default().with_name(TopicName(st("c"))).with_partition_indexes(vec![]),
    ]))
}

pub(super) fn write_txn_markers(_v: i16) -> km::WriteTxnMarkersRequest {
    use km::write_txn_markers_request::{WritableTxnMarker, WritableTxnMarkerTopic};
    km::WriteTxnMarkersRequest::default().with_markers(vec![
        WritableTxnMarker::default().with_producer_id(ProducerId(7)).with_producer_epoch(2).with_transaction_result(true).with_coordinator_epoch(4).with_topics(vec![
            WritableTxnMarkerTopic::default().with_name(TopicName(st("a.b"))).with_partition_indexes(vec![0, 2]),
            WritableTxnMarkerTopic::default().with_name(TopicName(st("c"))).with_partition_indexes(vec![1]),
        ]),
        WritableTxnMarker::default().with_producer_id(ProducerId(9)).with_producer_epoch(0).with_transaction_result(false).with_coordinator_epoch(0).with_topics(vec![]),
    ])
}

pub(super) fn elect_leaders(v: i16) -> km::ElectLeadersRequest {
    use km::elect_leaders_request::TopicPartitions;
    let mut r = km::ElectLeadersRequest::default().with_timeout_ms(30_000).with_topic_partitions(Some(vec![
        TopicPartitions::default().with_topic(TopicName(st("a.b"))).with_partitions(vec![0, 2]),
        TopicPartitions::default().with_topic(TopicName(st("c"))).with_partitions(vec![1]),
    ]));
    if v >= 1 {
        r.election_type = 1;
    }
    r
}

pub(super) fn find_coordinator(v: i16) -> km::FindCoordinatorRequest {
    let mut r = km::FindCoordinatorRequest::default();
    if v <= 3 {
        r.key = st("group-1");
    }
    if v >= 1 {
        r.key_type = 1;
    }
    if v >= 4 {
        r.coordinator_keys = vec![st("tx-1"), st("tx-2")];
    }
    r
}

pub(super) fn join_group(v: i16) -> km::JoinGroupRequest {
    use km::join_group_request::*;
    let mut r = JoinGroupRequest::default()
        .with_group_id(group())
        .with_session_timeout_ms(10_000)
        .with_rebalance_timeout_ms(30_000)
        .with_member_id(st("member-1"))
        .with_protocol_type(st("consumer"))
        .with_reason(Some(st("rejoin")))
        .with_protocols(two(|i| {
            JoinGroupRequestProtocol::default()
                .with_name(st(["range", "cooperative-sticky"][i]))
                .with_metadata(Bytes::from_static(b"\x00\x03subscription"))
        }));
    if v >= 5 {
        r.group_instance_id = Some(st("instance-1"));
    }
    r
}

pub(super) fn sync_group(v: i16) -> km::SyncGroupRequest {
    use km::sync_group_request::*;
    let mut r = SyncGroupRequest::default()
        .with_group_id(group())
        .with_generation_id(7)
        .with_member_id(st("member-1"))
        .with_protocol_type(Some(st("consumer")))
        .with_protocol_name(Some(st("range")))
        .with_assignments(two(|i| {
            SyncGroupRequestAssignment::default()
                .with_member_id(st(["member-1", "member-2"][i]))
                .with_assignment(Bytes::from_static(b"\x00\x03assignment"))
        }));
    if v >= 3 {
        r.group_instance_id = Some(st("instance-1"));
    }
    r
}

pub(super) fn heartbeat(v: i16) -> km::HeartbeatRequest {
    let mut r = km::HeartbeatRequest::default()
        .with_group_id(group())
        .with_generation_id(7)
        .with_member_id(st("member-1"));
    if v >= 3 {
        r.group_instance_id = Some(st("instance-1"));
    }
    r
}

pub(super) fn leave_group(v: i16) -> km::LeaveGroupRequest {
    use km::leave_group_request::*;
    let mut r = LeaveGroupRequest::default().with_group_id(group());
    if v <= 2 {
        r.member_id = st("member-1");
    } else {
        r.members = two(|i| {
            MemberIdentity::default()
                .with_member_id(st(["member-1", "member-2"][i]))
                .with_group_instance_id([Some(st("instance-1")), None][i].clone())
                .with_reason(Some(st("shutdown")))
        });
    }
    r
}

pub(super) fn offset_commit(v: i16) -> km::OffsetCommitRequest {
    use km::offset_commit_request::*;
    let mut r = OffsetCommitRequest::default()
        .with_group_id(group())
        .with_generation_id_or_member_epoch(7)
        .with_member_id(st("member-1"))
        .with_retention_time_ms(60_000)
        .with_topics(two(|i| {
            OffsetCommitRequestTopic::default()
                .with_name(topic(i))
                .with_partitions(two(|p| {
                    OffsetCommitRequestPartition::default()
                        .with_partition_index(p as i32)
                        .with_committed_offset(1234)
                        .with_committed_leader_epoch(3)
                        .with_committed_metadata([Some(st("meta")), None][p].clone())
                }))
        }));
    if v >= 7 {
        r.group_instance_id = Some(st("instance-1"));
    }
    r
}

pub(super) fn offset_fetch(v: i16) -> km::OffsetFetchRequest {
    use km::offset_fetch_request::*;
    let mut r = OffsetFetchRequest::default();
    if v <= 7 {
        r.group_id = group();
        r.topics = Some(two(|i| {
            OffsetFetchRequestTopic::default()
                .with_name(topic(i))
                .with_partition_indexes(vec![0, 1])
        }));
    } else {
        r.groups = two(|g| {
            let mut x = OffsetFetchRequestGroup::default()
                .with_group_id(group())
                .with_topics(
                    [
                        Some(two(|i| {
                            OffsetFetchRequestTopics::default()
                                .with_name(topic(i))
                                .with_partition_indexes(vec![0, 1])
                        })),
                        None,
                    ][g]
                        .clone(),
                );
            if v >= 9 {
                x.member_id = Some(st("member-1"));
                x.member_epoch = 5;
            }
            x
        });
    }
    if v >= 7 {
        r.require_stable = true;
    }
    r
}

pub(super) fn list_groups(v: i16) -> km::ListGroupsRequest {
    let mut r = km::ListGroupsRequest::default();
    if v >= 4 {
        r.states_filter = vec![st("Stable"), st("Empty")];
    }
    if v >= 5 {
        r.types_filter = vec![st("classic"), st("consumer")];
    }
    r
}

pub(super) fn describe_groups(v: i16) -> km::DescribeGroupsRequest {
    let mut r =
        km::DescribeGroupsRequest::default().with_groups(vec![group(), GroupId(st("g2"))]);
    if v >= 3 {
        r.include_authorized_operations = true;
    }
    r
}

pub(super) fn delete_groups(_v: i16) -> km::DeleteGroupsRequest {
    km::DeleteGroupsRequest::default().with_groups_names(vec![group(), GroupId(st("g2"))])
}

pub(super) fn offset_delete(_v: i16) -> km::OffsetDeleteRequest {
    use km::offset_delete_request::*;
    OffsetDeleteRequest::default()
        .with_group_id(group())
        .with_topics(two(|i| {
            OffsetDeleteRequestTopic::default()
                .with_name(topic(i))
                .with_partitions(two(|p| {
                    OffsetDeleteRequestPartition::default().with_partition_index(p as i32)
                }))
        }))
}

pub(super) fn init_producer_id(v: i16) -> km::InitProducerIdRequest {
    let mut r = km::InitProducerIdRequest::default()
        .with_transactional_id(Some(TransactionalId(st("tx-1"))))
        .with_transaction_timeout_ms(60_000);
    if v >= 3 {
        r.producer_id = ProducerId(77);
        r.producer_epoch = 2;
    }
    r
}

pub(super) fn add_partitions_to_txn(v: i16) -> km::AddPartitionsToTxnRequest {
    use km::add_partitions_to_txn_request::*;
    let topics = || {
        two(|i| {
            AddPartitionsToTxnTopic::default()
                .with_name(topic(i))
                .with_partitions(vec![0, 1])
        })
    };
    let mut r = AddPartitionsToTxnRequest::default();
    if v <= 3 {
        r.v3_and_below_transactional_id = TransactionalId(st("tx-1"));
        r.v3_and_below_producer_id = ProducerId(77);
        r.v3_and_below_producer_epoch = 2;
        r.v3_and_below_topics = topics();
    } else {
        r.transactions = two(|i| {
            AddPartitionsToTxnTransaction::default()
                .with_transactional_id(TransactionalId(st(["tx-1", "tx-2"][i])))
                .with_producer_id(ProducerId(77))
                .with_producer_epoch(2)
                .with_verify_only(true)
                .with_topics(topics())
        });
    }
    r
}

pub(super) fn add_offsets_to_txn(_v: i16) -> km::AddOffsetsToTxnRequest {
    km::AddOffsetsToTxnRequest::default()
        .with_transactional_id(TransactionalId(st("tx-1")))
        .with_producer_id(ProducerId(77))
        .with_producer_epoch(2)
        .with_group_id(group())
}

pub(super) fn end_txn(_v: i16) -> km::EndTxnRequest {
    km::EndTxnRequest::default()
        .with_transactional_id(TransactionalId(st("tx-1")))
        .with_producer_id(ProducerId(77))
        .with_producer_epoch(2)
        .with_committed(true)
}

pub(super) fn txn_offset_commit(v: i16) -> km::TxnOffsetCommitRequest {
    use km::txn_offset_commit_request::*;
    let mut r = TxnOffsetCommitRequest::default()
        .with_transactional_id(TransactionalId(st("tx-1")))
        .with_group_id(group())
        .with_producer_id(ProducerId(77))
        .with_producer_epoch(2)
        .with_topics(two(|i| {
            TxnOffsetCommitRequestTopic::default()
                .with_name(topic(i))
                .with_partitions(two(|p| {
                    TxnOffsetCommitRequestPartition::default()
                        .with_partition_index(p as i32)
                        .with_committed_offset(99)
                        .with_committed_leader_epoch(4)
                        .with_committed_metadata([Some(st("meta")), None][p].clone())
                }))
        }));
    if v >= 3 {
        r.generation_id = 7;
        r.member_id = st("member-1");
        r.group_instance_id = Some(st("instance-1"));
    }
    r
}

pub(super) fn describe_transactions(_v: i16) -> km::DescribeTransactionsRequest {
    km::DescribeTransactionsRequest::default()
        .with_transactional_ids(vec![TransactionalId(st("tx-1")), TransactionalId(st("tx-2"))])
}

pub(super) fn list_transactions(v: i16) -> km::ListTransactionsRequest {
    let mut r = km::ListTransactionsRequest::default()
        .with_state_filters(vec![st("Ongoing"), st("Empty")])
        .with_producer_id_filters(vec![ProducerId(5), ProducerId(6)]);
    if v >= 1 {
        r.duration_filter = 1000;
    }
    if v >= 2 {
        r.transactional_id_pattern = Some(st("tx-.*"));
    }
    r
}

pub(super) fn delete_records(_v: i16) -> km::DeleteRecordsRequest {
    use km::delete_records_request::*;
    DeleteRecordsRequest::default()
        .with_timeout_ms(1000)
        .with_topics(two(|i| {
            DeleteRecordsTopic::default()
                .with_name(topic(i))
                .with_partitions(two(|p| {
                    DeleteRecordsPartition::default()
                        .with_partition_index(p as i32)
                        .with_offset(10)
                }))
        }))
}

pub(super) fn sasl_handshake(_v: i16) -> km::SaslHandshakeRequest {
    km::SaslHandshakeRequest::default().with_mechanism(st("PLAIN"))
}

pub(super) fn sasl_authenticate(_v: i16) -> km::SaslAuthenticateRequest {
    km::SaslAuthenticateRequest::default()
        .with_auth_bytes(Bytes::from_static(b"\x00user\x00password"))
}

pub(super) fn describe_user_scram_credentials(_v: i16) -> km::DescribeUserScramCredentialsRequest {
    use km::describe_user_scram_credentials_request::UserName;
    km::DescribeUserScramCredentialsRequest::default().with_users(Some(vec![UserName::default().with_name(st("alice")), UserName::default().with_name(st("bob"))]))
}

pub(super) fn alter_user_scram_credentials(_v: i16) -> km::AlterUserScramCredentialsRequest {
    use km::alter_user_scram_credentials_request::{ScramCredentialDeletion, ScramCredentialUpsertion};
    km::AlterUserScramCredentialsRequest::default()
        .with_deletions(vec![ScramCredentialDeletion::default().with_name(st("bob")).with_mechanism(1)])
        .with_upsertions(vec![ScramCredentialUpsertion::default()
            .with_name(st("alice"))
            .with_mechanism(2)
            .with_iterations(8192)
            .with_salt(Bytes::from_static(b"salt"))
            .with_salted_password(Bytes::from(vec![7u8; 64]))])
}

pub(super) fn describe_acls(_v: i16) -> km::DescribeAclsRequest {
    km::DescribeAclsRequest::default().with_resource_type_filter(2).with_resource_name_filter(Some(st("app."))).with_pattern_type_filter(4).with_principal_filter(Some(st("User:alice"))).with_operation(1).with_permission_type(1)
}

pub(super) fn create_acls(_v: i16) -> km::CreateAclsRequest {
    use km::create_acls_request::AclCreation;
    km::CreateAclsRequest::default().with_creations(vec![AclCreation::default()
        .with_resource_type(2)
        .with_resource_name(st("app.codestore."))
        .with_resource_pattern_type(4)
        .with_principal(st("User:alice"))
        .with_host(st("*"))
        .with_operation(4)
        .with_permission_type(3)])
}

pub(super) fn delete_acls(_v: i16) -> km::DeleteAclsRequest {
    use km::delete_acls_request::DeleteAclsFilter;
    km::DeleteAclsRequest::default().with_filters(vec![DeleteAclsFilter::default().with_resource_type_filter(1).with_pattern_type_filter(1).with_operation(1).with_permission_type(1)])
}

pub(super) fn describe_client_quotas(_v: i16) -> km::DescribeClientQuotasRequest {
    use km::describe_client_quotas_request::ComponentData;
    km::DescribeClientQuotasRequest::default()
        .with_components(vec![ComponentData::default().with_entity_type(st("user")).with_match_type(0).with_match(Some(st("alice"))), ComponentData::default().with_entity_type(st("client-id")).with_match_type(1).with_match(None)])
        .with_strict(true)
}

pub(super) fn alter_client_quotas(_v: i16) -> km::AlterClientQuotasRequest {
    use km::alter_client_quotas_request::{EntityData, EntryData, OpData};
    km::AlterClientQuotasRequest::default().with_entries(vec![EntryData::default()
        .with_entity(vec![EntityData::default().with_entity_type(st("user")).with_entity_name(Some(st("alice"))), EntityData::default().with_entity_type(st("client-id")).with_entity_name(None)])
        .with_ops(vec![OpData::default().with_key(st("producer_byte_rate")).with_value(1024.0), OpData::default().with_key(st("request_percentage")).with_remove(true)])])
}


pub(super) fn describe_producers(_v: i16) -> km::DescribeProducersRequest {
    use km::describe_producers_request::TopicRequest;
    km::DescribeProducersRequest::default().with_topics(vec![TopicRequest::default().with_name(km::TopicName(st("app.codestore.commits"))).with_partition_indexes(vec![0, 1, 2])])
}

pub(super) fn describe_topic_partitions(_v: i16) -> km::DescribeTopicPartitionsRequest {
    use km::describe_topic_partitions_request::{Cursor, TopicRequest};
    km::DescribeTopicPartitionsRequest::default()
        .with_topics(vec![TopicRequest::default().with_name(km::TopicName(st("app.codestore.commits"))), TopicRequest::default().with_name(km::TopicName(st("app.x")))])
        .with_response_partition_limit(100)
        .with_cursor(Some(Cursor::default().with_topic_name(km::TopicName(st("app.x"))).with_partition_index(3)))
}

pub(super) fn describe_log_dirs(_v: i16) -> km::DescribeLogDirsRequest {
    use km::describe_log_dirs_request::DescribableLogDirTopic;
    km::DescribeLogDirsRequest::default().with_topics(Some(vec![DescribableLogDirTopic::default().with_topic(km::TopicName(st("app.codestore.commits"))).with_partitions(vec![0, 1])]))
}

pub(super) fn consumer_group_heartbeat(v: i16) -> km::ConsumerGroupHeartbeatRequest {
    use km::consumer_group_heartbeat_request::TopicPartitions;
    km::ConsumerGroupHeartbeatRequest::default()
        .with_group_id(km::GroupId(st("g")))
        .with_member_id(st("m-1"))
        .with_member_epoch(3)
        .with_instance_id(Some(st("i-1")))
        .with_rack_id(Some(st("r1")))
        .with_rebalance_timeout_ms(30_000)
        .with_subscribed_topic_names(Some(vec![km::TopicName(st("app.codestore.commits")), km::TopicName(st("app.x"))]))
        .with_subscribed_topic_regex(if v >= 1 { Some(st("^app\\..*")) } else { None })
        .with_server_assignor(Some(st("uniform")))
        .with_topic_partitions(Some(vec![TopicPartitions::default().with_topic_id(uuid!()).with_partitions(vec![0, 1, 2])]))
}

pub(super) fn consumer_group_describe(_v: i16) -> km::ConsumerGroupDescribeRequest {
    km::ConsumerGroupDescribeRequest::default().with_group_ids(vec![km::GroupId(st("g")), km::GroupId(st("h"))]).with_include_authorized_operations(true)
}
