use super::*;
use crate::protocol::batch::tests::make_batch;

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

fn clock_at(t: &Arc<AtomicI64>) -> Clock {
    let t = t.clone();
    Arc::new(move || t.load(Ordering::SeqCst))
}

/// An upgrade must not stop the broker: a topic config stored before a
/// check existed (Kafka 3 allowed a 100 kB segment.bytes) and a stored
/// dynamic default that no longer passes are left out with a warning;
/// the rest applies, and other keys of the topic can still change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_configs_that_no_longer_pass_do_not_stop_the_broker() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = EngineConfig::new(dir.path());
    {
        let catalog = Catalog::open(&dir.path().join("catalog")).unwrap();
        let configs: BTreeMap<String, String> = [("segment.bytes", "102400"), ("retention.ms", "5000")].iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        catalog.put_topic(&TopicRecord { id: [7; 16], name: "old.topic".into(), partitions: 1, replication_factor: 1, configs, created_ms: 0 }).unwrap();
        let bad: BTreeMap<String, String> = [("log.retention.bytes".to_string(), "lots".to_string()), ("log.retention.ms".to_string(), "9000".to_string())].into();
        catalog.put_broker_configs("default", &bad).unwrap();
        catalog.flush().unwrap();
    }
    let engine = Engine::open(cfg, system_clock()).unwrap();
    let t = engine.topic("old.topic").unwrap();
    assert_eq!((t.config.retention_ms, t.config.retention_bytes), (5000, -1));
    let other = engine.create_topic("new.topic", 1, BTreeMap::new(), false).unwrap();
    assert_eq!(other.config.retention_ms, 9000, "the good dynamic default applies");
    let e = engine.clone();
    tokio::task::spawn_blocking(move || {
        e.alter_topic_configs("old.topic", Alter::Incremental(vec![Op::Set("retention.ms".into(), "6000".into())]), false).unwrap();
        assert!(e.alter_topic_configs("old.topic", Alter::Incremental(vec![Op::Set("segment.bytes".into(), "102400".into())]), false).is_ok(), "unchanged: not checked again");
        assert!(e.alter_topic_configs("old.topic", Alter::Incremental(vec![Op::Set("segment.bytes".into(), "204800".into())]), false).is_err(), "a new value is checked");
    })
    .await
    .unwrap();
    assert_eq!(engine.topic("old.topic").unwrap().config.retention_ms, 6000);
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_raises_log_start_durably_and_offsets_survive_restart() {
    let dir = tempfile::tempdir().unwrap();
    let now = Arc::new(AtomicI64::new(1_000_000));
    let mut cfg = EngineConfig::new(dir.path());
    cfg.storage.segment_bytes = 4096;
    let engine = Engine::open(cfg.clone(), clock_at(&now)).unwrap();
    let mut configs = BTreeMap::new();
    configs.insert("retention.ms".to_string(), "1000".to_string());
    let topic = engine.create_topic("ret.topic", 1, configs, false).unwrap();
    let other = engine.create_topic("ret.keep", 1, BTreeMap::new(), false).unwrap();
    for i in 0..50 {
        let b = Bytes::from(make_batch(&[format!("r{i}").as_bytes(), b"payload-payload"], 1_000_000));
        engine.append(&topic, 0, b.clone(), Ack::Durable).await.unwrap();
        // The last one durable, so the sibling's high watermark has
        // reached its end before it is checked.
        engine.append(&other, 0, b, if i == 49 { Ack::Durable } else { Ack::Written }).await.unwrap();
    }
    assert_eq!(engine.offsets(&topic.tp(0)), Some((0, 100, 100)));
    now.store(1_000_000 + 60_000, Ordering::SeqCst);
    // Off the runtime, as the server runs it: retention waits for the
    // writer thread to apply its switches.
    let e = engine.clone();
    tokio::task::spawn_blocking(move || e.enforce_retention()).await.unwrap().unwrap();
    let (log_start, hw, leo) = engine.offsets(&topic.tp(0)).unwrap();
    assert!(log_start > 0 && log_start < 100, "log start {log_start}");
    assert_eq!((hw, leo), (100, 100));
    // The sibling without retention keeps everything.
    assert_eq!(engine.offsets(&other.tp(0)), Some((0, 100, 100)));
    assert!(matches!(engine.read(&topic.tp(0), 0, 1 << 20, true), Err(EngineError::Read(ReadError::OffsetOutOfRange { .. }))));
    engine.shutdown().await;
    drop(engine);

    // Unclean reopen (no marker): the persisted log start holds.
    std::fs::remove_file(dir.path().join(storage::log::CLEAN_MARKER)).unwrap();
    let engine = Engine::open(cfg, clock_at(&now)).unwrap();
    let topic = engine.topic("ret.topic").unwrap();
    assert_eq!(engine.offsets(&topic.tp(0)), Some((log_start, 100, 100)));
    let r = engine.read(&topic.tp(0), log_start, 1 << 20, true).unwrap();
    assert!(!r.is_empty());
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_on_the_write_path_poisons_the_broker() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(EngineConfig::new(dir.path()), system_clock()).unwrap();
    let topic = engine.create_topic("p.topic", 1, BTreeMap::new(), false).unwrap();
    let batch = Bytes::from(make_batch(&[b"a"], 0));
    engine.append(&topic, 0, batch.clone(), Ack::Durable).await.unwrap();
    assert_eq!(engine.poisoned(), None);
    engine.writer.send(WriteCmd::Panic).await.unwrap();
    // Whether in the panicking round or after it, the append is refused
    // with the reason, and so is every later one.
    for _ in 0..2 {
        match engine.append(&topic, 0, batch.clone(), Ack::Durable).await {
            Err(EngineError::Storage(StorageError::Poisoned(why))) => assert!(why.contains("a planted panic"), "{why}"),
            other => panic!("not refused: {other:?}"),
        }
    }
    assert!(engine.poisoned().is_some_and(|why| why.contains("the writer thread panicked: a planted panic")));
    assert_eq!(engine.offsets(&topic.tp(0)), Some((0, 1, 1)), "nothing written after the panic");
    // Maintenance and deletion still reach the writer with their
    // switches, and are answered: nothing waits for ever.
    let e = engine.clone();
    tokio::task::spawn_blocking(move || {
        e.enforce_retention().unwrap();
        e.delete_topic("p.topic").unwrap();
    })
    .await
    .unwrap();
    assert!(engine.topic("p.topic").is_none() && engine.offsets(&topic.tp(0)).is_none());
    // Shutdown still completes, and is not clean.
    engine.shutdown().await;
    assert!(!dir.path().join(storage::log::CLEAN_MARKER).exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_are_validated_before_queueing() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(EngineConfig::new(dir.path()), system_clock()).unwrap();
    let topic = engine.create_topic("v.topic", 2, BTreeMap::new(), false).unwrap();
    let good = Bytes::from(make_batch(&[b"a"], 0));
    assert!(matches!(engine.append(&topic, 2, good.clone(), Ack::Written).await, Err(EngineError::UnknownTopicOrPartition)));
    assert!(matches!(engine.append(&topic, -1, good.clone(), Ack::Written).await, Err(EngineError::UnknownTopicOrPartition)));
    assert!(matches!(engine.append(&topic, 0, Bytes::new(), Ack::Written).await, Err(EngineError::Corrupt(BatchError::Empty))));
    // A control batch (transaction marker) from a producer: INVALID_RECORD.
    let mut control = good.to_vec();
    control[22] |= 0x20;
    let crc = crc32c::crc32c(&control[21..]);
    control[17..21].copy_from_slice(&crc.to_be_bytes());
    assert!(matches!(engine.append(&topic, 0, Bytes::from(control), Ack::Written).await, Err(EngineError::Corrupt(BatchError::ControlBatch))));
    let mut bad = good.to_vec();
    *bad.last_mut().unwrap() ^= 1;
    assert!(matches!(engine.append(&topic, 0, Bytes::from(bad), Ack::Written).await, Err(EngineError::Corrupt(BatchError::BadCrc { .. }))));
    // Two batches in one partition's records: both appended, offsets dense.
    let mut two = make_batch(&[b"a", b"b"], 0);
    two.extend(make_batch(&[b"c"], 0));
    let r = engine.append(&topic, 1, Bytes::from(two), Ack::Durable).await.unwrap();
    assert_eq!((r.base_offset, r.last_offset), (0, 2));
    assert_eq!(engine.offsets(&topic.tp(1)), Some((0, 3, 3)));
    engine.shutdown().await;
}

/// `make_batch` as an idempotent producer's batch.
fn idempotent(values: &[&[u8]], producer_id: i64, sequence: i32) -> Bytes {
    let mut b = make_batch(values, 0);
    b[43..51].copy_from_slice(&producer_id.to_be_bytes());
    b[51..53].copy_from_slice(&0i16.to_be_bytes());
    b[53..57].copy_from_slice(&sequence.to_be_bytes());
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    Bytes::from(b)
}

/// Every batch of `tp`, concatenated as a fetch would carry them.
fn all_batches(engine: &Engine, tp: &Tp) -> Bytes {
    let r = engine.read(tp, 0, 1 << 20, true).unwrap();
    assert_eq!(r.next_offset, r.log_end, "one read holds them all");
    r.records.iter().flat_map(|b| b.iter().copied()).collect::<Vec<u8>>().into()
}

/// A replica's copy (cluster mode's follower append): the leader's
/// batches at the leader's offsets, with producer and transaction state
/// following them, so the copy answers a producer's retry with the
/// leader's offsets and fences the epoch the leader's marker ended; a
/// batch below the log end, a corrupt one and an empty copy are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_takes_its_leaders_batches_and_answers_as_it_would() {
    let (ld, fd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let leader = Engine::open(EngineConfig::new(ld.path()), system_clock()).unwrap();
    let follower = Engine::open(EngineConfig::new(fd.path()), system_clock()).unwrap();
    let (lt, ft) = (leader.create_topic("r.t", 1, BTreeMap::new(), false).unwrap(), follower.create_topic("r.t", 1, BTreeMap::new(), false).unwrap());
    // Cluster mode hands out producer ids cluster-wide; two fresh
    // catalogs hand out the same ones.
    let (pid, txn_pid) = (leader.catalog().allocate_producer_id().unwrap(), leader.catalog().allocate_producer_id().unwrap());
    assert_eq!((follower.catalog().allocate_producer_id().unwrap(), follower.catalog().allocate_producer_id().unwrap()), (pid, txn_pid));
    for seq in 0..4 {
        leader.append(&lt, 0, idempotent(&[b"v"], pid, seq), Ack::Durable).await.unwrap();
    }
    let mut t = make_batch(&[b"in a transaction"], 0);
    crate::protocol::batch::set_transactional(&mut t, txn_pid, 0, 0);
    leader.add_txn_partitions(txn_pid, 0, &[lt.tp(0)]);
    leader.append(&lt, 0, Bytes::from(t), Ack::Durable).await.unwrap();
    // Ended under a new epoch, as transactions v2 end.
    leader.close_txn_partitions(txn_pid, vec![lt.tp(0)]).await.unwrap();
    leader.write_markers(txn_pid, 1, Marker::Abort, &[lt.tp(0)]).await.unwrap();
    let copy = all_batches(&leader, &lt.tp(0));
    // In two fetches' worth: the data (the transaction open), then
    // the marker.
    let batches: Vec<&[u8]> = crate::protocol::batch::split(&copy).map(|b| b.unwrap()).collect();
    assert_eq!(batches.len(), 6);
    let (data, marker): (Vec<u8>, Vec<u8>) = (batches[..5].concat(), batches[5].to_vec());
    // Refused whole: batches out of order, or a copy below the log end.
    let swapped = [batches[1], batches[0]].concat();
    assert!(matches!(follower.replicate(ft.tp(0), Bytes::from(swapped), Ack::Written).await, Err(EngineError::Storage(StorageError::Misplaced(_)))));
    assert_eq!(follower.offsets(&ft.tp(0)), Some((0, 0, 0)), "nothing of an out-of-order copy went in");

    let r = follower.replicate(ft.tp(0), Bytes::from(data), Ack::Durable).await.unwrap().wait().await.unwrap();
    assert_eq!((r.base_offset, r.last_offset), (0, 4));
    let open = follower.open_txns();
    assert_eq!(open.len(), 1);
    assert_eq!((open[0].1.producer_id, open[0].1.first_offset), (txn_pid, 4), "the copied transactional batch opened its transaction here");
    let r = follower.replicate(ft.tp(0), Bytes::from(marker), Ack::Durable).await.unwrap().wait().await.unwrap();
    assert_eq!((r.base_offset, r.last_offset), (5, 5));
    assert_eq!(all_batches(&follower, &ft.tp(0)), copy, "byte for byte, at the leader's offsets");
    assert_eq!(follower.offsets(&ft.tp(0)), leader.offsets(&lt.tp(0)));
    assert!(follower.open_txns().is_empty(), "the copied abort marker closed the transaction");
    let (_, lso, aborted) = follower.read_committed(&ft.tp(0), 0, 1 << 20, true).unwrap();
    assert_eq!((lso, aborted), (6, vec![(txn_pid, 4)]), "a read_committed reader drops the aborted batch");
    // Now leading: a retry gets the leader's offsets, the sequence goes
    // on, and the ended epoch is fenced.
    let retry = follower.append(&ft, 0, idempotent(&[b"v"], pid, 2), Ack::Written).await.unwrap();
    assert_eq!(retry.base_offset, 2);
    assert_eq!(follower.append(&ft, 0, idempotent(&[b"v"], pid, 4), Ack::Written).await.unwrap().base_offset, 6);
    let mut zombie = make_batch(&[b"late"], 0);
    crate::protocol::batch::set_transactional(&mut zombie, txn_pid, 0, 1);
    let zombie = follower.append(&ft, 0, Bytes::from(zombie), Ack::Written).await;
    assert!(matches!(zombie, Err(EngineError::ProducerRefused(producers::Refusal::StaleEpoch))), "{zombie:?}");
    // Refused: below the log end, corrupt, nothing at all.
    let again = follower.replicate(ft.tp(0), copy.clone(), Ack::Written).await.unwrap().wait().await;
    assert!(matches!(again, Err(EngineError::Storage(StorageError::Misplaced(_)))), "{again:?}");
    let mut bad = copy.to_vec();
    bad[30] ^= 1;
    assert!(matches!(follower.replicate(ft.tp(0), Bytes::from(bad), Ack::Written).await, Err(EngineError::Corrupt(BatchError::BadCrc { .. }))));
    assert!(matches!(follower.replicate(ft.tp(0), Bytes::new(), Ack::Written).await, Err(EngineError::Corrupt(BatchError::Truncated { .. }))));
    assert_eq!(follower.offsets(&ft.tp(0)).map(|o| o.2), Some(7), "nothing of the refused copies went in");
    leader.shutdown().await;
    follower.shutdown().await;
}

/// A follower's life in the engine (cluster mode): its leader's epochs
/// come with the copies; a divergent tail is cut, and the producer state
/// of the cut batches goes with it, so the producer's retry of a cut batch
/// is appended again, not answered as a duplicate at offsets that no
/// longer hold it; the hw stays under the cap replication puts on it;
/// leading, the node stamps its own epoch into what it appends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_cuts_its_divergent_tail_and_leads_in_its_own_epoch() {
    let (ld, fd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let leader = Engine::open(EngineConfig::new(ld.path()), system_clock()).unwrap();
    let follower = Engine::open(EngineConfig::new(fd.path()), system_clock()).unwrap();
    let (lt, ft) = (leader.create_topic("r.t", 1, BTreeMap::new(), false).unwrap(), follower.create_topic("r.t", 1, BTreeMap::new(), false).unwrap());
    let (l, f) = (lt.tp(0), ft.tp(0));
    let pid = leader.catalog().allocate_producer_id().unwrap();
    assert_eq!(follower.catalog().allocate_producer_id().unwrap(), pid, "as the cluster's id blocks would have it");
    leader.begin_epoch(vec![l], 3).await.unwrap();
    for seq in 0..4 {
        leader.append(&lt, 0, idempotent(&[b"v"], pid, seq), Ack::Durable).await.unwrap();
    }
    let copy = all_batches(&leader, &l);
    assert!(crate::protocol::batch::split(&copy).all(|b| crate::protocol::batch::BatchHeader::parse(b.unwrap()).unwrap().partition_leader_epoch == 3), "stamped with the leader's epoch");
    // The follower's cap: its leader's hw, 2, though it has 4 durable.
    follower.limit_hw(&f, 2);
    follower.replicate(f, copy, Ack::Durable).await.unwrap().wait().await.unwrap();
    assert_eq!(follower.offsets(&f), Some((0, 2, 4)));
    assert_eq!((follower.durable_end(&f), follower.latest_epoch(&f)), (Some(4), 3));
    assert_eq!(follower.read_for_replica(&f, 2, 1 << 20, true).unwrap().next_offset, 4, "a replica reads past the hw");
    assert_eq!(follower.end_offset_for(&f, 3), Some((3, 4)));
    // The leader it followed lost offsets 2 and 3 (they never reached
    // the ISR): the follower cuts there.
    assert_eq!(follower.truncate(f, 2).await.unwrap(), 2);
    assert_eq!(follower.offsets(&f), Some((0, 2, 2)));
    // Leading now, in epoch 4: the producer's retry of sequence 2 is new
    // here, and lands at 2 in the new epoch.
    follower.limit_hw(&f, i64::MAX);
    follower.begin_epoch(vec![f], 4).await.unwrap();
    let r = follower.append(&ft, 0, idempotent(&[b"v"], pid, 2), Ack::Durable).await.unwrap();
    assert_eq!((r.base_offset, follower.offsets(&f).map(|o| o.2)), (2, Some(3)), "the cut batch's producer state went with it: appended, not a duplicate");
    let retry = follower.append(&ft, 0, idempotent(&[b"v"], pid, 1), Ack::Durable).await.unwrap();
    assert_eq!(retry.base_offset, 1, "what was kept still answers a retry");
    assert_eq!(follower.end_offset_for(&f, 3), Some((3, 2)));
    assert_eq!(follower.latest_epoch(&f), 4);
    assert!(matches!(follower.begin_epoch(vec![f], 2).await, Err(EngineError::Storage(StorageError::StaleEpoch { .. }))));
    leader.shutdown().await;
    follower.shutdown().await;
}

/// A cut of a follower's tail replaces the producer snapshot before it
/// is answered: the snapshot on disk covered the cut offsets, and once
/// new batches fill them, a restore from it would take the cut batches'
/// producer state for theirs (a retry of a cut batch answered with
/// another batch's offsets, another producer's batches not known).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_replaces_the_producer_snapshot_before_anything_more_is_appended() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(EngineConfig::new(dir.path()), system_clock()).unwrap();
    let topic = engine.create_topic("r.t", 1, BTreeMap::new(), false).unwrap();
    let f = topic.tp(0);
    let (pid, other) = (engine.catalog().allocate_producer_id().unwrap(), engine.catalog().allocate_producer_id().unwrap());
    engine.begin_epoch(vec![f], 1).await.unwrap();
    for seq in 0..4 {
        engine.append(&topic, 0, idempotent(&[b"v"], pid, seq), Ack::Durable).await.unwrap();
    }
    // A clean stop writes a snapshot covering all four.
    engine.shutdown().await;
    drop(engine);
    let engine = Engine::open(EngineConfig::new(dir.path()), system_clock()).unwrap();
    let topic = engine.topic("r.t").unwrap();
    let covered = |e: &Engine| {
        let raw = e.storage.get_state("producers.snapshot").unwrap().expect("a snapshot");
        producers::Producers::decode_snapshot(&raw).unwrap().2.get(&f).copied()
    };
    assert_eq!(covered(&engine), Some(4));
    // The new leader never had 2 and 3.
    assert_eq!(engine.truncate(f, 2).await.unwrap(), 2);
    assert_eq!(covered(&engine), Some(2), "replaced before the cut was answered");
    // Its batches there: another producer's.
    engine.begin_epoch(vec![f], 2).await.unwrap();
    for seq in 0..2 {
        engine.append(&topic, 0, idempotent(&[b"w"], other, seq), Ack::Durable).await.unwrap();
    }
    // A crash now: the directory as it is, opened by a restart.
    let copy = tempfile::tempdir().unwrap();
    copy_dir(dir.path(), copy.path());
    let _ = std::fs::remove_file(copy.path().join(storage::log::CLEAN_MARKER));
    let restarted = Engine::open(EngineConfig::new(copy.path()), system_clock()).unwrap();
    let t = restarted.topic("r.t").unwrap();
    let retried = restarted.append(&t, 0, idempotent(&[b"v"], pid, 2), Ack::Durable).await.unwrap();
    assert_eq!(retried.base_offset, 4, "the cut batch's retry is new here, not a duplicate at 2");
    let retried = restarted.append(&t, 0, idempotent(&[b"w"], other, 1), Ack::Durable).await.unwrap();
    assert_eq!(retried.base_offset, 3, "the other producer's retry is a duplicate at 3");
    restarted.shutdown().await;
    engine.shutdown().await;
}

