//! kill -9 in a loop: idempotent acks=all producers (librdkafka) write
//! while the broker child is killed every 2±1 s and restarted on the same
//! port, for a minute (`CANOPY_CRASH_LOOP_SECS` changes that; the long
//! run is `CANOPY_CRASH_LOOP_SECS=600`). Then:
//! every acknowledged record is in the log once, at the offset its ack
//! gave, and each partition holds its acknowledged records in the order
//! they were produced.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

use crate::common::{self, ChildBroker};

const TOPIC: &str = "crash.loop.events";
const PARTITIONS: i32 = 4;
const PRODUCERS: usize = 2;

/// (producer, sequence) -> (partition, offset) of each acknowledged record.
type Acked = Arc<Mutex<HashMap<(usize, u64), (i32, i64)>>>;

/// The broker comes back on the same port after each kill.
fn free_port() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], common::stable_port(&[std::net::Ipv4Addr::LOCALHOST])))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_producers_lose_and_repeat_nothing_across_kill_9_every_two_seconds() {
    let secs: u64 = std::env::var("CANOPY_CRASH_LOOP_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(60);
    let dir = tempfile::tempdir().unwrap();
    let addr = free_port();
    let listener = addr.to_string();
    let args = ["--kafka-listener", listener.as_str(), "--num-partitions", "4"];
    let mut broker = Some(ChildBroker::spawn(dir.path(), &args));

    let acked: Acked = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for id in 0..PRODUCERS {
        let mut cfg = common::producer_config(addr, "all");
        cfg.set("enable.idempotence", "true")
            .set("max.in.flight.requests.per.connection", "5")
            // Long enough to outlive restarts: records are retried, not
            // failed, while the broker is down.
            .set("message.timeout.ms", "120000")
            .set("reconnect.backoff.ms", "50")
            .set("reconnect.backoff.max.ms", "500");
        let producer: FutureProducer = cfg.create().unwrap();
        let (acked, stop) = (acked.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut inflight = Vec::new();
            let mut seq = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let key = format!("{id}-{seq}");
                let rec = FutureRecord::to(TOPIC).partition((seq % PARTITIONS as u64) as i32).key(&key).payload(&key);
                match producer.send_result(rec) {
                    Ok(f) => {
                        inflight.push((seq, f));
                        seq += 1;
                        // About 2,500 records a second each: enough to be
                        // mid-flight at every kill, few enough to check.
                        if seq % 100 == 0 {
                            tokio::time::sleep(Duration::from_millis(40)).await;
                        }
                    }
                    // Queue full: let deliveries catch up.
                    Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                }
                if inflight.len() >= 500 {
                    for (s, f) in inflight.drain(..250) {
                        if let Ok(Ok(d)) = f.await {
                            acked.lock().unwrap().insert((id, s), (d.partition, d.offset));
                        }
                    }
                }
            }
            for (s, f) in inflight.drain(..) {
                if let Ok(Ok(d)) = f.await {
                    acked.lock().unwrap().insert((id, s), (d.partition, d.offset));
                }
            }
            let _ = producer.flush(Duration::from_secs(60));
            seq
        }));
    }

    // The loop: kill every 2±1 s, restart on the same port.
    let started = Instant::now();
    let mut kills = 0;
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    while started.elapsed() < Duration::from_secs(secs) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        tokio::time::sleep(Duration::from_millis(1000 + rng % 2001)).await;
        broker.take().unwrap().kill9();
        kills += 1;
        broker = Some(tokio::task::spawn_blocking({
            let dir = dir.path().to_owned();
            let listener = listener.clone();
            move || ChildBroker::spawn(&dir, &["--kafka-listener", listener.as_str(), "--num-partitions", "4"])
        })
        .await
        .unwrap());
    }
    stop.store(true, Ordering::Relaxed);
    let mut sent = 0;
    for t in tasks {
        sent += t.await.unwrap();
    }
    let acked = acked.lock().unwrap().clone();
    eprintln!("crash loop: {kills} kills in {:?}, {sent} records sent, {} acknowledged", started.elapsed(), acked.len());
    assert!(kills >= secs / 3, "the broker was killed {kills} times");
    assert!(acked.len() as u64 >= sent / 2, "most records were acknowledged ({} of {sent})", acked.len());

    // Restart once more and read everything back.
    broker.take().unwrap().kill9();
    let broker = ChildBroker::spawn(dir.path(), &args);
    let found = tokio::task::spawn_blocking(move || read_all(addr)).await.unwrap();
    let mut seen: HashSet<String> = HashSet::new();
    let mut at: HashMap<(i32, i64), String> = HashMap::new();
    for (p, records) in &found {
        let mut last_seq: HashMap<usize, u64> = HashMap::new();
        for (i, (offset, key)) in records.iter().enumerate() {
            assert_eq!(*offset, i as i64, "partition {p}: offsets are dense from 0");
            assert!(seen.insert(key.clone()), "{key} is in the log twice");
            at.insert((*p, *offset), key.clone());
            let (id, seq) = key.split_once('-').map(|(a, b)| (a.parse::<usize>().unwrap(), b.parse::<u64>().unwrap())).unwrap();
            if let Some(prev) = last_seq.insert(id, seq) {
                assert!(seq > prev, "partition {p}: {key} after {id}-{prev}, out of produce order");
            }
        }
    }
    for ((id, seq), pos) in &acked {
        let key = format!("{id}-{seq}");
        assert_eq!(at.get(pos), Some(&key), "acknowledged {key} at {pos:?} is not there");
    }
    assert!(broker.terminate().success());
}

fn read_all(addr: SocketAddr) -> HashMap<i32, Vec<(i64, String)>> {
    let consumer: BaseConsumer = common::consumer_config(addr).create().unwrap();
    let mut total = 0;
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        let (_, high) = consumer.fetch_watermarks(TOPIC, p, Duration::from_secs(60)).unwrap();
        total += high as usize;
        tpl.add_partition_offset(TOPIC, p, Offset::Beginning).unwrap();
    }
    consumer.assign(&tpl).unwrap();
    let mut out: HashMap<i32, Vec<(i64, String)>> = HashMap::new();
    let mut n = 0;
    let deadline = Instant::now() + Duration::from_secs(300);
    while n < total {
        assert!(Instant::now() < deadline, "read {n} of {total}");
        let Some(m) = consumer.poll(Duration::from_millis(500)) else { continue };
        let m = m.unwrap();
        out.entry(m.partition()).or_default().push((m.offset(), String::from_utf8(m.key().unwrap().to_vec()).unwrap()));
        n += 1;
    }
    out
}
