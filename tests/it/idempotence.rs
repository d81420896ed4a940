//! Idempotent producers: librdkafka with `enable.idempotence=true` produces
//! and every record lands exactly once; on the wire, a retried batch is
//! answered with its first offsets and not written again, a gap is
//! OUT_OF_ORDER_SEQUENCE_NUMBER, an old epoch INVALID_PRODUCER_EPOCH, a
//! batch older than the window DUPLICATE_SEQUENCE_NUMBER, a producer the
//! partition does not know starting past sequence 0
//! UNKNOWN_PRODUCER_ID; an epoch bump
//! fences the old epoch; a retry is still
//! recognised after a clean restart (snapshot) and after kill -9 (state
//! rebuilt from the log).

use crate::common;

use std::time::Duration;

use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse, ProduceRequest, ProduceResponse, TransactionalId};
use kafka_protocol::protocol::StrBytes;
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};


#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn librdkafka_idempotent_producer_writes_each_record_once() {
    let dir = tempfile::tempdir().unwrap();
    let broker = common::start(common::args(dir.path())).await;
    let addr = broker.kafka_addr;
    common::create_topic(addr, "idem.events", 4).await;

    let mut cfg = common::producer_config(addr, "all");
    cfg.set("enable.idempotence", "true").set("max.in.flight.requests.per.connection", "5");
    let producer: FutureProducer = cfg.create().unwrap();
    const N: usize = 40_000;
    let mut futs = Vec::with_capacity(N);
    for i in 0..N {
        let key = format!("k{i}");
        let rec = FutureRecord::to("idem.events").partition((i % 4) as i32).key(&key).payload("v");
        futs.push(producer.send_result(rec).map_err(|(e, _)| e).unwrap());
    }
    let mut offsets = vec![Vec::new(); 4];
    for f in futs {
        let d = f.await.unwrap().unwrap();
        offsets[d.partition as usize].push(d.offset);
    }
    for (p, o) in offsets.iter_mut().enumerate() {
        o.sort();
        assert_eq!(*o, (0..(N / 4) as i64).collect::<Vec<_>>(), "partition {p}: acked offsets dense from 0");
    }
    drop(producer);

    let read = tokio::task::spawn_blocking(move || common::read_exactly(addr, "idem.events", &[0, 1, 2, 3], N)).await.unwrap();
    let keys: std::collections::HashSet<Vec<u8>> = read.iter().map(|m| m.key().unwrap().to_vec()).collect();
    assert_eq!(keys.len(), N, "every record once");
    broker.shutdown().await;
}

fn produce(topic: &str, batch: bytes::Bytes) -> ProduceRequest {
    ProduceRequest::default().with_acks(-1).with_timeout_ms(10_000).with_topic_data(vec![TopicProduceData::default()
        .with_name(kafka_protocol::messages::TopicName(StrBytes::from_string(topic.to_owned())))
        .with_partition_data(vec![PartitionProduceData::default().with_index(0).with_records(Some(batch))])])
}