/// A replicated tp's hw survives a clean stop as the engine's last hw
/// checkpoint says, not as its whole log; one written while running
/// (`Engine::checkpoint_hws`, every 5 s in cluster mode) bounds what a
/// crash's restart exposes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicas_hw_outlives_a_restart_as_checkpointed() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(EngineConfig::new(dir.path()), system_clock()).unwrap();
    let topic = engine.create_topic("r.t", 1, BTreeMap::new(), false).unwrap();
    let f = topic.tp(0);
    engine.begin_epoch(vec![f], 1).await.unwrap();
    engine.limit_hw(&f, 2);
    for _ in 0..4 {
        engine.append(&topic, 0, Bytes::from(make_batch(&[b"v"], 0)), Ack::Durable).await.unwrap();
    }
    assert_eq!(engine.offsets(&f), Some((0, 2, 4)));
    assert!(engine.checkpoint_hws().unwrap());
    engine.limit_hw(&f, 3);
    // A crash now: the running checkpoint's 2.
    let copy = tempfile::tempdir().unwrap();
    copy_dir(dir.path(), copy.path());
    let crashed = Engine::open(EngineConfig::new(copy.path()), system_clock()).unwrap();
    assert_eq!(crashed.offsets(&f), Some((0, 2, 4)));
    crashed.shutdown().await;
    // A clean stop: the last hw, 3.
    engine.shutdown().await;
    drop(engine);
    let engine = Engine::open(EngineConfig::new(dir.path()), system_clock()).unwrap();
    assert_eq!(engine.offsets(&f), Some((0, 3, 4)));
    engine.shutdown().await;
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traffic_counts_what_reached_the_log_and_outlives_the_topic() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(EngineConfig::new(dir.path()), system_clock()).unwrap();
    let topic = engine.create_topic("t.traffic", 1, BTreeMap::new(), false).unwrap();
    let id = engine.catalog().allocate_producer_id().unwrap();
    let first = idempotent(&[b"a", b"b"], id, 0);
    engine.append(&topic, 0, first.clone(), Ack::Durable).await.unwrap();
    // A retry of the same batch is answered, not written: not traffic.
    let again = engine.append(&topic, 0, first.clone(), Ack::Durable).await.unwrap();
    assert_eq!((again.base_offset, again.last_offset), (0, 1));
    // A sequence gap is refused by the writer: not traffic either.
    let gap = engine.append(&topic, 0, idempotent(&[b"c"], id, 7), Ack::Durable).await;
    assert!(matches!(gap, Err(EngineError::ProducerRefused(_))), "{gap:?}");
    let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let t = &topic.traffic.topic;
    assert_eq!((load(&t.records_in), load(&t.bytes_in)), (2, first.len() as u64));
    let totals = engine.config().probe.traffic.clone();
    assert_eq!((load(&totals.records_in), load(&totals.bytes_in)), (2, first.len() as u64));
    // The broker's totals do not go back when the topic goes.
    let e = engine.clone();
    tokio::task::spawn_blocking(move || e.delete_topic("t.traffic")).await.unwrap().unwrap();
    assert_eq!(load(&totals.records_in), 2);
    engine.shutdown().await;
}

