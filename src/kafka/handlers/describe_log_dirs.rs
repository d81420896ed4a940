//! DescribeLogDirs (v1–4; Kafka 4 dropped v0): the data directory with the bytes of each
//! partition asked (every partition when the request names none), and from
//! v4 the file system's size and free space (`kafka-log-dirs`, Cruise
//! Control, kafka-ui). A partition's size is what is attributable to it:
//! its frames in shared branch segments and its batches in shared subtree
//! stores, from its log start, taken from the files' summaries without
//! reading data. DESCRIBE on the cluster, as Kafka asks; unknown topics
//! are left out, as Kafka leaves out what a broker does not host.

use std::collections::BTreeMap;

use kafka_protocol::messages::describe_log_dirs_response::{DescribeLogDirsPartition, DescribeLogDirsResult, DescribeLogDirsTopic};
pub use kafka_protocol::messages::{DescribeLogDirsRequest as Request, DescribeLogDirsResponse as Response};
use kafka_protocol::messages::TopicName;
use kafka_protocol::protocol::VersionRange;
use kafka_protocol::ResponseError as E;

use crate::auth::acl::Operation;
use crate::kafka::authz::Check;
use crate::kafka::Broker;

pub const VERSIONS: VersionRange = VersionRange { min: 1, max: 4 };

pub async fn handle(broker: &Broker, req: Request, _version: i16) -> Option<Response> {
    if broker.authorizer.enabled() && !Check::current(broker).cluster(Operation::Describe) {
        return Some(Response::default().with_error_code(E::ClusterAuthorizationFailed.code()));
    }
    let engine = broker.engine.clone();
    let result = tokio::task::spawn_blocking(move || {
        // Topic name → partitions asked, in order, each once.
        let asked: BTreeMap<String, Vec<i32>> = match req.topics {
            None => engine.topics().iter().map(|t| (t.name().to_owned(), (0..t.partitions()).collect())).collect(),
            Some(topics) => {
                let mut m: BTreeMap<String, Vec<i32>> = BTreeMap::new();
                for t in topics {
                    let list = m.entry(super::name(&t.topic).to_owned()).or_default();
                    list.extend(t.partitions);
                }
                for list in m.values_mut() {
                    list.sort_unstable();
                    list.dedup();
                }
                m
            }
        };
        // The partitions to size, all at once (each branch's segments are
        // visited once), then answered per topic.
        let mut tps = Vec::new();
        let mut listed: Vec<(String, Vec<i32>)> = Vec::new();
        for (name, partitions) in asked {
            let Some(topic) = engine.topic(&name) else { continue };
            let partitions: Vec<i32> = partitions.into_iter().filter(|p| (0..topic.partitions()).contains(p)).collect();
            tps.extend(partitions.iter().map(|p| topic.tp(*p)));
            listed.push((name, partitions));
        }
        let mut sizes = engine.storage().partition_sizes(&tps).into_iter();
        let topics = listed
            .into_iter()
            .filter_map(|(name, partitions)| {
                let partitions: Vec<_> = partitions
                    .into_iter()
                    .filter_map(|p| sizes.next().flatten().map(|bytes| (p, bytes)))
                    .map(|(p, bytes)| DescribeLogDirsPartition::default().with_partition_index(p).with_partition_size(bytes as i64).with_offset_lag(0))
                    .collect();
                (!partitions.is_empty()).then(|| DescribeLogDirsTopic::default().with_name(TopicName(super::str_bytes(name))).with_partitions(partitions))
            })
            .collect();
        let dir = engine.config().data_dir.clone();
        let dir = std::fs::canonicalize(&dir).unwrap_or(dir);
        let (total, usable) = match rustix::fs::statvfs(&dir) {
            Ok(s) => ((s.f_blocks.saturating_mul(s.f_frsize)) as i64, (s.f_bavail.saturating_mul(s.f_frsize)) as i64),
            Err(_) => (-1, -1),
        };
        DescribeLogDirsResult::default().with_log_dir(super::str_bytes(dir.display().to_string())).with_topics(topics).with_total_bytes(total).with_usable_bytes(usable)
    })
    .await
    .ok()?;
    Some(Response::default().with_results(vec![result]))
}