/// (error code, base offset) of a one-partition produce.
fn outcome(r: &ProduceResponse) -> (i16, i64) {
    let p = &r.responses[0].partition_responses[0];
    (p.error_code, p.base_offset)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequences_and_epochs_on_the_wire() {
    let dir = tempfile::tempdir().unwrap();
    let broker = common::start(common::args(dir.path())).await;
    let addr = broker.kafka_addr;
    common::create_topic(addr, "idem.wire", 1).await;
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut id = 0;
    let mut next_id = || {
        id += 1;
        id
    };

    let init: InitProducerIdResponse = common::call(&mut sock, 22, 1, next_id(), &InitProducerIdRequest::default().with_transaction_timeout_ms(60_000)).await;
    assert_eq!(init.error_code, 0);
    let pid = init.producer_id.0;
    assert!(pid >= 0);
    assert_eq!(init.producer_epoch, 0);
    let again: InitProducerIdResponse = common::call(&mut sock, 22, 1, next_id(), &InitProducerIdRequest::default().with_transaction_timeout_ms(60_000)).await;
    assert_ne!(again.producer_id.0, pid, "a plain idempotent producer gets a fresh id");
    // KIP-360 (v3) naming its id and epoch: a fresh id, as Kafka does
    // without a transactional id.
    let reinit = InitProducerIdRequest::default().with_transaction_timeout_ms(60_000).with_producer_id(again.producer_id).with_producer_epoch(0);
    let fresh: InitProducerIdResponse = common::call(&mut sock, 22, 3, next_id(), &reinit).await;
    assert_eq!(fresh.error_code, 0);
    assert_ne!(fresh.producer_id, again.producer_id);

    let b = |seq: i32, values: &[&[u8]]| common::producer_batch(pid, 0, seq, values);
    async fn send(sock: &mut tokio::net::TcpStream, n: i32, batch: bytes::Bytes) -> (i16, i64) {
        outcome(&common::call::<_, _, ProduceResponse>(sock, 0, 8, n, &produce("idem.wire", batch)).await)
    }
    assert_eq!(send(&mut sock, next_id(), b(0, &[b"a", b"b", b"c"])).await, (0, 0));
    // The retry: answered with the first offsets, not written again.
    assert_eq!(send(&mut sock, next_id(), b(0, &[b"a", b"b", b"c"])).await, (0, 0));
    assert_eq!(send(&mut sock, next_id(), b(3, &[b"d"])).await, (0, 3));
    // A gap.
    assert_eq!(send(&mut sock, next_id(), b(9, &[b"x"])).await.0, 45, "OUT_OF_ORDER_SEQUENCE_NUMBER");
    // Five more batches push seq 0..2 out of the window of five.
    for i in 0..5 {
        assert_eq!(send(&mut sock, next_id(), b(4 + i, &[b"e"])).await, (0, 4 + i as i64));
    }
    assert_eq!(send(&mut sock, next_id(), b(0, &[b"a", b"b", b"c"])).await.0, 46, "DUPLICATE_SEQUENCE_NUMBER");
    // A producer id this broker never handed out is refused, so made-up
    // ids cannot grow its state.
    assert_eq!(send(&mut sock, next_id(), common::producer_batch(1 << 40, 0, 0, &[b"forged"])).await.0, 59, "UNKNOWN_PRODUCER_ID");
    // A producer this partition knows nothing of, whose batch does not
    // start at sequence 0: the batches before it are not here (refused,
    // or lost before they were appended), and taking this one would tell
    // the client they were written. Refused, nothing written.
    let r: ProduceResponse = common::call(&mut sock, 0, 8, next_id(), &produce("idem.wire", common::producer_batch(fresh.producer_id.0, 0, 4, &[b"after a gap"]))).await;
    assert_eq!(outcome(&r).0, 59, "UNKNOWN_PRODUCER_ID");
    // With the log start, without which Java's producer retries the same
    // batch until it times out (KIP-360).
    assert_eq!(r.responses[0].partition_responses[0].log_start_offset, 0);
    // A non-idempotent batch is unaffected.
    assert_eq!(send(&mut sock, next_id(), common::record_batch(&[b"plain"])).await, (0, 9));

    // A newer epoch (as a client bumps it) restarts at sequence 0 and
    // fences the old epoch's batches.
    assert_eq!(send(&mut sock, next_id(), common::producer_batch(pid, 1, 0, &[b"new"])).await, (0, 10));
    assert_eq!(send(&mut sock, next_id(), common::producer_batch(pid, 0, 9, &[b"old"])).await.0, 47, "INVALID_PRODUCER_EPOCH");
    // A transactional id with a bad timeout is named as such.
    let bad_timeout = InitProducerIdRequest::default().with_transactional_id(Some(TransactionalId(StrBytes::from_static_str("idem-txn")))).with_transaction_timeout_ms(0);
    let r: InitProducerIdResponse = common::call(&mut sock, 22, 1, next_id(), &bad_timeout).await;
    assert_eq!(r.error_code, 50, "INVALID_TRANSACTION_TIMEOUT");

    // The log holds each record once: 11 records, offsets 0..=10.
    let values: Vec<(i64, Vec<u8>)> =
        tokio::task::spawn_blocking(move || common::read_exactly(addr, "idem.wire", &[0], 11)).await.unwrap().iter().map(|m| (m.offset(), m.payload().unwrap().to_vec())).collect();
    let want: Vec<(i64, Vec<u8>)> = [&b"a"[..], b"b", b"c", b"d", b"e", b"e", b"e", b"e", b"e", b"plain", b"new"].iter().enumerate().map(|(i, v)| (i as i64, v.to_vec())).collect();
    assert_eq!(values, want);
    broker.shutdown().await;
}

/// Produce, restart (`how`), retry: the retry of a batch written before the
/// restart is answered with its first offsets and not written again, and
/// the producer carries on in sequence.
/// Returns what `restart` handed back (the restarted broker).
async fn retry_across<B>(addr_before: std::net::SocketAddr, restart: impl std::future::Future<Output = (std::net::SocketAddr, B)>) -> B {
    let mut sock = tokio::net::TcpStream::connect(addr_before).await.unwrap();
    let init: InitProducerIdResponse = common::call(&mut sock, 22, 1, 1, &InitProducerIdRequest::default().with_transaction_timeout_ms(60_000)).await;
    let pid = init.producer_id.0;
    let req = |seq: i32, values: &[&[u8]]| produce("idem.restart", common::producer_batch(pid, 0, seq, values));
    let r: ProduceResponse = common::call(&mut sock, 0, 8, 2, &req(0, &[b"a", b"b"])).await;
    assert_eq!(outcome(&r), (0, 0));
    let r: ProduceResponse = common::call(&mut sock, 0, 8, 3, &req(2, &[b"c"])).await;
    assert_eq!(outcome(&r), (0, 2));
    drop(sock);

    let (addr, restarted) = restart.await;
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    let r: ProduceResponse = common::call(&mut sock, 0, 8, 4, &req(2, &[b"c"])).await;
    assert_eq!(outcome(&r), (0, 2), "the retry after the restart is recognised");
    let r: ProduceResponse = common::call(&mut sock, 0, 8, 5, &req(0, &[b"a", b"b"])).await;
    assert_eq!(outcome(&r), (0, 0));
    let r: ProduceResponse = common::call(&mut sock, 0, 8, 6, &req(3, &[b"d"])).await;
    assert_eq!(outcome(&r), (0, 3), "nothing was written twice");
    let r: ProduceResponse = common::call(&mut sock, 0, 8, 7, &req(9, &[b"x"])).await;
    assert_eq!(outcome(&r).0, 45, "and sequence gaps are still caught");
    restarted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_are_deduplicated_across_a_clean_restart() {
    let dir = tempfile::tempdir().unwrap();
    let args = common::args(dir.path());
    let broker = common::start(args.clone()).await;
    let addr = broker.kafka_addr;
    common::create_topic(addr, "idem.restart", 1).await;
    let snapshot = dir.path().join("producers.snapshot");
    let broker = retry_across(addr, async move {
        broker.shutdown().await;
        assert!(snapshot.exists(), "a clean shutdown writes the producer snapshot");
        let broker = common::start(args).await;
        (broker.kafka_addr, broker)
    })
    .await;
    broker.shutdown().await;
}

/// After kill -9 there is no fresh snapshot: the state is rebuilt from the
/// batches in the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_are_deduplicated_across_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let broker = common::ChildBroker::spawn(dir.path(), &[]);
    let addr = broker.kafka;
    common::create_topic(addr, "idem.restart", 1).await;
    let path = dir.path().to_owned();
    let broker = retry_across(addr, async move {
        // The snapshot written at start covers nothing of this topic: the
        // state must come from the log.
        broker.kill9();
        let b = common::ChildBroker::spawn(&path, &[]);
        (b.kafka, b)
    })
    .await;
    assert!(broker.terminate().success());
}

/// A TCP proxy that cuts every connection through it whenever `cut` is
/// notified, mid-request or mid-response.
struct CuttingProxy {
    addr: std::net::SocketAddr,
    cut: std::sync::Arc<tokio::sync::Notify>,
    upstream: std::sync::Arc<std::sync::OnceLock<std::net::SocketAddr>>,
}

impl CuttingProxy {
    async fn start() -> CuttingProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cut = std::sync::Arc::new(tokio::sync::Notify::new());
        let upstream: std::sync::Arc<std::sync::OnceLock<std::net::SocketAddr>> = Default::default();
        let (c, u) = (cut.clone(), upstream.clone());
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let Some(&to) = u.get() else { continue };
                let cut = c.clone();
                tokio::spawn(async move {
                    let Ok(mut server) = tokio::net::TcpStream::connect(to).await else { return };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = cut.notified() => {}
                    }
                });
            }
        });
        CuttingProxy { addr, cut, upstream }
    }
}

