//! Dynamic configs: AlterConfigs through librdkafka changes a topic's and
//! the broker's configs, DescribeConfigs shows the value and its source,
//! the change takes effect without a restart (old data goes by the new
//! retention) and survives one; bad input to AlterConfigs and
//! IncrementalAlterConfigs gets Kafka's errors and changes nothing.
//! (The compatibility suite drives IncrementalAlterConfigs through
//! confluent-kafka and kafka-python.)

use crate::common;

use std::time::{Duration, Instant};

use kafka_protocol::messages::incremental_alter_configs_request::{AlterConfigsResource, AlterableConfig};
use kafka_protocol::messages::{DescribeConfigsRequest, DescribeConfigsResponse, IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse};
use kafka_protocol::protocol::StrBytes;
use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, ConfigSource, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;

fn st(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_owned())
}

async fn describe(admin: &AdminClient<DefaultClientContext>, topic: &str) -> rdkafka::admin::ConfigResource {
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    admin.describe_configs([&ResourceSpecifier::Topic(topic)], &opts).await.unwrap().remove(0).expect("described")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn altered_retention_is_described_applied_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = common::args(dir.path());
    // Small segments, so old data lies in sealed ones retention may take.
    args.message_max_bytes = Some(4096);
    args.segment_bytes = Some(16 << 10);
    args.retention_check_interval_ms = Some(100);
    args.retention_ms = Some(86_400_000 * 30);
    let broker = common::start(args.clone()).await;
    let addr = broker.kafka_addr;
    let admin: AdminClient<DefaultClientContext> = common::client(addr).create().unwrap();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    for name in ["cfg.ret.old", "cfg.ret.other"] {
        assert!(admin.create_topics([&NewTopic::new(name, 1, TopicReplication::Fixed(1))], &opts).await.unwrap()[0].is_ok());
    }

    // Two hours old by CreateTime: kept by the 30-day retention.
    let producer: FutureProducer = common::producer_config(addr, "all").create().unwrap();
    let old = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64 - 2 * 3_600_000;
    let payload = vec![b'x'; 900];
    for i in 0..100i64 {
        producer.send(FutureRecord::to("cfg.ret.old").key("k").payload(&payload).timestamp(old + i), Duration::from_secs(30)).await.expect("acked");
    }
    let consumer: BaseConsumer = common::consumer_config(addr).create().unwrap();
    let (low, high) = consumer.fetch_watermarks("cfg.ret.old", 0, Duration::from_secs(10)).unwrap();
    assert_eq!((low, high), (0, 100));

    // The static default is described as such, with its synonyms.
    let d = describe(&admin, "cfg.ret.old").await;
    let r = d.get("retention.ms").unwrap();
    assert_eq!((r.value.as_deref(), &r.source), (Some("2592000000"), &ConfigSource::StaticBroker));
    assert_eq!(d.get("cleanup.policy").unwrap().source, ConfigSource::Default);

    // One hour: the sealed segments of old data go at the next round.
    let alter = AlterConfig::new(ResourceSpecifier::Topic("cfg.ret.old")).set("retention.ms", "3600000");
    assert!(admin.alter_configs([&alter], &opts).await.unwrap()[0].is_ok());
    let r = describe(&admin, "cfg.ret.old").await;
    let r = r.get("retention.ms").unwrap();
    assert_eq!((r.value.as_deref(), &r.source), (Some("3600000"), &ConfigSource::DynamicTopic));
    let deadline = Instant::now() + Duration::from_secs(30);
    let low = loop {
        let (low, _) = consumer.fetch_watermarks("cfg.ret.old", 0, Duration::from_secs(10)).unwrap();
        if low > 0 || Instant::now() > deadline {
            break low;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(low > 0 && low < 100, "retention took the sealed old data and kept the active segment: log start {low}");
    // The sibling without an override kept its default.
    assert_eq!(describe(&admin, "cfg.ret.other").await.get("retention.ms").unwrap().value.as_deref(), Some("2592000000"));

    // The broker's own default, changed at run time, reaches the sibling.
    let alter = AlterConfig::new(ResourceSpecifier::Broker(0)).set("log.retention.ms", "7200000");
    assert!(admin.alter_configs([&alter], &opts).await.unwrap()[0].is_ok());
    let other = describe(&admin, "cfg.ret.other").await;
    let r = other.get("retention.ms").unwrap();
    assert_eq!((r.value.as_deref(), &r.source), (Some("7200000"), &ConfigSource::DynamicBroker));

    // Bad input: Kafka's codes, and nothing changes. (The rdkafka crate
    // drops AlterConfigs' per-resource errors, so the codes are read on
    // the wire, from the same request librdkafka sends.)
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    for (kind, name, key, value, code) in [
        (2, "cfg.ret.old", "retention.ms", "soon", 40),
        (2, "cfg.ret.old", "retention.ms", "-5", 40),
        (2, "cfg.ret.old", "no.such.config", "1", 40),
        (2, "cfg.ret.old", "cleanup.policy", "shred", 40),
        (2, "cfg.nowhere", "retention.ms", "1", 3),
        (4, "0", "log.dirs", "/tmp", 42),
        (4, "0", "log.segment.bytes", "2097152", 42),
        (4, "0", "log.retention.ms", "later", 42),
    ] {
        use kafka_protocol::messages::alter_configs_request::{AlterConfigsResource as Legacy, AlterableConfig as LegacyConfig};
        let req = kafka_protocol::messages::AlterConfigsRequest::default().with_resources(vec![Legacy::default()
            .with_resource_type(kind)
            .with_resource_name(st(name))
            .with_configs(vec![LegacyConfig::default().with_name(st(key)).with_value(Some(st(value)))])]);
        let resp: kafka_protocol::messages::AlterConfigsResponse = common::call(&mut sock, 33, 2, 9, &req).await;
        assert_eq!(resp.responses[0].error_code, code, "{name} {key}={value}: {:?}", resp.responses[0].error_message);
        // Through librdkafka the same request is refused and changes nothing.
        if kind == 2 {
            let _ = admin.alter_configs([&AlterConfig::new(ResourceSpecifier::Topic(name)).set(key, value)], &opts).await.unwrap();
        }
    }
    assert_eq!(describe(&admin, "cfg.ret.old").await.get("retention.ms").unwrap().value.as_deref(), Some("3600000"));
    drop(sock);

    // validate_only checks and keeps nothing.
    let alter = AlterConfig::new(ResourceSpecifier::Topic("cfg.ret.old")).set("retention.ms", "5");
    assert!(admin.alter_configs([&alter], &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))).validate_only(true)).await.unwrap()[0].is_ok());
    assert_eq!(describe(&admin, "cfg.ret.old").await.get("retention.ms").unwrap().value.as_deref(), Some("3600000"));

    // AlterConfigs replaces the whole set: the topic's retention.ms goes
    // back to the broker's dynamic default.
    let alter = AlterConfig::new(ResourceSpecifier::Topic("cfg.ret.old")).set("max.message.bytes", "2048");
    assert!(admin.alter_configs([&alter], &opts).await.unwrap()[0].is_ok());
    let d = describe(&admin, "cfg.ret.old").await;
    assert_eq!(d.get("retention.ms").unwrap().source, ConfigSource::DynamicBroker);
    assert_eq!(d.get("max.message.bytes").unwrap().value.as_deref(), Some("2048"));
    // ... and the new max.message.bytes is enforced on the next produce.
    let big = vec![b'y'; 3000];
    let refused = producer.send(FutureRecord::to("cfg.ret.old").key("k").payload(&big), Duration::from_secs(30)).await;
    assert!(matches!(refused, Err((rdkafka::error::KafkaError::MessageProduction(RDKafkaErrorCode::MessageSizeTooLarge), _))), "{refused:?}");
    drop((producer, consumer, admin));
    broker.shutdown().await;

    // Durable: the same configs after a restart.
    let broker = common::start(args).await;
    let admin: AdminClient<DefaultClientContext> = common::client(broker.kafka_addr).create().unwrap();
    let d = describe(&admin, "cfg.ret.old").await;
    assert_eq!(d.get("max.message.bytes").unwrap().value.as_deref(), Some("2048"));
    let r = d.get("retention.ms").unwrap();
    assert_eq!((r.value.as_deref(), &r.source), (Some("7200000"), &ConfigSource::DynamicBroker));
    drop(admin);
    broker.shutdown().await;
}

