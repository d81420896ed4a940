//! Responses leave in request order on a pipelined connection, even when
//! an earlier request (a parked fetch) finishes after later ones.

mod common;

use std::time::Duration;

use bytes::{Buf, BufMut, BytesMut};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{FetchRequest, MetadataRequest, RequestHeader, TopicName};
use kafka_protocol::protocol::{Encodable, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn frame(key: i16, version: i16, id: i32, body: &impl Encodable, header_version: i16) -> Vec<u8> {
    let mut b = BytesMut::new();
    RequestHeader::default()
        .with_request_api_key(key)
        .with_request_api_version(version)
        .with_correlation_id(id)
        .with_client_id(Some(StrBytes::from_static_str("pipeline")))
        .encode(&mut b, header_version)
        .unwrap();
    body.encode(&mut b, version).unwrap();
    let mut out = Vec::new();
    out.put_i32(b.len() as i32);
    out.extend_from_slice(&b);
    out
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
    let mut wire = frame(1, 11, 1, &fetch, 1);
    for id in 2..=6 {
        wire.extend(frame(3, 4, id, &MetadataRequest::default().with_topics(Some(vec![])), 1));
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