/// 100,000 records from an idempotent librdkafka producer (5 requests in
/// flight) through a proxy that keeps cutting its connections: requests
/// whose answers were lost are retried, and every record is in the log
/// exactly once, in order per partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_producer_through_cut_connections_writes_everything_once_in_order() {
    let proxy = CuttingProxy::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut args = common::args(dir.path());
    // Clients learn the proxy as the broker's address, so every connection
    // goes through it.
    args.advertised_listener = Some(proxy.addr.to_string());
    let broker = common::start(args).await;
    proxy.upstream.set(broker.kafka_addr).unwrap();
    common::create_topic(broker.kafka_addr, "idem.cuts", 4).await;

    let mut cfg = common::producer_config(proxy.addr, "all");
    cfg.set("enable.idempotence", "true")
        .set("max.in.flight.requests.per.connection", "5")
        .set("batch.num.messages", "500")
        .set("retry.backoff.ms", "20")
        .set("reconnect.backoff.ms", "10")
        .set("reconnect.backoff.max.ms", "100")
        .set("message.timeout.ms", "120000");
    let producer: FutureProducer = cfg.create().unwrap();
    const N: usize = 100_000;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let cutter = {
        let (cut, stop, engine) = (proxy.cut.clone(), stop.clone(), broker.engine.clone());
        tokio::spawn(async move {
            // A cut every 50 ms while the records are in flight, until the
            // broker has seen a retry of a batch it had written (at least
            // twenty cuts; how soon one lands depends on timing); then the
            // producer is left to finish.
            let mut cuts = 0;
            let retried = || engine.producer_stats().duplicates.load(std::sync::atomic::Ordering::Relaxed) > 0;
            while (cuts < 20 || !retried()) && !stop.load(std::sync::atomic::Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(50)).await;
                cut.notify_waiters();
                cuts += 1;
            }
            cuts
        })
    };
    let mut futs = Vec::with_capacity(N);
    for i in 0..N {
        let key = format!("{i:06}");
        let mut rec = FutureRecord::to("idem.cuts").partition((i % 4) as i32).key(&key).payload("v");
        loop {
            match producer.send_result(rec) {
                Ok(f) => {
                    futs.push(f);
                    break;
                }
                // The local queue is full: wait for deliveries.
                Err((_, back)) => {
                    rec = back;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        }
    }
    for f in futs {
        f.await.unwrap().expect("every record acknowledged");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let cuts = cutter.await.unwrap();
    assert!(cuts >= 3, "the proxy cut connections while records were in flight ({cuts} cuts)");
    drop(producer);

    // Read back from the broker directly.
    let addr = broker.kafka_addr;
    let read = tokio::task::spawn_blocking(move || common::read_exactly(addr, "idem.cuts", &[0, 1, 2, 3], N)).await.unwrap();
    let mut per: Vec<Vec<(i64, usize)>> = vec![Vec::new(); 4];
    for m in &read {
        let i: usize = std::str::from_utf8(m.key().unwrap()).unwrap().parse().unwrap();
        per[m.partition() as usize].push((m.offset(), i));
    }
    for (p, recs) in per.iter().enumerate() {
        let want: Vec<(i64, usize)> = (0..N / 4).map(|k| (k as i64, k * 4 + p)).collect();
        assert!(recs == &want, "partition {p}: every record once, in produce order, offsets dense");
    }
    let dups = broker.engine.producer_stats().duplicates.load(std::sync::atomic::Ordering::Relaxed);
    let refused = broker.engine.producer_stats().refused.load(std::sync::atomic::Ordering::Relaxed);
    eprintln!("{cuts} connection cuts, {dups} retried batches deduplicated, {refused} refused");
    assert!(dups > 0, "the cuts made librdkafka retry batches the broker had already written");
    broker.shutdown().await;
}

/// Keeps librdkafka's log lines.
struct Lines(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl rdkafka::ClientContext for Lines {
    fn log(&self, _: rdkafka::config::RDKafkaLogLevel, fac: &str, line: &str) {
        self.0.lock().unwrap().push(format!("{fac} {line}"));
    }
}

/// A partition that no longer knows a running idempotent producer (its
/// topic deleted and created again): the producer's next batch does not
/// start at sequence 0 and is refused with UNKNOWN_PRODUCER_ID, and
/// librdkafka starts over (a new epoch, sequence 0) without turning
/// fatal. Every record after it is delivered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn librdkafka_starts_over_where_a_partition_forgot_it() {
    use rdkafka::admin::{AdminClient, AdminOptions};
    use rdkafka::producer::Producer;
    let dir = tempfile::tempdir().unwrap();
    let broker = common::start(common::args(dir.path())).await;
    let addr = broker.kafka_addr;
    common::create_topic(addr, "idem.again", 1).await;
    let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut cfg = common::producer_config(addr, "all");
    cfg.set("enable.idempotence", "true").set("debug", "eos").set("topic.metadata.refresh.interval.ms", "200");
    cfg.set_log_level(rdkafka::config::RDKafkaLogLevel::Debug);
    let producer: FutureProducer<Lines> = cfg.create_with_context(Lines(lines.clone())).unwrap();
    let send = |i: usize| producer.send_result(FutureRecord::to("idem.again").partition(0).key("k").payload(&format!("v{i}"))).map_err(|(e, _)| e).unwrap();
    for i in 0..5 {
        send(i).await.unwrap().expect("delivered before the topic goes");
    }

    let admin: AdminClient<rdkafka::client::DefaultClientContext> = common::client(addr).create().unwrap();
    for r in admin.delete_topics(&["idem.again"], &AdminOptions::new()).await.unwrap() {
        r.unwrap();
    }
    common::create_topic(addr, "idem.again", 1).await;
    let refused_before = broker.engine.producer_stats().refused.load(std::sync::atomic::Ordering::Relaxed);
    let mut offsets = Vec::new();
    for i in 5..10 {
        offsets.push(send(i).await.unwrap().expect("delivered to the new topic").offset);
    }
    assert!(producer.client().fatal_error().is_none(), "the producer went on: {:?}", producer.client().fatal_error());
    let refused = broker.engine.producer_stats().refused.load(std::sync::atomic::Ordering::Relaxed) - refused_before;
    let said: Vec<String> = lines.lock().unwrap().iter().filter(|l| l.contains("unknown producer id")).cloned().collect();
    assert!(refused > 0 && !said.is_empty(), "the new partition refused the producer's next batch ({refused} refused) and librdkafka said why: {said:?}");
    assert_eq!(offsets, (0..5).collect::<Vec<i64>>(), "each record once, in order, in the new topic");
    drop(producer);
    let read = tokio::task::spawn_blocking(move || common::read_exactly(addr, "idem.again", &[0], 5)).await.unwrap();
    let values: Vec<Vec<u8>> = read.iter().map(|m| m.payload().unwrap().to_vec()).collect();
    assert_eq!(values, (5..10).map(|i| format!("v{i}").into_bytes()).collect::<Vec<_>>());
    broker.shutdown().await;
}