/// A directory that records what the engine asked of it, refusing
/// creations of `taken` names (another node created them first).
#[derive(Default)]
struct Recorder {
    asked: Mutex<Vec<String>>,
    taken: Vec<String>,
}

impl TopicDirectory for Recorder {
    fn create(&self, topic: &TopicRecord) -> Result<(), EngineError> {
        self.asked.lock().unwrap().push(format!("create {}", topic.name));
        if self.taken.contains(&topic.name) {
            return Err(EngineError::TopicExists);
        }
        Ok(())
    }
    fn delete(&self, topic: &TopicRecord) -> Result<(), EngineError> {
        self.asked.lock().unwrap().push(format!("delete {}", topic.name));
        Ok(())
    }
    fn update(&self, old: &TopicRecord, new: &TopicRecord) -> Result<(), EngineError> {
        self.asked.lock().unwrap().push(format!("update {} {}->{}", old.name, old.partitions, new.partitions));
        Ok(())
    }
    fn update_cluster_configs(&self, old: &BTreeMap<String, String>, new: &BTreeMap<String, String>) -> Result<(), EngineError> {
        self.asked.lock().unwrap().push(format!("configs {old:?}->{new:?}"));
        Ok(())
    }
}

/// Cluster mode's topics: every change is asked of the directory first
/// (a refusal changes nothing here), and `follow_topics` makes the local
/// topics the cluster's: created with the cluster's id, deleted, replaced
/// when created again under another id, grown, reconfigured; durable in
/// the catalog across a restart; records of a topic the cluster dropped
/// are gone with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_cluster_mode_topics_are_the_directorys() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = EngineConfig::new(dir.path());
    let engine = Engine::open(cfg.clone(), system_clock()).unwrap();
    let directory = Arc::new(Recorder { taken: vec!["b.taken".into()], ..Recorder::default() });
    engine.set_directory(directory.clone());
    let e = engine.clone();
    tokio::task::spawn_blocking(move || {
        e.create_topic("a.mine", 2, BTreeMap::new(), false).unwrap();
        assert!(matches!(e.create_topic("b.taken", 1, BTreeMap::new(), false), Err(EngineError::TopicExists)), "the cluster has it");
        assert!(e.topic("b.taken").is_none(), "a refused creation leaves nothing here");
        e.create_partitions("a.mine", 3, false).unwrap();
        e.delete_topic("a.mine").unwrap();
    })
    .await
    .unwrap();
    assert_eq!(*directory.asked.lock().unwrap(), vec!["create a.mine", "create b.taken", "update a.mine 2->3", "delete a.mine"]);

    let record = |name: &str, id: u8, partitions: i32, configs: &[(&str, &str)]| TopicRecord { name: name.into(), id: [id; 16], partitions, replication_factor: 1, configs: configs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(), created_ms: 5 };
    let follow = |wanted: Vec<TopicRecord>| {
        let e = engine.clone();
        async move { tokio::task::spawn_blocking(move || e.follow_topics(|| (wanted.into_iter().map(|t| (t.name.clone(), t)).collect(), Default::default()))).await.unwrap() }
    };
    // Another node's topics arrive, with their ids.
    assert_eq!(follow(vec![record("c.one", 1, 1, &[]), record("c.two", 2, 2, &[("retention.ms", "7000")])]).await, 2);
    assert_eq!(engine.topic("c.one").unwrap().id(), [1; 16]);
    assert_eq!(engine.topic("c.two").unwrap().config.retention_ms, 7000);
    let one = engine.topic("c.one").unwrap();
    engine.append(&one, 0, Bytes::from(make_batch(&[b"old"], 1)), Ack::Durable).await.unwrap();
    // Nothing changed: nothing done.
    assert_eq!(follow(vec![record("c.one", 1, 1, &[]), record("c.two", 2, 2, &[("retention.ms", "7000")])]).await, 0);
    // c.one deleted and created again (another id), c.two grown and
    // reconfigured, c.three new.
    let later = vec![record("c.one", 9, 1, &[]), record("c.two", 2, 4, &[("retention.ms", "8000")]), record("c.three", 3, 1, &[])];
    assert_eq!(follow(later.clone()).await, 4, "c.one removed and added, c.two, c.three");
    let one = engine.topic("c.one").unwrap();
    assert_eq!(one.id(), [9; 16]);
    assert_eq!(engine.read(&one.tp(0), 0, 1 << 20, true).unwrap().records.len(), 0, "the old topic's records went with it");
    let two = engine.topic("c.two").unwrap();
    assert_eq!((two.partitions(), two.config.retention_ms), (4, 8000));
    assert!(engine.offsets(&two.tp(3)).is_some(), "the new partitions exist");
    // A topic whose record the cluster cannot read is kept.
    let e = engine.clone();
    let kept = tokio::task::spawn_blocking(move || e.follow_topics(|| (BTreeMap::new(), ["c.two".to_owned(), "c.three".to_owned(), "c.one".to_owned()].into()))).await.unwrap();
    assert_eq!((kept, engine.topics().len()), (0, 3), "unreadable is not deleted");
    // Gone from the cluster: gone here.
    assert_eq!(follow(vec![record("c.three", 3, 1, &[])]).await, 2);
    assert_eq!(engine.topics().iter().map(|t| t.name().to_owned()).collect::<Vec<_>>(), vec!["c.three"]);
    engine.shutdown().await;
    drop(engine);
    // What was followed is durable.
    let engine = Engine::open(cfg, system_clock()).unwrap();
    assert_eq!(engine.topics().iter().map(|t| (t.name().to_owned(), t.id())).collect::<Vec<_>>(), vec![("c.three".to_owned(), [3; 16])]);
    engine.shutdown().await;
}

