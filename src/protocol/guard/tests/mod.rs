//! The guard against kafka-protocol's own encoder and decoder.

use super::*;
use bytes::BytesMut;
use kafka_protocol::messages as km;
use kafka_protocol::protocol::{Decodable, Encodable, Message, Request, VersionRange};
use proptest::prelude::*;

mod requests;
use requests::*;

// ---- one case per API ---------------------------------------------------

struct Case {
    key: i16,
    name: &'static str,
    /// The versions the guard covers (those the handler declares).
    versions: VersionRange,
    /// The crate's own range for the request.
    codec: VersionRange,
    /// The populated request (plus an unknown tagged field) at a version.
    populated: fn(i16) -> Vec<u8>,
    /// `Default::default()` at a version.
    empty: fn(i16) -> Vec<u8>,
    /// kafka-protocol's decoder: bytes consumed, or its error.
    decode: fn(&[u8], i16) -> Result<usize, String>,
}

fn encode<T: Encodable>(req: &T, version: i16) -> Vec<u8> {
    let mut buf = BytesMut::new();
    req.encode(&mut buf, version)
        .unwrap_or_else(|e| panic!("encode v{version}: {e}"));
    buf.to_vec()
}

macro_rules! case {
    (@make $ty:ident, $build:expr) => {
        Case {
            key: <km::$ty as Request>::KEY,
            name: stringify!($ty),
            versions: <km::$ty as Message>::VERSIONS,
            codec: <km::$ty as Message>::VERSIONS,
            populated: |v| encode(&($build)(v), v),
            empty: |v| encode(&km::$ty::default(), v),
            decode: |body, v| {
                let mut rest = body;
                <km::$ty as Decodable>::decode(&mut rest, v)
                    .map(|_| body.len() - rest.len())
                    .map_err(|e| e.to_string())
            },
        }
    };
    ($ty:ident, $build:ident) => {
        case!(@make $ty, |v| {
            let mut req = $build(v);
            req.unknown_tagged_fields = extra();
            req
        })
    };
    // APIs without flexible versions have no tagged fields.
    ($ty:ident, $build:ident, never_flexible) => {
        case!(@make $ty, $build)
    };
}

/// One case per guarded API, over the versions the guard covers. Cases for
/// requests no handler serves yet stay ready for the day one does.
fn cases() -> Vec<Case> {
    let mut cases = every_case();
    cases.retain_mut(|case| match supported_versions(case.key) {
        Some((min, max)) => {
            case.versions = VersionRange { min, max };
            true
        }
        None => false,
    });
    cases
}

fn every_case() -> Vec<Case> {
    vec![
        case!(ApiVersionsRequest, api_versions),
        case!(MetadataRequest, metadata),
        case!(ProduceRequest, produce),
        case!(FetchRequest, fetch),
        case!(ListOffsetsRequest, list_offsets),
        case!(OffsetForLeaderEpochRequest, offset_for_leader_epoch),
        case!(CreateTopicsRequest, create_topics),
        case!(DeleteTopicsRequest, delete_topics),
        case!(CreatePartitionsRequest, create_partitions),
        case!(DescribeConfigsRequest, describe_configs),
        case!(AlterConfigsRequest, alter_configs),
        case!(IncrementalAlterConfigsRequest, incremental_alter_configs),
        case!(DescribeClusterRequest, describe_cluster),
        case!(ElectLeadersRequest, elect_leaders),
        case!(AlterPartitionReassignmentsRequest, alter_partition_reassignments),
        case!(ListPartitionReassignmentsRequest, list_partition_reassignments),
        case!(WriteTxnMarkersRequest, write_txn_markers),
        case!(FindCoordinatorRequest, find_coordinator),
        case!(JoinGroupRequest, join_group),
        case!(SyncGroupRequest, sync_group),
        case!(HeartbeatRequest, heartbeat),
        case!(LeaveGroupRequest, leave_group),
        case!(OffsetCommitRequest, offset_commit),
        case!(OffsetFetchRequest, offset_fetch),
        case!(ListGroupsRequest, list_groups),
        case!(DescribeGroupsRequest, describe_groups),
        case!(DeleteGroupsRequest, delete_groups),
        case!(OffsetDeleteRequest, offset_delete, never_flexible),
        case!(InitProducerIdRequest, init_producer_id),
        case!(AddPartitionsToTxnRequest, add_partitions_to_txn),
        case!(AddOffsetsToTxnRequest, add_offsets_to_txn),
        case!(EndTxnRequest, end_txn),
        case!(TxnOffsetCommitRequest, txn_offset_commit),
        case!(DescribeTransactionsRequest, describe_transactions),
        case!(ListTransactionsRequest, list_transactions),
        case!(DeleteRecordsRequest, delete_records),
        case!(SaslHandshakeRequest, sasl_handshake, never_flexible),
        case!(SaslAuthenticateRequest, sasl_authenticate),
        case!(DescribeUserScramCredentialsRequest, describe_user_scram_credentials),
        case!(AlterUserScramCredentialsRequest, alter_user_scram_credentials),
        case!(DescribeAclsRequest, describe_acls),
        case!(CreateAclsRequest, create_acls),
        case!(DeleteAclsRequest, delete_acls),
        case!(DescribeClientQuotasRequest, describe_client_quotas),
        case!(AlterClientQuotasRequest, alter_client_quotas),
        case!(DescribeProducersRequest, describe_producers),
        case!(DescribeTopicPartitionsRequest, describe_topic_partitions),
        case!(DescribeLogDirsRequest, describe_log_dirs),
        case!(ConsumerGroupHeartbeatRequest, consumer_group_heartbeat),
        case!(ConsumerGroupDescribeRequest, consumer_group_describe),
    ]
}