async fn incremental(sock: &mut tokio::net::TcpStream, resources: Vec<AlterConfigsResource>, validate_only: bool) -> IncrementalAlterConfigsResponse {
    let req = IncrementalAlterConfigsRequest::default().with_resources(resources).with_validate_only(validate_only);
    common::call(sock, 44, 1, 1, &req).await
}

fn resource(kind: i8, name: &str, ops: &[(&str, i8, Option<&str>)]) -> AlterConfigsResource {
    AlterConfigsResource::default()
        .with_resource_type(kind)
        .with_resource_name(st(name))
        .with_configs(ops.iter().map(|(k, op, v)| AlterableConfig::default().with_name(st(k)).with_config_operation(*op).with_value(v.map(st))).collect())
}

async fn topic_configs(sock: &mut tokio::net::TcpStream, topic: &str) -> Vec<(String, String, i8)> {
    use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
    let req = DescribeConfigsRequest::default().with_resources(vec![DescribeConfigsResource::default().with_resource_type(2).with_resource_name(st(topic)).with_configuration_keys(None)]);
    let resp: DescribeConfigsResponse = common::call(sock, 32, 4, 2, &req).await;
    resp.results[0].configs.iter().map(|c| (c.name.to_string(), c.value.as_ref().map(|v| v.to_string()).unwrap_or_default(), c.config_source)).collect()
}

