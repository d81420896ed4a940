//! Compressed batches: librdkafka producers with gzip, snappy, lz4 and
//! zstd, each codec to its own partition and all four mixed in one; every
//! record reads back intact (the broker stores batches as sent). A gzip
//! batch that would inflate to 1 GiB is refused with MESSAGE_TOO_LARGE and
//! the broker's memory stays flat, while one that inflates past
//! max.message.bytes but not past the inflate bound is accepted.

use crate::common;

use std::io::Write;
use std::time::Duration;

use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};

const CODECS: [&str; 4] = ["gzip", "snappy", "lz4", "zstd"];
const PER_CODEC: usize = 10_000;

fn value(codec: usize, i: usize) -> String {
    format!("{}-{i}-{}", CODECS[codec], "payload ".repeat(i % 20))
}

/// (partition, offset, value) of exactly `want` records.
fn read(addr: std::net::SocketAddr, topic: &str, partitions: &[i32], want: usize) -> Vec<(i32, i64, String)> {
    common::read_exactly(addr, topic, partitions, want).iter().map(|m| (m.partition(), m.offset(), String::from_utf8(m.payload().unwrap().to_vec()).unwrap())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_codec_round_trips_alone_and_mixed() {
    let dir = tempfile::tempdir().unwrap();
    let broker = common::start(common::args(dir.path())).await;
    let addr = broker.kafka_addr;
    let admin: AdminClient<DefaultClientContext> = common::client(addr).create().unwrap();
    for (name, parts) in [("codecs.each", 4), ("codecs.mixed", 1)] {
        admin.create_topics([&NewTopic::new(name, parts, TopicReplication::Fixed(1))], &AdminOptions::new()).await.unwrap()[0].as_ref().unwrap();
    }
    // Each codec to its own partition of codecs.each; and, interleaved in
    // small rounds, all four into the one partition of codecs.mixed.
    let producers: Vec<FutureProducer> = CODECS
        .iter()
        .map(|c| {
            let mut cfg = common::producer_config(addr, "all");
            cfg.set("compression.type", *c).set("linger.ms", "2");
            cfg.create().unwrap()
        })
        .collect();
    for round in 0..10 {
        let mut futs = Vec::new();
        for (c, p) in producers.iter().enumerate() {
            for i in round * PER_CODEC / 10..(round + 1) * PER_CODEC / 10 {
                let v = value(c, i);
                futs.push(p.send_result(FutureRecord::to("codecs.each").partition(c as i32).key("k").payload(&v)).map_err(|(e, _)| e).unwrap());
                if i % 10 == 0 {
                    futs.push(p.send_result(FutureRecord::to("codecs.mixed").partition(0).key("k").payload(&v)).map_err(|(e, _)| e).unwrap());
                }
            }
            p.flush(Duration::from_secs(30)).unwrap();
        }
        for f in futs {
            f.await.unwrap().expect("acked");
        }
    }
    let each = tokio::task::spawn_blocking(move || read(addr, "codecs.each", &[0, 1, 2, 3], 4 * PER_CODEC)).await.unwrap();
    for (c, codec) in CODECS.iter().enumerate() {
        let mine: Vec<&(i32, i64, String)> = each.iter().filter(|r| r.0 == c as i32).collect();
        assert_eq!(mine.len(), PER_CODEC, "{codec}");
        for (i, (_, offset, v)) in mine.iter().enumerate() {
            assert_eq!((*offset, v.as_str()), (i as i64, value(c, i).as_str()), "{codec} record {i}");
        }
    }
    let mixed = tokio::task::spawn_blocking(move || read(addr, "codecs.mixed", &[0], 4 * PER_CODEC / 10)).await.unwrap();
    for (i, (_, offset, _)) in mixed.iter().enumerate() {
        assert_eq!(*offset, i as i64, "offsets dense across codecs");
    }
    for (c, codec) in CODECS.iter().enumerate() {
        let got: Vec<&str> = mixed.iter().filter(|r| r.2.starts_with(&format!("{codec}-"))).map(|r| r.2.as_str()).collect();
        let want: Vec<String> = (0..PER_CODEC).filter(|i| i % 10 == 0).map(|i| value(c, i)).collect();
        assert_eq!(got, want, "{codec} records in the mixed partition");
    }
    broker.shutdown().await;
}

/// A v2 batch of one record whose records section is `records`, gzip.
fn gzip_batch(records: &[u8]) -> bytes::Bytes {
    let mut b = Vec::new();
    b.extend_from_slice(&0i64.to_be_bytes()); // base offset
    b.extend_from_slice(&((49 + records.len()) as i32).to_be_bytes()); // batch length
    b.extend_from_slice(&(-1i32).to_be_bytes()); // partition leader epoch
    b.push(2); // magic
    b.extend_from_slice(&0u32.to_be_bytes()); // crc, below
    b.extend_from_slice(&1i16.to_be_bytes()); // attributes: gzip
    b.extend_from_slice(&0i32.to_be_bytes()); // last offset delta
    b.extend_from_slice(&1_700_000_000_000i64.to_be_bytes());
    b.extend_from_slice(&1_700_000_000_000i64.to_be_bytes());
    b.extend_from_slice(&(-1i64).to_be_bytes()); // producer id
    b.extend_from_slice(&(-1i16).to_be_bytes());
    b.extend_from_slice(&(-1i32).to_be_bytes());
    b.extend_from_slice(&1i32.to_be_bytes()); // records count
    b.extend_from_slice(records);
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    bytes::Bytes::from(b)
}

async fn produce(sock: &mut tokio::net::TcpStream, id: i32, topic: &str, batch: bytes::Bytes) -> (i16, i64) {
    let req = ProduceRequest::default().with_acks(-1).with_timeout_ms(10_000).with_topic_data(vec![TopicProduceData::default()
        .with_name(TopicName(StrBytes::from_string(topic.to_owned())))
        .with_partition_data(vec![PartitionProduceData::default().with_index(0).with_records(Some(batch))])]);
    let r: ProduceResponse = common::call(sock, 0, 8, id, &req).await;
    let p = &r.responses[0].partition_responses[0];
    (p.error_code, p.base_offset)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gzip_bomb_is_refused_and_memory_stays_flat() {
    let dir = tempfile::tempdir().unwrap();
    // A child process: its memory is the broker's alone.
    let broker = common::ChildBroker::spawn(dir.path(), &[]);
    let addr = broker.kafka;
    let pid = broker.child.id();
    // 1 GiB of zeros, gzipped to about 1 MB (under max.message.bytes).
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..1024 {
        e.write_all(&zeros).unwrap();
    }
    let bomb = gzip_batch(&e.finish().unwrap());
    assert!(bomb.len() < 1_048_588, "the bomb fits in one batch ({} bytes)", bomb.len());
    drop(zeros);

    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    // A good gzip batch is accepted (and warms up the broker's buffers).
    let good = common::gzip_record_batch(&[b"fine"]);
    assert_eq!(produce(&mut sock, 1, "bombs", good).await, (0, 0));
    let before = common::proc_status_bytes(pid, "VmRSS:");
    for i in 0..4 {
        let (code, _) = produce(&mut sock, 2 + i, "bombs", bomb.clone()).await;
        assert_eq!(code, 10, "MESSAGE_TOO_LARGE");
    }
    let grown = common::proc_status_bytes(pid, "VmRSS:").saturating_sub(before);
    assert!(grown < 64 << 20, "resident memory grew by {} MiB", grown >> 20);
    // Nothing was stored and the broker carries on.
    assert_eq!(produce(&mut sock, 10, "bombs", common::gzip_record_batch(&[b"after"])).await, (0, 1));
    // max.message.bytes bounds the batch as sent, as in Kafka: one that is
    // small compressed but inflates past it (3 MiB) is fine.
    let big: Vec<u8> = (0..3u32 << 20).map(|i| b"abcdefgh"[(i % 8) as usize]).collect();
    let packed = common::gzip_record_batch(&[&big]);
    assert!(packed.len() < 1 << 20);
    assert_eq!(produce(&mut sock, 11, "bombs", packed).await, (0, 2));
    assert!(broker.terminate().success());
}

/// The attributes' codec bits of every batch in tp 0 of `topic`, from a
/// raw Fetch (what is stored, not what the client was sent by producers).
async fn stored_codecs(addr: std::net::SocketAddr, topic: &str) -> Vec<i16> {
    use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
    use kafka_protocol::messages::{FetchRequest, FetchResponse};
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = FetchRequest::default().with_replica_id(kafka_protocol::messages::BrokerId(-1)).with_max_wait_ms(0).with_min_bytes(1).with_max_bytes(1 << 24).with_topics(vec![FetchTopic::default()
        .with_topic(TopicName(StrBytes::from_string(topic.to_owned())))
        .with_partitions(vec![FetchPartition::default().with_partition(0).with_fetch_offset(0).with_partition_max_bytes(1 << 24)])]);
    let r: FetchResponse = common::call(&mut sock, 1, 4, 1, &req).await;
    let mut rest = r.responses[0].partitions[0].records.clone().unwrap_or_default();
    let mut codecs = Vec::new();
    while rest.len() >= 61 {
        let len = i32::from_be_bytes(rest[8..12].try_into().unwrap()) as usize + 12;
        codecs.push(i16::from_be_bytes(rest[21..23].try_into().unwrap()) & 7);
        rest = rest.slice(len.min(rest.len())..);
    }
    codecs
}

/// A topic's compression.type other than `producer` is applied on append:
/// batches in another codec are recompressed, and read back intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_compression_type_recompresses_on_append() {
    let dir = tempfile::tempdir().unwrap();
    let broker = common::start(common::args(dir.path())).await;
    let addr = broker.kafka_addr;
    let admin: AdminClient<DefaultClientContext> = common::client(addr).create().unwrap();
    for (name, codec) in [("recompress.zstd", "zstd"), ("recompress.none", "uncompressed")] {
        let t = NewTopic::new(name, 1, TopicReplication::Fixed(1)).set("compression.type", codec);
        admin.create_topics([&t], &AdminOptions::new()).await.unwrap()[0].as_ref().unwrap();
    }
    for (topic, producer_codec) in [("recompress.zstd", "none"), ("recompress.zstd", "gzip"), ("recompress.none", "lz4")] {
        let mut cfg = common::producer_config(addr, "all");
        cfg.set("compression.type", producer_codec);
        let p: FutureProducer = cfg.create().unwrap();
        for i in 0..500 {
            let v = value(0, i);
            p.send(FutureRecord::to(topic).partition(0).key("k").payload(&v), Duration::from_secs(10)).await.expect("acked");
        }
    }
    let zstd = stored_codecs(addr, "recompress.zstd").await;
    assert!(!zstd.is_empty() && zstd.iter().all(|c| *c == 4), "every stored batch is zstd: {zstd:?}");
    let none = stored_codecs(addr, "recompress.none").await;
    assert!(!none.is_empty() && none.iter().all(|c| *c == 0), "every stored batch is uncompressed: {none:?}");
    let z = tokio::task::spawn_blocking(move || read(addr, "recompress.zstd", &[0], 1000)).await.unwrap();
    let want: Vec<String> = (0..500).chain(0..500).map(|i| value(0, i)).collect();
    assert_eq!(z.iter().map(|r| r.2.clone()).collect::<Vec<_>>(), want);
    let n = tokio::task::spawn_blocking(move || read(addr, "recompress.none", &[0], 500)).await.unwrap();
    assert_eq!(n.iter().map(|r| r.2.clone()).collect::<Vec<_>>(), (0..500).map(|i| value(0, i)).collect::<Vec<_>>());
    broker.shutdown().await;
}