struct Sample {
    case: usize,
    version: i16,
    what: &'static str,
    body: Vec<u8>,
}

/// Every API × every version × {populated, default}.
fn samples(cases: &[Case]) -> Vec<Sample> {
    let mut out = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        for version in case.versions.min..=case.versions.max {
            out.push(Sample {
                case: i,
                version,
                what: "populated",
                body: (case.populated)(version),
            });
            out.push(Sample {
                case: i,
                version,
                what: "default",
                body: (case.empty)(version),
            });
        }
    }
    out
}

/// Built once: encoding every sample for every proptest case is slow.
fn all() -> &'static (Vec<Case>, Vec<Sample>) {
    static ALL: std::sync::OnceLock<(Vec<Case>, Vec<Sample>)> = std::sync::OnceLock::new();
    ALL.get_or_init(|| {
        let cases = cases();
        let samples = samples(&cases);
        (cases, samples)
    })
}

fn check(case: &Case, version: i16, body: &[u8]) -> Result<(), GuardError> {
    check_request_body(case.key, version, body, &GuardLimits::DEFAULT)
}

/// The guard against the crate's decoder on one body. The decoder runs only
/// where the guard proved it safe: accepted bodies, and rejections at which
/// the decoder must stop too (it would otherwise reserve what a bad count
/// says, which is what the guard exists to prevent).
fn assert_agrees(case: &Case, version: i16, body: &[u8]) {
    let guard = check(case, version, body);
    let ctx = || format!("{} v{version} {body:02x?}: guard {guard:?}", case.name);
    match guard {
        Ok(()) => assert_eq!((case.decode)(body, version), Ok(body.len()), "{}", ctx()),
        Err(GuardError::TrailingBytes { offset, .. }) => {
            assert_eq!((case.decode)(body, version), Ok(offset), "{}", ctx())
        }
        Err(
            GuardError::InvalidUtf8 { .. }
            | GuardError::UnexpectedNull { .. }
            | GuardError::Negative { .. }
            | GuardError::TagNotValid { .. },
        ) => assert!((case.decode)(body, version).is_err(), "{}", ctx()),
        Err(_) => {}
    }
}

// ---- the tables are the crate's ----------------------------------------

#[test]
fn tables_lie_within_the_crate_versions() {
    let cases = cases();
    assert_eq!(cases.len(), APIS.len(), "a guarded API without a case");
    for case in &cases {
        let api = APIS.iter().find(|api| api.key == case.key).unwrap();
        assert_eq!(format!("{}Request", api.name), case.name);
        assert!(case.codec.min <= api.min && api.max <= case.codec.max, "{}: guard {}-{}, crate {}", case.name, api.min, api.max, case.codec);
        assert_eq!(api.schema.name, case.name);
    }
    let mut keys: Vec<i16> = APIS.iter().map(|api| api.key).collect();
    keys.sort_unstable();
    keys.dedup();
    assert_eq!(keys.len(), APIS.len(), "duplicate api key");
    assert_eq!(guarded_apis().count(), APIS.len());
}

