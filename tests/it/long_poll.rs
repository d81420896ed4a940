//! A fetch waiting on an empty partition returns as soon as a record is
//! produced: it is woken by the append, not by its `max_wait_ms` timer.
//!
//! The fetch asks to wait 10 minutes; the test gives up after 2. A response
//! inside that window can only come from the wake-up. This is a functional
//! bound (woken vs. timed out), not a speed threshold.

use crate::common;

use std::time::Duration;

use bytes::{Buf, BufMut, BytesMut};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{FetchRequest, FetchResponse, RequestHeader, TopicName};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use rdkafka::producer::{FutureProducer, FutureRecord};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_fetch_wakes_on_produce() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = common::args(dir.path());
    args.max_fetch_wait_ms = Some(600_000);
    let broker = common::start(args).await;
    let addr = broker.kafka_addr;
    let producer: FutureProducer = common::producer_config(addr, "all").create().unwrap();
    // Create the topic with one record so the fetch can wait at offset 1.
    producer.send(FutureRecord::to("poll.topic").partition(0).key("a").payload("first"), Duration::from_secs(30)).await.unwrap();

    let version = 12;
    let req = FetchRequest::default()
        .with_max_wait_ms(600_000)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_topics(vec![FetchTopic::default()
            .with_topic(TopicName(StrBytes::from_static_str("poll.topic")))
            .with_partitions(vec![FetchPartition::default().with_partition(0).with_fetch_offset(1).with_partition_max_bytes(1 << 20)])]);
    let mut body = BytesMut::new();
    RequestHeader::default().with_request_api_key(1).with_request_api_version(version).with_correlation_id(5).with_client_id(Some(StrBytes::from_static_str("t"))).encode(&mut body, 2).unwrap();
    req.encode(&mut body, version).unwrap();
    let mut frame = BytesMut::new();
    frame.put_i32(body.len() as i32);
    frame.extend_from_slice(&body);
    let mut sock = tokio::net::TcpStream::connect(addr).await.unwrap();
    sock.write_all(&frame).await.unwrap();

    // The fetch is parked; no response may have arrived yet.
    let mut len = [0u8; 4];
    let early = tokio::time::timeout(Duration::from_millis(300), sock.read_exact(&mut len)).await;
    assert!(early.is_err(), "fetch returned before any data was produced");

    producer.send(FutureRecord::to("poll.topic").partition(0).key("b").payload("second"), Duration::from_secs(30)).await.unwrap();
    tokio::time::timeout(Duration::from_secs(120), sock.read_exact(&mut len)).await.expect("woken by the produce, not the 10-minute timer").unwrap();
    let mut resp = vec![0u8; i32::from_be_bytes(len) as usize];
    sock.read_exact(&mut resp).await.unwrap();
    let mut buf = bytes::Bytes::from(resp);
    assert_eq!(buf.get_i32(), 5);
    let _tagged = buf.get_u8();
    let resp = FetchResponse::decode(&mut buf, version).unwrap();
    let p = &resp.responses[0].partitions[0];
    assert_eq!(p.error_code, 0);
    assert_eq!(p.high_watermark, 2);
    assert!(!p.records.as_ref().unwrap().is_empty());
    broker.shutdown().await;
}