/// IncrementalAlterConfigs' operations and its malformed requests, on the
/// wire: each refusal is Kafka's, and a refused resource changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn incremental_alter_configs_edits_and_refuses_as_kafka() {
    let dir = tempfile::tempdir().unwrap();
    let broker = common::start(common::args(dir.path())).await;
    let admin: AdminClient<DefaultClientContext> = common::client(broker.kafka_addr).create().unwrap();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    assert!(admin.create_topics([&NewTopic::new("cfg.inc", 1, TopicReplication::Fixed(1)).set("retention.ms", "1000")], &opts).await.unwrap()[0].is_ok());
    let mut sock = tokio::net::TcpStream::connect(broker.kafka_addr).await.unwrap();
    let get = |all: &[(String, String, i8)], k: &str| all.iter().find(|c| c.0 == k).map(|c| (c.1.clone(), c.2)).unwrap();

    // APPEND to an unset list starts from its default; DELETE drops the
    // override; SET sets.
    let ops = [("cleanup.policy", 2, Some("compact")), ("retention.ms", 1, None), ("retention.bytes", 0, Some("1048576"))];
    let r = incremental(&mut sock, vec![resource(2, "cfg.inc", &ops)], false).await;
    assert_eq!(r.responses[0].error_code, 0, "{:?}", r.responses[0].error_message);
    let all = topic_configs(&mut sock, "cfg.inc").await;
    assert_eq!(get(&all, "cleanup.policy"), ("delete,compact".into(), 1));
    assert_eq!(get(&all, "retention.ms"), ("604800000".into(), 5));
    assert_eq!(get(&all, "retention.bytes"), ("1048576".into(), 1));
    let r = incremental(&mut sock, vec![resource(2, "cfg.inc", &[("cleanup.policy", 3, Some("delete"))])], false).await;
    assert_eq!(r.responses[0].error_code, 0);
    assert_eq!(get(&topic_configs(&mut sock, "cfg.inc").await, "cleanup.policy"), ("compact".into(), 1));

    // Refusals: (resources, the code each gets).
    let before = topic_configs(&mut sock, "cfg.inc").await;
    let cases: Vec<(Vec<AlterConfigsResource>, Vec<i16>)> = vec![
        // The same resource twice: both refused.
        (vec![resource(2, "cfg.inc", &[("retention.ms", 0, Some("5"))]), resource(2, "cfg.inc", &[("retention.ms", 0, Some("6"))])], vec![42, 42]),
        // The same key twice.
        (vec![resource(2, "cfg.inc", &[("retention.ms", 0, Some("5")), ("retention.ms", 1, None)])], vec![42]),
        // A null value for SET.
        (vec![resource(2, "cfg.inc", &[("retention.ms", 0, None)])], vec![42]),
        // An operation that does not exist.
        (vec![resource(2, "cfg.inc", &[("retention.ms", 9, Some("5"))])], vec![42]),
        // APPEND to a key that is not a list.
        (vec![resource(2, "cfg.inc", &[("retention.ms", 2, Some("5"))])], vec![40]),
        // A bad value among good ones: the resource is all or nothing.
        (vec![resource(2, "cfg.inc", &[("retention.bytes", 0, Some("5")), ("min.cleanable.dirty.ratio", 0, Some("2"))])], vec![40]),
        // Defaults of topics are not a resource; unknown types neither.
        (vec![resource(2, "", &[("retention.ms", 0, Some("5"))]), resource(9, "x", &[])], vec![42, 42]),
        // Another broker's id, or not an id.
        (vec![resource(4, "7", &[("log.retention.ms", 0, Some("5"))]), resource(4, "zero", &[("log.retention.ms", 0, Some("5"))])], vec![42, 42]),
        // A broker key that is not a dynamic topic default.
        (vec![resource(4, "", &[("no.such.broker.key", 0, Some("5"))])], vec![42]),
    ];
    for (resources, codes) in cases {
        let what = format!("{:?}", resources.iter().map(|r| (r.resource_type, r.resource_name.to_string(), r.configs.len())).collect::<Vec<_>>());
        let r = incremental(&mut sock, resources, false).await;
        assert_eq!(r.responses.iter().map(|r| r.error_code).collect::<Vec<_>>(), codes, "{what}: {:?}", r.responses);
    }
    assert_eq!(topic_configs(&mut sock, "cfg.inc").await, before, "refused requests changed nothing");

    // validate_only: answered as if applied, nothing kept.
    let r = incremental(&mut sock, vec![resource(2, "cfg.inc", &[("retention.ms", 0, Some("5"))])], true).await;
    assert_eq!(r.responses[0].error_code, 0);
    assert_eq!(topic_configs(&mut sock, "cfg.inc").await, before);

    // The cluster-wide default (BROKER "") is described on its own, with
    // only what it sets, and reaches topics as DYNAMIC_DEFAULT_BROKER_CONFIG.
    let r = incremental(&mut sock, vec![resource(4, "", &[("log.retention.ms", 0, Some("123456"))])], false).await;
    assert_eq!(r.responses[0].error_code, 0, "{:?}", r.responses[0].error_message);
    assert_eq!(get(&topic_configs(&mut sock, "cfg.inc").await, "retention.ms"), ("123456".into(), 3));
    use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
    let req = DescribeConfigsRequest::default().with_include_synonyms(true).with_include_documentation(true).with_resources(vec![
        DescribeConfigsResource::default().with_resource_type(4).with_resource_name(st("")).with_configuration_keys(None),
        DescribeConfigsResource::default().with_resource_type(4).with_resource_name(st("0")).with_configuration_keys(Some(vec![st("log.retention.ms"), st("log.dirs"), st("nope")])),
        DescribeConfigsResource::default().with_resource_type(2).with_resource_name(st("cfg.missing")).with_configuration_keys(None),
    ]);
    let resp: DescribeConfigsResponse = common::call(&mut sock, 32, 4, 3, &req).await;
    let cluster: Vec<_> = resp.results[0].configs.iter().map(|c| (c.name.to_string(), c.config_source)).collect();
    assert_eq!(cluster, [("log.retention.ms".to_owned(), 3)]);
    let node = &resp.results[1].configs;
    assert_eq!(node.iter().map(|c| c.name.to_string()).collect::<Vec<_>>(), ["log.retention.ms", "log.dirs"], "unknown keys are left out");
    assert!(!node[0].read_only && node[1].read_only);
    assert_eq!(node[0].config_type, 5, "LONG");
    assert!(node[0].documentation.as_ref().is_some_and(|d| !d.is_empty()));
    assert_eq!(node[0].synonyms.iter().map(|s| s.source).collect::<Vec<_>>(), [3, 5]);
    assert_eq!(resp.results[2].error_code, 3, "UNKNOWN_TOPIC_OR_PARTITION");
    drop(admin);
    broker.shutdown().await;
}