#[test]
fn schema_depth_fits_the_default_limit() {
    fn depth(schema: &Schema) -> usize {
        let inner = |ty: Ty| match ty {
            Ty::Struct(s)
            | Ty::Array {
                elem: Elem::Struct(s),
                ..
            } => depth(s),
            _ => 0,
        };
        let fields = schema.fields.iter().map(|f| inner(f.ty));
        let tagged = schema.tagged.iter().map(|t| inner(t.ty));
        1 + fields.chain(tagged).max().unwrap_or(0)
    }
    let deepest = APIS.iter().map(|api| depth(api.schema)).max().unwrap();
    assert_eq!(deepest, MAX_SCHEMA_DEPTH);
}

#[test]
fn every_version_of_every_api_is_accepted_whole() {
    let cases = cases();
    let samples = samples(&cases);
    assert!(samples.len() > 300, "{}", samples.len());
    for s in &samples {
        let case = &cases[s.case];
        let ctx = format!("{} v{} {}", case.name, s.version, s.what);
        assert_eq!(check(case, s.version, &s.body), Ok(()), "{ctx}");
        assert_eq!((case.decode)(&s.body, s.version), Ok(s.body.len()), "{ctx}");
    }
}

#[test]
fn every_strict_prefix_is_truncated() {
    let cases = cases();
    for s in samples(&cases) {
        let case = &cases[s.case];
        for cut in 0..s.body.len() {
            let got = check(case, s.version, &s.body[..cut]);
            assert!(
                matches!(got, Err(GuardError::Truncated { .. })),
                "{} v{} {} cut at {cut}: {got:?}",
                case.name,
                s.version,
                s.what
            );
        }
    }
}

#[test]
fn trailing_bytes_are_rejected() {
    let cases = cases();
    for s in samples(&cases) {
        let case = &cases[s.case];
        let mut body = s.body.clone();
        body.push(0);
        let want = GuardError::TrailingBytes {
            offset: s.body.len(),
            remaining: 1,
        };
        assert_eq!(
            check(case, s.version, &body),
            Err(want),
            "{} v{}",
            case.name,
            s.version
        );
    }
}

/// Every single-byte change of every sample, at values that hit length
/// edges: the guard and the decoder agree wherever the decoder may run.
#[test]
fn single_byte_mutations_agree_with_the_crate() {
    let cases = cases();
    for s in samples(&cases) {
        let case = &cases[s.case];
        for pos in 0..s.body.len() {
            for byte in [0x00, 0x01, 0x02, 0x7f, 0x80, 0xc3, 0xfe, 0xff] {
                let mut body = s.body.clone();
                body[pos] = byte;
                assert_agrees(case, s.version, &body);
            }
        }
    }
}

// ---- huge counts and lengths ------------------------------------------

/// The smallest encoding of `ty`: zeros, empty strings, empty arrays.
fn minimal(ty: Ty, version: i16, flexible: bool, out: &mut Vec<u8>) {
    let prefix: &[u8] = match (flexible, ty) {
        (_, Ty::Fixed(width)) => &[0; 16][..width],
        (true, Ty::Str { .. } | Ty::Bytes { .. } | Ty::Array { .. }) => &[1],
        (false, Ty::Str { .. }) => &[0, 0],
        (false, Ty::Bytes { .. } | Ty::Array { .. }) => &[0, 0, 0, 0],
        // Null: the marker alone.
        (_, Ty::NStruct(_)) => &[0xff],
        (_, Ty::Struct(schema)) => {
            for field in schema
                .fields
                .iter()
                .filter(|f| (f.min..=f.max).contains(&version))
            {
                minimal(field.ty, version, flexible, out);
            }
            if flexible {
                out.push(0);
            }
            &[]
        }
    };
    out.extend_from_slice(prefix);
}

fn huge_prefix(ty: Ty, flexible: bool) -> &'static [u8] {
    match (flexible, ty) {
        (true, _) => &[0xff, 0xff, 0xff, 0xff, 0x0f],
        (false, Ty::Str { .. }) => &[0x7f, 0xff],
        (false, _) => &[0x7f, 0xff, 0xff, 0xff],
    }
}

