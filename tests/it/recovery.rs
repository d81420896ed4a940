//! A segment file with a truncated or bit-flipped tail is recovered to its
//! last valid batch, through the whole broker: produce, stop, damage the
//! file, restart, read.

use crate::common;

use std::os::unix::fs::FileExt;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};

async fn produce(addr: std::net::SocketAddr, n: usize) {
    // linger 0 and one record per send: one batch per record, so the tail
    // batch is exactly the last record.
    let mut cfg = common::producer_config(addr, "all");
    cfg.set("linger.ms", "0");
    let producer: FutureProducer = cfg.create().unwrap();
    for i in 0..n {
        let key = format!("k{i}");
        producer.send(FutureRecord::to("rec.topic").partition(0).key(&key).payload("payload"), Duration::from_secs(30)).await.unwrap();
    }
}

/// The branch's one segment, and its index file.
fn segment(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let branch = dir.join("log").join("rec.topic.br");
    let mut segs = std::fs::read_dir(branch).unwrap().map(|e| e.unwrap().path()).filter(|p| p.extension().is_some_and(|x| x == "seg"));
    let seg = segs.next().expect("a segment");
    assert!(segs.next().is_none(), "one segment");
    let index = seg.with_extension("idx");
    (seg, index)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_tails_recover_to_last_valid_batch() {
    for damage in ["truncate", "bitflip"] {
        let dir = tempfile::tempdir().unwrap();
        let broker = common::start(common::args(dir.path())).await;
        produce(broker.kafka_addr, 20).await;
        broker.shutdown().await;
        // Damage the tail as a crash would, and drop the clean marker so
        // recovery deep-scans. A crash leaves no index file over frames it
        // could tear (one only ever covers synced frames), so the segment's
        // goes too: the clean stop wrote one over these.
        std::fs::remove_file(dir.path().join("CLEAN_SHUTDOWN")).unwrap();
        let (seg, index) = segment(dir.path());
        std::fs::remove_file(&index).expect("the clean stop wrote the active segment's index file");
        let len = std::fs::metadata(&seg).unwrap().len();
        let f = std::fs::OpenOptions::new().read(true).write(true).open(&seg).unwrap();
        match damage {
            "truncate" => f.set_len(len - 7).unwrap(),
            _ => {
                let mut b = [0u8; 1];
                f.read_exact_at(&mut b, len - 3).unwrap();
                f.write_all_at(&[b[0] ^ 0x10], len - 3).unwrap();
            }
        }
        drop(f);
        let broker = common::start(common::args(dir.path())).await;
        let report = broker.engine.recovery_report();
        assert!(report.truncated_bytes > 0, "{damage}: nothing truncated");
        let consumer: BaseConsumer = common::consumer_config(broker.kafka_addr).create().unwrap();
        let wm = consumer.fetch_watermarks("rec.topic", 0, Duration::from_secs(10)).unwrap();
        assert_eq!(wm, (0, 19), "{damage}: the last batch is dropped, the rest kept");
        drop(consumer);
        // Appending continues densely after the recovered end.
        produce(broker.kafka_addr, 1).await;
        let consumer: BaseConsumer = common::consumer_config(broker.kafka_addr).create().unwrap();
        assert_eq!(consumer.fetch_watermarks("rec.topic", 0, Duration::from_secs(10)).unwrap(), (0, 20));
        drop(consumer);
        broker.shutdown().await;
    }
}

/// A clean stop leaves an index file beside every segment, and the next
/// start reads them instead of walking frames, with the same result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clean_restart_reads_index_files_instead_of_walking() {
    let dir = tempfile::tempdir().unwrap();
    let broker = common::start(common::args(dir.path())).await;
    produce(broker.kafka_addr, 20).await;
    broker.shutdown().await;
    let broker = common::start(common::args(dir.path())).await;
    let report = broker.engine.recovery_report();
    assert!(report.segments > 0 && report.indexed_segments == report.segments, "{report:?}");
    assert_eq!(report.frames, 20, "every batch counted from the index files");
    let consumer: BaseConsumer = common::consumer_config(broker.kafka_addr).create().unwrap();
    assert_eq!(consumer.fetch_watermarks("rec.topic", 0, Duration::from_secs(10)).unwrap(), (0, 20));
    drop(consumer);
    produce(broker.kafka_addr, 1).await;
    let consumer: BaseConsumer = common::consumer_config(broker.kafka_addr).create().unwrap();
    assert_eq!(consumer.fetch_watermarks("rec.topic", 0, Duration::from_secs(10)).unwrap(), (0, 21));
    drop(consumer);
    broker.shutdown().await;
}