/// A directory holding the cluster's topics itself; `create` waits for
/// the gate (when set) before it records the topic.
struct Gated {
    topics: Arc<Mutex<BTreeMap<String, TopicRecord>>>,
    gate: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
}

impl TopicDirectory for Gated {
    fn create(&self, topic: &TopicRecord) -> Result<(), EngineError> {
        if let Some(rx) = self.gate.lock().unwrap().take() {
            rx.recv().unwrap();
        }
        self.topics.lock().unwrap().insert(topic.name.clone(), topic.clone());
        Ok(())
    }
    fn delete(&self, topic: &TopicRecord) -> Result<(), EngineError> {
        self.topics.lock().unwrap().remove(&topic.name);
        Ok(())
    }
    fn update(&self, _: &TopicRecord, new: &TopicRecord) -> Result<(), EngineError> {
        self.topics.lock().unwrap().insert(new.name.clone(), new.clone());
        Ok(())
    }
    fn update_cluster_configs(&self, _: &BTreeMap<String, String>, _: &BTreeMap<String, String>) -> Result<(), EngineError> {
        Ok(())
    }
}

/// Cluster mode's broker configs: a change of every broker's default
/// (BROKER "") is asked of the directory, not written to the catalog, and
/// this node's own (BROKER "<id>") stays local; following the cluster's
/// defaults re-derives the topics that do not set the key themselves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_cluster_mode_every_brokers_default_is_the_directorys() {
    use super::configs::{BrokerScope, Op};
    let dir = tempfile::tempdir().unwrap();
    let cfg = EngineConfig::new(dir.path());
    let engine = Engine::open(cfg.clone(), system_clock()).unwrap();
    let directory = Arc::new(Recorder::default());
    engine.set_directory(directory.clone());
    let e = engine.clone();
    tokio::task::spawn_blocking(move || {
        e.create_topic("d.plain", 1, BTreeMap::new(), false).unwrap();
        e.create_topic("d.own", 1, [("retention.ms".to_owned(), "5000".to_owned())].into(), false).unwrap();
        e.alter_broker_configs(BrokerScope::Cluster, Alter::Incremental(vec![Op::Set("log.retention.ms".into(), "60000".into())]), false).unwrap();
        e.alter_broker_configs(BrokerScope::Node, Alter::Incremental(vec![Op::Set("log.retention.bytes".into(), "1048576".into())]), false).unwrap();
    })
    .await
    .unwrap();
    let asked = directory.asked.lock().unwrap().clone();
    assert_eq!(asked.iter().filter(|a| a.starts_with("configs")).collect::<Vec<_>>(), vec![r#"configs {}->{"log.retention.ms": "60000"}"#]);
    assert_eq!(engine.catalog().broker_configs(BrokerScope::Cluster.catalog_key()).unwrap(), BTreeMap::new(), "not in the catalog");
    assert_eq!(engine.catalog().broker_configs(BrokerScope::Node.catalog_key()).unwrap().len(), 1, "this broker's own layer is");
    assert_eq!((engine.topic("d.plain").unwrap().config.retention_ms, engine.topic("d.own").unwrap().config.retention_ms), (60_000, 5000));
    // Another broker changed the default: followed; the same again: nothing.
    let follow = |m: BTreeMap<String, String>| {
        let e = engine.clone();
        async move { tokio::task::spawn_blocking(move || e.follow_cluster_configs(|| m)).await.unwrap() }
    };
    assert!(follow([("log.retention.ms".to_owned(), "90000".to_owned())].into()).await);
    assert!(!follow([("log.retention.ms".to_owned(), "90000".to_owned())].into()).await);
    assert_eq!((engine.topic("d.plain").unwrap().config.retention_ms, engine.topic("d.own").unwrap().config.retention_ms), (90_000, 5000));
    // Removed in the cluster: Kafka's default again.
    assert!(follow(BTreeMap::new()).await);
    assert_eq!(engine.topic("d.plain").unwrap().config.retention_ms, 604_800_000);
    engine.shutdown().await;
}

/// A follow that starts while this node is creating a topic reads the
/// cluster only once it may act (under the admin lock): it must not undo
/// the creation with the cluster as it was before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_racing_a_creation_does_not_undo_it() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::open(EngineConfig::new(dir.path()), system_clock()).unwrap();
    let cluster = Arc::new(Mutex::new(BTreeMap::new()));
    let (open, gate) = std::sync::mpsc::channel();
    engine.set_directory(Arc::new(Gated { topics: cluster.clone(), gate: Mutex::new(Some(gate)) }));
    let e = engine.clone();
    let creating = tokio::task::spawn_blocking(move || e.create_topic("race.new", 1, BTreeMap::new(), false).map(|_| ()));
    // The creation holds the admin lock, waiting on the gate.
    while engine.admin.try_lock().is_ok() {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let (e, c) = (engine.clone(), cluster.clone());
    let following = tokio::task::spawn_blocking(move || e.follow_topics(move || (c.lock().unwrap().clone(), Default::default())));
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    open.send(()).unwrap();
    creating.await.unwrap().unwrap();
    assert_eq!(following.await.unwrap(), 0, "nothing to change");
    assert!(engine.topic("race.new").is_some(), "the follow undid the creation");
    engine.shutdown().await;
}