#[test]
fn minimal_bodies_are_accepted_and_decode() {
    let cases = cases();
    for api in APIS {
        let case = cases.iter().find(|c| c.key == api.key).unwrap();
        for version in api.min..=api.max {
            let flexible = version >= api.flexible;
            let mut body = Vec::new();
            minimal(Ty::Struct(api.schema), version, flexible, &mut body);
            let walker = Walker {
                buf: &[],
                pos: 0,
                end: 0,
                version,
                flexible,
                limits: &GuardLimits::DEFAULT,
                elements_left: 0,
            };
            assert_eq!(walker.min_size(Ty::Struct(api.schema)), body.len() as u64);
            assert_eq!(
                check(case, version, &body),
                Ok(()),
                "{} v{version}",
                api.name
            );
            assert_eq!(
                (case.decode)(&body, version),
                Ok(body.len()),
                "{} v{version}",
                api.name
            );
        }
    }
}

/// For every top-level array, string and bytes field of every API and
/// version: a body whose prefix for that field claims 0x7fffffff (or a
/// varint of 0xffffffff) is refused at that field, with the default
/// limits and with no limits at all.
#[test]
fn huge_top_level_counts_and_lengths_are_rejected() {
    let unlimited = GuardLimits {
        max_array_len: usize::MAX,
        max_string_len: usize::MAX,
        max_bytes_len: usize::MAX,
        max_tagged_fields: usize::MAX,
        max_elements: usize::MAX,
        max_depth: usize::MAX,
    };
    let mut arrays_seen = 0;
    for api in APIS {
        for version in api.min..=api.max {
            let flexible = version >= api.flexible;
            let present: Vec<&Field> = api
                .schema
                .fields
                .iter()
                .filter(|f| (f.min..=f.max).contains(&version))
                .collect();
            for (i, field) in present.iter().enumerate() {
                if matches!(field.ty, Ty::Fixed(_) | Ty::Struct(_) | Ty::NStruct(_)) {
                    continue;
                }
                let mut body = Vec::new();
                for before in &present[..i] {
                    minimal(before.ty, version, flexible, &mut body);
                }
                body.extend_from_slice(huge_prefix(field.ty, flexible));
                for after in &present[i + 1..] {
                    minimal(after.ty, version, flexible, &mut body);
                }
                if flexible {
                    body.push(0);
                }
                let is_array = matches!(field.ty, Ty::Array { .. });
                arrays_seen += usize::from(is_array);
                // With the defaults the limits trip first, except for a
                // classic string, whose largest length (0x7fff) is allowed.
                let classic_str = !flexible && matches!(field.ty, Ty::Str { .. });
                for (limits, limited) in
                    [(&GuardLimits::DEFAULT, !classic_str), (&unlimited, false)]
                {
                    let got = check_request_body(api.key, version, &body, limits);
                    let ctx = format!("{} v{version} {}: {got:?}", api.name, field.name);
                    let at = match got {
                        Err(GuardError::CountTooLarge { at, .. }) if limited && is_array => at,
                        Err(GuardError::LengthTooLarge { at, .. }) if limited && !is_array => {
                            at
                        }
                        Err(GuardError::Truncated { at, .. }) if !limited => at,
                        _ => panic!("{ctx}"),
                    };
                    assert_eq!(
                        (at.schema, at.field),
                        (api.schema.name, field.name),
                        "{ctx}"
                    );
                }
            }
        }
    }
    assert!(arrays_seen > 100, "{arrays_seen}");
}

