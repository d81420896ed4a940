//! Metrics with real clients: librdkafka produces, consumes in a group and
//! commits, reqwest posts to the REST bridge, then `/metrics` is scraped.
//! Every metric the Grafana dashboard queries must be in the scrape (CI
//! also evaluates each query in a real Prometheus); per-topic labels fold
//! into branches past the limit; a broker with 100,000 topics scrapes in
//! bounded size; disabled metrics record nothing.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::producer::{FutureProducer, FutureRecord};

/// Each sample line of a scrape: name -> label sets.
fn samples(text: &str) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let end = line.find(['{', ' ']).expect("a sample line");
        let labels = line[end..].split_once('}').map_or("", |(l, _)| l).to_owned();
        out.entry(line[..end].to_owned()).or_default().push(labels);
    }
    out
}

async fn scrape(admin: std::net::SocketAddr) -> String {
    let r = reqwest::get(format!("http://{admin}/metrics")).await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers()["content-type"].to_str().unwrap().starts_with("text/plain; version=0.0.4"));
    r.text().await.unwrap()
}

/// Metric names and `label="value"` matchers in a PromQL expression.
fn referenced(expr: &str) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    let b = expr.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let starts = (expr[i..].starts_with("canopy_") || expr[i..].starts_with("process_")) && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_'));
        if !starts {
            i += 1;
            continue;
        }
        let mut j = i;
        while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
            j += 1;
        }
        let mut matchers = Vec::new();
        if b.get(j) == Some(&b'{') {
            let close = expr[j..].find('}').unwrap() + j;
            matchers = expr[j + 1..close].split(',').map(|m| m.trim().to_owned()).filter(|m| !m.is_empty()).collect();
            j = close;
        }
        out.push((expr[i..j.min(expr.len())].split('{').next().unwrap().to_owned(), matchers));
        i = j + 1;
    }
    out
}

