//! Derives the other targets' seeds from the recorded request seeds
//! (`seeds/request`, real client traffic; see `record-corpus.sh`):
//!
//! - `seeds/batch`: the record batches of every recorded Produce;
//! - `seeds/consumer_protocol`: every JoinGroup member metadata and
//!   SyncGroup assignment the clients sent;
//! - `seeds/storage_files`: a segment file and a subtree store file built
//!   from those batches (first byte 0: segment, 1: store), and the two
//!   state files of replicas (3: leader epochs, 4: truncations);
//! - `seeds/rest_body`: one body per REST route and format (first byte:
//!   the route, as `rest_body` reads it);
//! - `seeds/peer_response`: Fetch responses carrying those batches, with
//!   a diverging epoch and a current leader, at each decoded version, a
//!   Produce, a WriteTxnMarkers and an AddPartitionsToTxn response (first
//!   byte: the decoder, as `peer_response` reads it).
//!
//!     cargo +nightly run --release --example derive_seeds   (in fuzz/)

use std::fs;
use std::path::Path;

use bytes::Bytes;
use canopy::protocol::{guard, header};
use canopy::storage::log::epochs::{self, EpochCache};
use canopy::storage::log::cuts;
use canopy::storage::segment;
use canopy::storage::Tp;
use canopy::storage::subtree::store::StoreWriter;
use kafka_protocol::messages::{ApiKey, JoinGroupRequest, ProduceRequest, SyncGroupRequest};
use kafka_protocol::protocol::Decodable;

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    fs::create_dir_all(dir).unwrap();
    fs::write(dir.join(name), bytes).unwrap();
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds");
    let mut batches: Vec<Vec<u8>> = Vec::new();
    let mut blobs: Vec<Vec<u8>> = Vec::new();
    let mut names: Vec<_> = fs::read_dir(root.join("request")).unwrap().map(|e| e.unwrap().path()).collect();
    names.sort();
    for path in names {
        let frame = fs::read(&path).unwrap();
        let Ok(h) = header::parse(&frame) else { continue };
        let body = &frame[h.len..];
        if guard::check_request_body(h.api_key as i16, h.api_version, body, &guard::GuardLimits::DEFAULT).is_err() {
            continue;
        }
        let mut b = Bytes::copy_from_slice(body);
        match h.api_key {
            ApiKey::Produce => {
                let Ok(r) = ProduceRequest::decode(&mut b, h.api_version) else { continue };
                for t in r.topic_data {
                    for p in t.partition_data {
                        batches.extend(p.records.map(|r| r.to_vec()));
                    }
                }
            }
            ApiKey::JoinGroup => {
                let Ok(r) = JoinGroupRequest::decode(&mut b, h.api_version) else { continue };
                blobs.extend(r.protocols.into_iter().map(|p| p.metadata.to_vec()));
            }
            ApiKey::SyncGroup => {
                let Ok(r) = SyncGroupRequest::decode(&mut b, h.api_version) else { continue };
                blobs.extend(r.assignments.into_iter().map(|a| a.assignment.to_vec()));
            }
            _ => {}
        }
    }
    batches.sort_by_key(Vec::len);
    batches.dedup();
    batches.truncate(64);
    blobs.sort();
    blobs.dedup();
    for (i, b) in batches.iter().enumerate() {
        write(&root.join("batch"), &format!("produce-{i}"), b);
    }
    for (i, b) in blobs.iter().enumerate() {
        write(&root.join("consumer_protocol"), &format!("client-{i}"), b);
    }

    // A segment and a store holding some of those batches.
    let dir = tempfile::tempdir().unwrap();
    let seg_path = dir.path().join("seg");
    let disk = canopy::storage::disk::RealDisk;
    let f = segment::create(&disk, &seg_path, &segment::FileHeader { base_seq: 0, created_ms: 1_700_000_000_000 }).unwrap();
    let mut frames = Vec::new();
    let mut headers = Vec::new();
    let mut offset = 0;
    for (seq, b) in batches.iter().take(8).enumerate() {
        let mut one = Vec::new();
        let fh = segment::encode_frame(&mut one, seq as u64, &[7; 16], 0, offset, segment::Patch::default(), b);
        offset = fh.last_offset() + 1;
        headers.push((fh, one.clone()));
        frames.extend(one);
    }
    f.write_all_at(&frames, segment::FILE_HEADER_BYTES).unwrap();
    let mut seed = vec![0u8];
    seed.extend(fs::read(&seg_path).unwrap());
    write(&root.join("storage_files"), "segment", &seed);
    let mut w = StoreWriter::create(&disk, &dir.path().join("store"), 1, 0, 4096).unwrap();
    for (fh, frame) in &headers {
        w.push(fh, frame).unwrap();
    }
    let (store_path, _) = w.finish().unwrap();
    let mut seed = vec![1u8];
    seed.extend(fs::read(store_path).unwrap());
    write(&root.join("storage_files"), "store", &seed);
    let (a, b) = (Tp { topic: [1; 16], partition: 0 }, Tp { topic: [2; 16], partition: 3 });
    let mut caches = vec![(a, EpochCache::default()), (b, EpochCache::default())];
    for (epoch, start) in [(0, 0), (2, 40), (5, 41)] {
        caches[0].1.assign(epoch, start);
    }
    caches[1].1.assign(7, 1000);
    let mut seed = vec![3u8];
    seed.extend(epochs::encode(caches.iter().map(|(tp, c)| (*tp, c))));
    write(&root.join("storage_files"), "leader-epochs", &seed);
    let mut found = cuts::Cuts::default();
    found.insert(a, vec![cuts::Cut { seq: 10, end: 40 }, cuts::Cut { seq: 30, end: 12 }]);
    found.insert(b, vec![cuts::Cut { seq: 20, end: 1000 }]);
    let mut seed = vec![4u8];
    seed.extend(cuts::encode(&found));
    write(&root.join("storage_files"), "truncations", &seed);

    // REST bodies, by route (the index `rest_body` reads from byte 0).
    let rest = [
        (0u8, r#"{"records":[{"key":"k","value":{"a":1}},{"value":[1,2,3],"partition":0}]}"#),
        (1, r#"{"records":[{"key":"a2V5","value":"dmFsdWU=","headers":[{"name":"h","value":"dg=="}]}]}"#),
        (2, r#"[{"user":{"id":"u1"},"n":1},{"user":{"id":"u2"},"n":2}]"#),
        (3, "{\"a\":1}\n{\"b\":2}\n\n{\"c\":[3]}\n"),
        (4, r#"{"key":{"type":"STRING","data":"k"},"value":{"type":"JSON","data":{"x":1}},"headers":[{"name":"h","value":"dg=="}]}"#),
        (5, r#"{"value":{"type":"JSON","data":1}}{"value":{"type":"BINARY","data":"eA=="}} {"partition_id":0,"value":{"type":"STRING","data":"s"}}"#),
        (6, r#"{"entries":[{"id":"1","value":{"type":"JSON","data":1}},{"id":"2","key":{"type":"STRING","data":"k"},"value":{"type":"STRING","data":"v"}}]}"#),
    ];
    for (route, body) in rest {
        let mut seed = vec![route];
        seed.extend_from_slice(body.as_bytes());
        write(&root.join("rest_body"), &format!("route-{route}"), &seed);
    }
    // Answers from another node, by decoder (the first byte, as
    // `peer_response` reads it): Fetch at each version, then Produce.
    {
        use canopy::protocol::{fetch, produce};
        use kafka_protocol::messages::fetch_response::{EpochEndOffset, FetchableTopicResponse, LeaderIdAndEpoch, PartitionData};
        use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
        use kafka_protocol::messages::{BrokerId, FetchResponse, ProduceResponse, ResponseHeader, TopicName};
        use kafka_protocol::protocol::{Encodable, StrBytes};
        let body = |id: i32, encode: &dyn Fn(&mut bytes::BytesMut)| -> Vec<u8> {
            let mut b = bytes::BytesMut::new();
            ResponseHeader::default().with_correlation_id(id).encode(&mut b, 1).unwrap();
            encode(&mut b);
            b.to_vec()
        };
        let records: Vec<u8> = batches.iter().take(3).flatten().copied().collect();
        for version in fetch::FIRST_DECODED_VERSION..=fetch::MAX_VERSION {
            let p = PartitionData::default()
                .with_partition_index(1)
                .with_high_watermark(40)
                .with_records(Some(Bytes::from(records.clone())))
                .with_diverging_epoch(EpochEndOffset::default().with_epoch(2).with_end_offset(17))
                .with_current_leader(LeaderIdAndEpoch::default().with_leader_id(BrokerId(3)).with_leader_epoch(4));
            let t = FetchableTopicResponse::default().with_topic(TopicName(StrBytes::from_static_str("app.seed"))).with_topic_id(uuid::Uuid::from_bytes([7; 16])).with_partitions(vec![p]);
            let r = FetchResponse::default().with_responses(vec![t]);
            let mut seed = vec![(version - fetch::FIRST_DECODED_VERSION) as u8];
            seed.extend(body(version as i32, &|b| r.encode(b, version).unwrap()));
            write(&root.join("peer_response"), &format!("fetch-v{version}"), &seed);
        }
        let ok = PartitionProduceResponse::default().with_index(0).with_base_offset(42);
        let refused = PartitionProduceResponse::default().with_index(1).with_error_code(6).with_base_offset(-1).with_error_message(Some(StrBytes::from_static_str("not the leader")));
        let r = ProduceResponse::default().with_responses(vec![TopicProduceResponse::default().with_name(TopicName(StrBytes::from_static_str("app.seed"))).with_partition_responses(vec![ok, refused])]);
        let mut seed = vec![0x80];
        seed.extend(body(1, &|b| r.encode(b, produce::VERSION).unwrap()));
        write(&root.join("peer_response"), "produce", &seed);
        // A transaction's answers between nodes (canopy::protocol::txn).
        use canopy::protocol::txn;
        use kafka_protocol::messages::add_partitions_to_txn_response::{AddPartitionsToTxnPartitionResult, AddPartitionsToTxnResult, AddPartitionsToTxnTopicResult};
        use kafka_protocol::messages::write_txn_markers_response::{WritableTxnMarkerPartitionResult, WritableTxnMarkerResult, WritableTxnMarkerTopicResult};
        use kafka_protocol::messages::{AddPartitionsToTxnResponse, ProducerId, TransactionalId, WriteTxnMarkersResponse};
        let written = |i, c| WritableTxnMarkerPartitionResult::default().with_partition_index(i).with_error_code(c);
        let r = WriteTxnMarkersResponse::default().with_markers(vec![WritableTxnMarkerResult::default()
            .with_producer_id(ProducerId(1000))
            .with_topics(vec![WritableTxnMarkerTopicResult::default().with_name(TopicName(StrBytes::from_static_str("app.seed"))).with_partitions(vec![written(0, 0), written(1, 6)])])]);
        let mut seed = vec![0x81];
        seed.extend(body(2, &|b| r.encode(b, txn::WRITE_TXN_MARKERS_VERSION).unwrap()));
        write(&root.join("peer_response"), "write_txn_markers", &seed);
        let added = |i, c| AddPartitionsToTxnPartitionResult::default().with_partition_index(i).with_partition_error_code(c);
        let r = AddPartitionsToTxnResponse::default().with_results_by_transaction(vec![AddPartitionsToTxnResult::default()
            .with_transactional_id(TransactionalId(StrBytes::from_static_str("tx.seed")))
            .with_topic_results(vec![AddPartitionsToTxnTopicResult::default().with_name(TopicName(StrBytes::from_static_str("app.seed"))).with_results_by_partition(vec![added(0, 0), added(2, 48)])])]);
        let mut seed = vec![0x82];
        seed.extend(body(3, &|b| r.encode(b, txn::ADD_PARTITIONS_VERSION).unwrap()));
        write(&root.join("peer_response"), "add_partitions_to_txn", &seed);
    }
    println!("{} batches, {} consumer protocol blobs, 4 storage files, {} REST bodies, {} peer responses", batches.len(), blobs.len(), rest.len(), fetch_versions());
}

fn fetch_versions() -> usize {
    use canopy::protocol::fetch;
    // Each Fetch version, then Produce, WriteTxnMarkers, AddPartitionsToTxn.
    (fetch::MAX_VERSION - fetch::FIRST_DECODED_VERSION + 4) as usize
}