#[test]
fn explicit_huge_counts() {
    let limits = GuardLimits::DEFAULT;
    // Metadata v0: topics = 0x7fffffff.
    let got = check_request_body(3, 0, &[0x7f, 0xff, 0xff, 0xff], &limits);
    assert!(
        matches!(
            got,
            Err(GuardError::CountTooLarge {
                count: 0x7fff_ffff,
                ..
            })
        ),
        "{got:?}"
    );
    // Metadata v12 (compact): topics = varint 0xffffffff, i.e. 0xfffffffe entries.
    let got = check_request_body(3, 12, &[0xff, 0xff, 0xff, 0xff, 0x0f, 0, 0, 0], &limits);
    assert!(
        matches!(
            got,
            Err(GuardError::CountTooLarge {
                count: 0xffff_fffe,
                ..
            })
        ),
        "{got:?}"
    );
    // Within the count limit but not within the bytes: 1000 topics in 10 bytes.
    let mut body = vec![0, 0, 0x03, 0xe8];
    body.extend_from_slice(&[0; 10]);
    let got = check_request_body(3, 0, &body, &limits);
    assert!(
        matches!(
            got,
            Err(GuardError::Truncated {
                needed: 2000,
                remaining: 10,
                ..
            })
        ),
        "{got:?}"
    );
    // Produce v3 records of 0x7fffffff bytes.
    let mut body = vec![
        0xff, 0xff, 0, 1, 0, 0, 0, 10, 0, 0, 0, 1, 0, 1, b't', 0, 0, 0, 1, 0, 0, 0, 0,
    ];
    body.extend_from_slice(&[0x7f, 0xff, 0xff, 0xff, 1, 2, 3]);
    let got = check_request_body(0, 3, &body, &limits);
    assert!(
        matches!(
            got,
            Err(GuardError::LengthTooLarge {
                len: 0x7fff_ffff,
                ..
            })
        ),
        "{got:?}"
    );
    // Tagged-field sections: a huge count, then a huge size.
    let got = check_request_body(18, 3, &[1, 1, 0xff, 0xff, 0xff, 0xff, 0x0f], &limits);
    assert!(
        matches!(got, Err(GuardError::CountTooLarge { .. })),
        "{got:?}"
    );
    let got = check_request_body(18, 3, &[1, 1, 1, 5, 0xff, 0xff, 0xff, 0xff, 0x0f], &limits);
    assert!(
        matches!(
            got,
            Err(GuardError::Truncated {
                needed: 0xffff_ffff,
                ..
            })
        ),
        "{got:?}"
    );
}

#[test]
fn malformed_lengths_are_named() {
    let limits = GuardLimits::DEFAULT;
    // A sixth varint byte, and a fifth with bits beyond u32.
    for body in [
        &[0xff, 0xff, 0xff, 0xff, 0xff, 0x01][..],
        &[0x80, 0x80, 0x80, 0x80, 0x10],
    ] {
        let got = check_request_body(3, 12, body, &limits);
        assert!(
            matches!(got, Err(GuardError::BadVarint { offset: 0, .. })),
            "{got:?}"
        );
    }
    // FindCoordinator v0's key: -2 and null.
    let got = check_request_body(10, 0, &[0xff, 0xfe], &limits);
    assert!(
        matches!(got, Err(GuardError::Negative { value: -2, .. })),
        "{got:?}"
    );
    let got = check_request_body(10, 0, &[0xff, 0xff], &limits);
    assert!(
        matches!(got, Err(GuardError::UnexpectedNull { .. })),
        "{got:?}"
    );
    let got = check_request_body(10, 0, &[0, 2, 0xc3, 0x28], &limits);
    assert!(
        matches!(got, Err(GuardError::InvalidUtf8 { offset: 2, .. })),
        "{got:?}"
    );
}

#[test]
fn known_tagged_fields_are_checked() {
    let limits = GuardLimits::DEFAULT;
    // Fetch v12 body: 25 bytes of fixed fields, empty topics, forgotten and
    // rack, then the tagged fields.
    let head = [0u8; 4 * 4 + 1 + 4 * 2]
        .iter()
        .copied()
        .chain([1, 1, 1])
        .collect::<Vec<u8>>();
    let with_tags = |tags: &[u8]| [&head[..], tags].concat();
    // cluster_id (tag 0) = "abc": accepted.
    assert_eq!(
        check_request_body(1, 12, &with_tags(&[1, 0, 4, 4, b'a', b'b', b'c']), &limits),
        Ok(())
    );
    // Declared size 5 but the string fills 4.
    let got = check_request_body(
        1,
        12,
        &with_tags(&[1, 0, 5, 4, b'a', b'b', b'c', 0]),
        &limits,
    );
    assert!(
        matches!(
            got,
            Err(GuardError::TaggedSizeMismatch {
                declared: 5,
                actual: 4,
                ..
            })
        ),
        "{got:?}"
    );
    // Declared size 2 but the string needs 4.
    let got = check_request_body(1, 12, &with_tags(&[1, 0, 2, 4, b'a', b'b', b'c']), &limits);
    assert!(matches!(got, Err(GuardError::Truncated { .. })), "{got:?}");
    // replica_state (tag 1) exists only from v15.
    let got = check_request_body(1, 12, &with_tags(&[1, 1, 1, 0]), &limits);
    assert!(
        matches!(
            got,
            Err(GuardError::TagNotValid {
                tag: 1,
                version: 12,
                ..
            })
        ),
        "{got:?}"
    );
    // An unknown tag is skipped whatever it holds.
    assert_eq!(
        check_request_body(1, 12, &with_tags(&[1, 42, 3, 0xff, 0xff, 0xff]), &limits),
        Ok(())
    );
}

