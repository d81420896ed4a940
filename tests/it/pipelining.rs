//! Responses leave in request order on a pipelined connection, even when
//! an earlier request (a parked fetch) finishes after later ones.

use crate::common;

use std::time::Duration;

use bytes::{Buf, BytesMut};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{FetchRequest, MetadataRequest, TopicName};
use kafka_protocol::protocol::{Encodable, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn frame(key: i16, version: i16, id: i32, body: &impl Encodable) -> Vec<u8> {
    let mut b = BytesMut::new();
    body.encode(&mut b, version).unwrap();
    common::request_frame(key, version, id, &b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_follow_request_order() {
    let dir = tempfile::tempdir().unwrap();
    let broker = common::start(common::args(dir.path())).await;
    broker.engine.create_topic("pipe.topic", 1, Default::default(), false).unwrap();

    // 1: a fetch that parks for 400 ms on an empty partition; 2..=6: quick
    // Metadata requests sent right behind it.
    let fetch = FetchRequest::default().with_max_wait_ms(400).with_min_bytes(1).with_max_bytes(1 << 20).with_topics(vec![FetchTopic::default()
        .with_topic(TopicName(StrBytes::from_static_str("pipe.topic")))
        .with_partitions(vec![FetchPartition::default().with_partition(0).with_fetch_offset(0).with_partition_max_bytes(1 << 20)])]);
    let mut wire = frame(1, 11, 1, &fetch);
    for id in 2..=6 {
        wire.extend(frame(3, 4, id, &MetadataRequest::default().with_topics(Some(vec![]))));
    }
    let mut sock = tokio::net::TcpStream::connect(broker.kafka_addr).await.unwrap();
    sock.write_all(&wire).await.unwrap();
    for want in 1..=6 {
        let mut len = [0u8; 4];
        tokio::time::timeout(Duration::from_secs(30), sock.read_exact(&mut len)).await.unwrap().unwrap();
        let mut body = vec![0u8; i32::from_be_bytes(len) as usize];
        sock.read_exact(&mut body).await.unwrap();
        assert_eq!((&body[..]).get_i32(), want, "responses in request order");
    }
    broker.shutdown().await;
}

/// Pipelined produce requests to one partition are appended in request
/// order, even when the first carries a much larger batch to validate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_produces_append_in_request_order() {
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    use kafka_protocol::messages::{ProduceRequest, ProduceResponse};
    use kafka_protocol::protocol::Decodable;

    fn batch(n: usize, size: usize) -> bytes::Bytes {
        let value = vec![b'x'; size];
        common::record_batch(&vec![&value[..]; n])
    }

    let dir = tempfile::tempdir().unwrap();
    let broker = common::start(common::args(dir.path())).await;
    broker.engine.create_topic("order.topic", 1, Default::default(), false).unwrap();
    let req = |records| {
        ProduceRequest::default().with_acks(1).with_timeout_ms(5000).with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_static_str("order.topic")))
            .with_partition_data(vec![PartitionProduceData::default().with_index(0).with_records(Some(records))])])
    };
    let mut wire = Vec::new();
    let sizes = [(800, 1000), (1, 10), (400, 1000), (1, 10)];
    for (id, (n, size)) in sizes.iter().enumerate() {
        wire.extend(frame(0, 9, id as i32 + 1, &req(batch(*n, *size))));
    }
    let mut sock = tokio::net::TcpStream::connect(broker.kafka_addr).await.unwrap();
    sock.write_all(&wire).await.unwrap();
    let mut expected = 0i64;
    for (id, (n, _)) in sizes.iter().enumerate() {
        let mut len = [0u8; 4];
        tokio::time::timeout(Duration::from_secs(30), sock.read_exact(&mut len)).await.unwrap().unwrap();
        let mut body = vec![0u8; i32::from_be_bytes(len) as usize];
        sock.read_exact(&mut body).await.unwrap();
        let mut b = bytes::Bytes::from(body);
        assert_eq!(b.get_i32(), id as i32 + 1);
        let _tags = b.get_u8();
        let r = ProduceResponse::decode(&mut b, 9).unwrap();
        let p = &r.responses[0].partition_responses[0];
        assert_eq!((p.error_code, p.base_offset), (0, expected), "request {} appended out of order", id + 1);
        expected += *n as i64;
    }
    broker.shutdown().await;
}