fn dashboard_exprs() -> Vec<String> {
    let d: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/grafana/dashboards/canopy.json")).unwrap()).unwrap();
    let mut out = Vec::new();
    for p in d["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            out.push(t["expr"].as_str().unwrap().to_owned());
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_queries_is_exported_after_real_traffic() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = common::args(dir.path());
    args.rest_max_body_bytes = Some(1024);
    let broker = common::start(args).await;
    let admin = broker.admin_addr;
    let before = samples(&scrape(admin).await);
    assert!(before.contains_key("canopy_ready") && before.contains_key("process_resident_memory_bytes"));

    // Kafka: produce, consume in a group, commit.
    let producer: FutureProducer = common::producer_config(broker.kafka_addr, "all").create().unwrap();
    for i in 0..20 {
        producer.send(FutureRecord::to("metrics.kafka").key("k").payload(&format!("v{i}")), Duration::from_secs(10)).await.unwrap();
    }
    let mut cc = common::consumer_config(broker.kafka_addr);
    cc.set("group.id", "metrics-group").set("auto.offset.reset", "earliest");
    let consumer: StreamConsumer = cc.create().unwrap();
    consumer.subscribe(&["metrics.kafka"]).unwrap();
    let mut last = None;
    for _ in 0..10 {
        last = Some(tokio::time::timeout(Duration::from_secs(60), consumer.recv()).await.expect("a record").unwrap().detach());
    }
    let last = last.unwrap();
    let mut commit = rdkafka::TopicPartitionList::new();
    commit.add_partition_offset("metrics.kafka", 0, rdkafka::Offset::Offset(rdkafka::Message::offset(&last) + 1)).unwrap();
    consumer.commit(&commit, CommitMode::Sync).unwrap();
    // A fetch past the end: OFFSET_OUT_OF_RANGE, counted as an error.
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset("metrics.kafka", 0, rdkafka::Offset::Offset(1_000)).unwrap();
    let mut oc = common::consumer_config(broker.kafka_addr);
    oc.set("auto.offset.reset", "earliest");
    let stray: StreamConsumer = oc.create().unwrap();
    stray.assign(&tpl).unwrap();
    let first = tokio::time::timeout(Duration::from_secs(30), stray.recv()).await.expect("the stray consumer resets to earliest").unwrap();
    assert_eq!(rdkafka::Message::offset(&first), 0);

    // REST: an accepted post and a refused one (413).
    let http = reqwest::Client::new();
    let rest = broker.rest_addr.unwrap();
    let ok = http.post(format!("http://{rest}/ingest/metrics/rest")).header("content-type", "application/x-ndjson").body("{\"a\":1}\n{\"a\":2}\n").send().await.unwrap();
    assert_eq!(ok.status(), 200);
    let big = http.post(format!("http://{rest}/ingest/metrics/rest")).header("content-type", "application/json").body(format!("{{\"pad\":\"{}\"}}", "x".repeat(2048))).send().await.unwrap();
    assert_eq!(big.status(), 413);
    let lost = http.get(format!("http://{rest}/no/such/route")).send().await.unwrap();
    assert_eq!(lost.status(), 404);

    let text = scrape(admin).await;
    let got = samples(&text);
    let value = |name: &str, labels: &str| -> f64 {
        text.lines().find(|l| l.starts_with(name) && l[name.len()..].starts_with(&format!("{labels} ")) || (labels.is_empty() && l.starts_with(&format!("{name} ")))).unwrap_or_else(|| panic!("{name}{labels} in the scrape")).rsplit(' ').next().unwrap().parse().unwrap()
    };
    assert_eq!(value("canopy_records_in_total", ""), 22.0, "20 by Kafka, 2 by REST");
    assert_eq!(value("canopy_rest_events_total", ""), 2.0);
    assert_eq!(value("canopy_rest_rejected_total", "{reason=\"too_large\"}"), 1.0);
    assert_eq!(value("canopy_consumer_group_lag", "{group=\"metrics-group\",topic=\"metrics.kafka\",partition=\"0\"}"), 10.0);
    assert_eq!(value("canopy_high_watermark", "{topic=\"metrics.kafka\",partition=\"0\"}"), 20.0);
    assert!(value("canopy_kafka_request_duration_seconds_count", "{api=\"Produce\"}") >= 1.0);
    assert!(value("canopy_fsync_duration_seconds_count", "") >= 1.0);
    assert!(value("canopy_bytes_out_total", "") > 0.0, "fetched bytes counted");
    assert!(got["canopy_kafka_errors_total"].iter().any(|l| l.contains("api=\"Fetch\"") && l.contains("OffsetOutOfRange")), "{:?}", got.get("canopy_kafka_errors_total"));
    assert!(got["canopy_kafka_requests_total"].iter().any(|l| l.contains("api=\"Produce\"")));
    assert!(value("canopy_connections_open", "{listener=\"kafka\"}") >= 1.0);
    assert_eq!(value("canopy_rest_requests_total", "{route=\"/ingest/{*path}\",status=\"200\"}"), 1.0, "a matched route keeps its path");
    assert_eq!(value("canopy_rest_requests_total", "{route=\"other\",status=\"404\"}"), 1.0, "an unmatched path is counted as other");
    // Bytes out are the batches each reply carried: the group consumer read
    // the 20 batches once, the stray consumer once more after its reset to
    // earliest; empty long polls add nothing.
    let (bin, bout) = (value("canopy_topic_bytes_in_total", "{topic=\"metrics.kafka\"}"), value("canopy_topic_bytes_out_total", "{topic=\"metrics.kafka\"}"));
    assert!(bin > 0.0);
    assert_eq!(bout, 2.0 * bin, "fetched bytes counted once per reply");

    // Every metric and label matcher the dashboard uses is there.
    let exprs = dashboard_exprs();
    assert!(exprs.len() >= 30, "{} queries", exprs.len());
    for e in &exprs {
        let refs = referenced(e);
        assert!(!refs.is_empty(), "{e} names no Canopy metric");
        for (name, matchers) in refs {
            let series = got.get(&name).unwrap_or_else(|| panic!("{name} (in {e}) is not exported"));
            for m in matchers {
                assert!(series.iter().any(|l| l.contains(&m)), "no {name} series has {m} (in {e})");
            }
        }
    }
    broker.shutdown().await;
}

#[test]
fn grafana_provisioning_and_the_dashboard_agree_on_the_datasource() {
    let root = env!("CARGO_MANIFEST_DIR");
    let ds = std::fs::read_to_string(format!("{root}/grafana/provisioning/datasources/prometheus.yml")).unwrap();
    let uid = ds.lines().find_map(|l| l.trim().strip_prefix("uid:")).expect("a datasource uid").trim().to_owned();
    let d: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(format!("{root}/grafana/dashboards/canopy.json")).unwrap()).unwrap();
    let mut seen = BTreeSet::new();
    for p in d["panels"].as_array().unwrap().iter().filter(|p| p["type"] != "row") {
        seen.insert(p["datasource"]["uid"].as_str().unwrap().to_owned());
        for t in p["targets"].as_array().unwrap() {
            seen.insert(t["datasource"]["uid"].as_str().unwrap().to_owned());
        }
    }
    assert_eq!(seen, BTreeSet::from([uid]));
    let boards = std::fs::read_to_string(format!("{root}/grafana/provisioning/dashboards/dashboards.yml")).unwrap();
    let path = boards.lines().find_map(|l| l.trim().strip_prefix("path:")).unwrap().trim().to_owned();
    let compose = std::fs::read_to_string(format!("{root}/docker-compose.yml")).unwrap();
    assert!(compose.contains(&format!("./grafana/dashboards:{path}")), "compose mounts the dashboards where the provider looks ({path})");
    assert!(compose.contains("./grafana/provisioning:/etc/grafana/provisioning"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_labels_fold_into_branches_past_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = common::args(dir.path());
    args.metrics_topic_label_limit = Some(3);
    let broker = common::start(args).await;
    for t in ["app.code.commits", "app.code.pushes", "app.web.clicks", "app.web.views"] {
        broker.engine.create_topic(t, 2, Default::default(), false).unwrap();
    }
    let got = samples(&scrape(broker.admin_addr).await);
    let topics: BTreeSet<String> = got["canopy_log_end_offset"].iter().map(|l| l.split("topic=\"").nth(1).unwrap().split('"').next().unwrap().to_owned()).collect();
    assert_eq!(topics, BTreeSet::from(["app.code.*".to_owned(), "app.web.*".to_owned()]));
    assert!(got["canopy_log_end_offset"].iter().all(|l| l.contains("partition=\"*\"")));
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_thousand_topics_scrape_in_bounded_size() {
    const TOPICS: usize = 100_000;
    let dir = tempfile::tempdir().unwrap();
    let mut args = common::args(dir.path());
    args.max_topics = Some(TOPICS + 10);
    let broker = common::start(args).await;
    let engine = broker.engine.clone();
    let created = Instant::now();
    tokio::task::spawn_blocking(move || {
        for i in 0..TOPICS {
            engine.create_topic(&format!("tenant{}.svc{}.events", i % 100, i / 100), 1, Default::default(), false).unwrap();
        }
    })
    .await
    .unwrap();
    let created = created.elapsed();
    let started = Instant::now();
    let text = scrape(broker.admin_addr).await;
    let took = started.elapsed();
    eprintln!("{TOPICS} topics created in {created:?}; one scrape: {} bytes in {took:?}", text.len());
    // 100 tenants x 1,000 services: folded to the 100 tenants.
    let got = samples(&text);
    assert_eq!(got["canopy_log_end_offset"].len(), 100, "one series per tenant branch");
    assert!(text.len() < 256 << 10, "the scrape is {} bytes", text.len());
    broker.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disabled_metrics_record_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = common::args(dir.path());
    args.metrics_enabled = Some(false);
    let broker = common::start(args).await;
    let http = reqwest::Client::new();
    let r = http.post(format!("http://{}/ingest/off.t", broker.rest_addr.unwrap())).header("content-type", "application/json").body("{}").send().await.unwrap();
    assert_eq!(r.status(), 200);
    let text = scrape(broker.admin_addr).await;
    assert!(text.lines().any(|l| l == "canopy_fsync_duration_seconds_count 0"), "no fsync recorded");
    assert!(text.lines().any(|l| l == "canopy_rest_events_total 0"));
    broker.shutdown().await;
}

/// A poisoned broker (here poisoned by hand, as a failed fsync or a panic
/// on the write path would) says so: `/ready` is 503 with the reason, the
/// scrape carries it, and a real producer's write is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poisoned_broker_is_not_ready_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let broker = common::start(common::args(dir.path())).await;
    broker.engine.create_topic("p.ready", 1, Default::default(), false).unwrap();
    let ready = reqwest::get(format!("http://{}/ready", broker.admin_addr)).await.unwrap();
    assert_eq!(ready.status(), 200);
    assert!(scrape(broker.admin_addr).await.lines().any(|l| l == "canopy_storage_poisoned{reason=\"\"} 0"));

    broker.engine.storage().poison_with("a test says the disk is bad".into());
    let ready = reqwest::get(format!("http://{}/ready", broker.admin_addr)).await.unwrap();
    assert_eq!(ready.status(), 503);
    assert!(ready.text().await.unwrap().contains("a test says the disk is bad"));
    let text = scrape(broker.admin_addr).await;
    assert!(text.lines().any(|l| l.starts_with("canopy_storage_poisoned{reason=\"") && l.contains("a test says the disk is bad") && l.ends_with(" 1")), "{text}");
    let producer: FutureProducer = common::client(broker.kafka_addr).set("message.timeout.ms", "3000").set("retries", "0").create().unwrap();
    let sent = producer.send(FutureRecord::<(), _>::to("p.ready").payload("x"), Duration::from_secs(5)).await;
    assert!(matches!(sent, Err((rdkafka::error::KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::KafkaStorageError), _))), "{sent:?}");
    broker.shutdown().await;
}