#[test]
fn limits_are_enforced() {
    let cases = cases();
    let fetch = cases.iter().find(|c| c.key == 1).unwrap();
    let newest = fetch.versions.max;
    let body = (fetch.populated)(newest);
    let with = |change: fn(&mut GuardLimits)| {
        let mut limits = GuardLimits::DEFAULT;
        change(&mut limits);
        check_request_body(1, newest, &body, &limits)
    };
    assert_eq!(with(|_| {}), Ok(()));
    let got = with(|l| l.max_array_len = 1);
    assert!(
        matches!(
            got,
            Err(GuardError::CountTooLarge {
                count: 2,
                limit: 1,
                ..
            })
        ),
        "{got:?}"
    );
    let got = with(|l| l.max_elements = 5);
    assert!(
        matches!(got, Err(GuardError::CountTooLarge { limit: 1, .. })),
        "{got:?}"
    );
    let got = with(|l| l.max_string_len = 3);
    assert!(
        matches!(got, Err(GuardError::LengthTooLarge { limit: 3, .. })),
        "{got:?}"
    );
    let got = with(|l| l.max_tagged_fields = 0);
    assert!(
        matches!(got, Err(GuardError::CountTooLarge { limit: 0, .. })),
        "{got:?}"
    );
    let got = with(|l| l.max_depth = 2);
    assert!(
        matches!(
            got,
            Err(GuardError::TooDeep {
                schema: "FetchPartition",
                limit: 2
            })
        ),
        "{got:?}"
    );
    let produce = cases.iter().find(|c| c.key == 0).unwrap();
    let mut limits = GuardLimits::DEFAULT;
    limits.max_bytes_len = 4;
    let got = check_request_body(0, 9, &(produce.populated)(9), &limits);
    assert!(
        matches!(got, Err(GuardError::LengthTooLarge { limit: 4, .. })),
        "{got:?}"
    );
}

#[test]
fn unknown_apis_and_versions_are_refused() {
    let limits = GuardLimits::DEFAULT;
    assert_eq!(
        check_request_body(1000, 0, &[], &limits),
        Err(GuardError::UnsupportedApi { api_key: 1000 })
    );
    assert_eq!(
        check_request_body(0, 2, &[], &limits),
        Err(GuardError::UnsupportedVersion {
            api_key: 0,
            api_version: 2,
            min: 3,
            max: supported_versions(0).unwrap().1
        })
    );
    assert_eq!(supported_versions(1000), None);
}

// ---- fuzzing -------------------------------------------------------------

fn api_key() -> impl Strategy<Value = i16> {
    prop_oneof![
        4 => proptest::sample::select(APIS.iter().map(|api| api.key).collect::<Vec<_>>()),
        1 => any::<i16>(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_bodies_never_panic(
        key in api_key(),
        version in -1i16..20,
        body in proptest::collection::vec(any::<u8>(), 0..300),
    ) {
        let got = check_request_body(key, version, &body, &GuardLimits::DEFAULT);
        if let Some(case) = all().0.iter().find(|c| c.key == key) {
            if got.is_ok() {
                prop_assert_eq!((case.decode)(&body, version), Ok(body.len()));
            }
        }
    }

    #[test]
    fn mutated_samples_agree_with_the_crate(
        pick in any::<proptest::sample::Index>(),
        edits in proptest::collection::vec((any::<proptest::sample::Index>(), any::<u8>()), 1..6),
        cut in any::<proptest::sample::Index>(),
    ) {
        let (cases, samples) = all();
        let s = pick.get(samples);
        let mut body = s.body.clone();
        if body.is_empty() {
            return Ok(());
        }
        for (at, byte) in &edits {
            let i = at.index(body.len());
            body[i] = *byte;
        }
        assert_agrees(&cases[s.case], s.version, &body);
        // and the same with a random tail cut off
        let keep = cut.index(body.len() + 1);
        assert_agrees(&cases[s.case], s.version, &body[..keep]);
    }
}
