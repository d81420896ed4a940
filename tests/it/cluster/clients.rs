//! Real clients besides librdkafka against the cluster, unchanged, each
//! bootstrapping from one broker: kafka-python (`tests/compat/python/
//! cluster_client.py`) and kafkajs (`tests/compat/node/cluster_client.js`)
//! produce with acks=all to a topic with replication factor 3, whose
//! partitions are led by all three nodes, read it back in a consumer group
//! and commit. Every record must be read at the offset its ack gave, the
//! commits must cover what was read, and librdkafka, through a third
//! broker, must find every record once.
//!
//! The interpreters: `CANOPY_COMPAT_PYTHON` (default: the compat suite's
//! venv, `target/compat-venv/bin/python`, which `.ci/run` installs before
//! this runs) and `node` with `tests/compat/node/node_modules` (`npm ci`
//! there). A missing one fails the test.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use super::{create_replicated, read_all, three_nodes};
use crate::cluster_support::Etcd;
use crate::common::ChildBroker;

const TOPIC: &str = "clients.t";
const PARTITIONS: i32 = 3;
const COUNT: usize = 300;

fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("CANOPY_COMPAT_PYTHON") {
        return p.into();
    }
    let venv = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/target/compat-venv/bin/python"));
    if venv.exists() {
        venv
    } else {
        "python3".into()
    }
}

/// Runs `program script args…` and returns its JSON summary line.
fn run_client(program: PathBuf, script: &str, args: &[String]) -> serde_json::Value {
    let script = format!("{}/tests/compat/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(&program).arg(&script).args(args).output().unwrap_or_else(|e| panic!("{} {script}: {e} (see the module docs for installing the clients)", program.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{} {script} {args:?} failed ({}):\n{stdout}\n{}", program.display(), out.status, String::from_utf8_lossy(&out.stderr));
    serde_json::from_str(stdout.lines().last().unwrap_or_default()).unwrap_or_else(|e| panic!("{script}: no JSON summary ({e}): {stdout}"))
}

/// A client's summary checked: `COUNT` records acknowledged, each read at
/// the (partition, offset) its ack gave, and per partition a commit past
/// the last record it read. Returns the values.
fn check(client: &str, summary: &serde_json::Value) -> Vec<String> {
    let acked = summary["acked"].as_object().unwrap_or_else(|| panic!("{client}: {summary}"));
    assert_eq!(acked.len(), COUNT, "{client}: every record acknowledged");
    assert_eq!(summary["read"], summary["acked"], "{client}: every record read back at the partition and offset its ack gave");
    let mut last: BTreeMap<i64, i64> = BTreeMap::new();
    for at in acked.values() {
        let (p, o) = (at[0].as_i64().unwrap(), at[1].as_i64().unwrap());
        let e = last.entry(p).or_insert(o);
        *e = (*e).max(o);
    }
    for (p, o) in &last {
        let committed = summary["committed"][p.to_string()].as_i64().unwrap_or(-1);
        assert!(committed > *o, "{client}: partition {p} committed {committed}, but it read offset {o}: {summary}");
    }
    acked.keys().cloned().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs etcd and a canopy built with --features cluster: see the module docs"]
async fn kafka_python_and_kafkajs_work_against_the_cluster() {
    let root = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(root.path());
    let nodes = three_nodes(root.path(), &etcd).await;
    let addr = |nodes: &[Option<ChildBroker>], id: i32| nodes[id as usize].as_ref().unwrap().kafka;
    let layout = create_replicated(addr(&nodes, 1), TOPIC, PARTITIONS).await;
    let leaders: std::collections::BTreeSet<i32> = layout.iter().map(|(l, _, _)| *l).collect();
    assert!(leaders.len() > 1, "the partitions are led by more than one node: {layout:?}");

    let (py_boot, js_boot) = (addr(&nodes, 2).to_string(), addr(&nodes, 3).to_string());
    let py = tokio::task::spawn_blocking(move || run_client(python(), "python/cluster_client.py", &[py_boot, TOPIC.into(), COUNT.to_string(), "py.group".into()])).await.unwrap();
    let mut values = check("kafka-python", &py);
    let js = tokio::task::spawn_blocking(move || run_client("node".into(), "node/cluster_client.js", &[js_boot, TOPIC.into(), COUNT.to_string(), "js.group".into()])).await.unwrap();
    values.extend(check("kafkajs", &js));

    // librdkafka, through the third broker, finds each record once.
    let mut found: Vec<String> = read_all(addr(&nodes, 1), TOPIC, PARTITIONS, 2 * COUNT).await.into_iter().flatten().map(|v| v.trim_matches('"').to_owned()).collect();
    found.sort();
    values.sort();
    assert_eq!(found, values, "every record of both clients, once");
}
