//! Links to other nodes over the inter-broker listener (TCP, or TLS with
//! both sides' certificates when it is SSL): the follower's fetcher uses
//! one per leader, and the [`Forwarder`] one per leader it sends produces
//! to (the REST bridge's records for partitions another node leads,
//! docs/cluster.md "REST").

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{ProduceRequest, RequestHeader, TopicName};
use kafka_protocol::protocol::{Encodable, StrBytes};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

use crate::kafka::Broker;
use crate::protocol::produce::{decode_response, PartitionAck, VERSION};

/// A connection to a leader: TCP, or TLS on an SSL inter-broker listener.
pub trait Link: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Link for T {}
pub type Conn = Box<dyn Link>;

/// Connects to `leader`'s inter-broker listener (its endpoint of that
/// name in its registration); over TLS when the listener is SSL, showing
/// this node's certificate and checking the leader's against the CA.
pub async fn connect(broker: &Broker, leader: i32) -> Result<Conn, String> {
    const WITHIN: Duration = Duration::from_secs(5);
    let inter = &broker.cfg.inter_broker;
    let e = {
        let view = broker.cluster.view();
        let node = view.nodes.get(&leader).ok_or("the leader is not registered")?;
        node.endpoints.iter().find(|e| e.listener == inter.listener).cloned().ok_or_else(|| format!("the leader registered no listener named {}", inter.listener))?
    };
    let tcp = match tokio::time::timeout(WITHIN, TcpStream::connect((e.host.as_str(), e.port as u16))).await {
        Ok(Ok(s)) => s,
        Ok(Err(err)) => return Err(format!("connecting to {}:{}: {err}", e.host, e.port)),
        Err(_) => return Err(format!("connecting to {}:{} timed out", e.host, e.port)),
    };
    let _ = tcp.set_nodelay(true);
    let Some(files) = inter.tls.clone() else { return Ok(Box::new(tcp)) };
    // Read at every connection, so renewed certificates are taken.
    let cfg = match tokio::task::spawn_blocking(move || crate::tls::client_config(&files)).await {
        Ok(Ok(cfg)) => cfg,
        Ok(Err(err)) => return Err(format!("this node's TLS files: {err:#}")),
        Err(err) => return Err(err.to_string()),
    };
    let name = rustls_pki_types::ServerName::try_from(e.host.clone()).map_err(|err| format!("{:?} is no TLS server name: {err}", e.host))?;
    match tokio::time::timeout(WITHIN, tokio_rustls::TlsConnector::from(cfg).connect(name, tcp)).await {
        Ok(Ok(s)) => Ok(Box::new(s)),
        Ok(Err(err)) => Err(format!("TLS with {}:{}: {err}", e.host, e.port)),
        Err(_) => Err(format!("TLS with {}:{} timed out", e.host, e.port)),
    }
}

/// How long a forwarded produce may take, answer included (Kafka's
/// default `request.timeout.ms`).
pub const FORWARD_WITHIN: Duration = Duration::from_secs(30);
/// The largest Produce answer taken from a leader (answers are small: a few
/// dozen bytes per partition).
const MAX_ANSWER_BYTES: usize = 1 << 20;
/// Produces queued for one leader's link before senders wait.
const QUEUE: usize = 256;

/// Why a forwarded produce has no answer: the records may or may not be
/// in the leader's log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("forwarding to broker {leader}: {why}")]
pub struct ForwardError {
    pub leader: i32,
    pub why: String,
}

/// Sends requests to other nodes, one pipelined link per (node, [`Lane`])
/// (requests written as they come, answers matched in order, as Kafka
/// answers a connection's requests). A link that fails fails every
/// request it carries and is made again by the next.
pub struct Forwarder {
    broker: std::sync::Weak<Broker>,
    links: Mutex<HashMap<(i32, Lane), mpsc::Sender<Job>>>,
    /// What the metrics show (`canopy_rest_forwarded_*`).
    pub stats: ForwardStats,
}

/// What a link carries. A node answers a connection's requests one at a
/// time, so kinds that could wait on each other get links of their own:
/// a coordinator's AddPartitionsToTxn answer may wait on a transactional
/// id's lock held by an end whose markers are on their way, and those
/// markers must not queue behind it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lane {
    /// The REST bridge's forwarded produces.
    Produce,
    /// Transaction markers to partition leaders (WriteTxnMarkers).
    Markers,
    /// A partition leader asking a transaction's coordinator
    /// (AddPartitionsToTxn).
    Coordinator,
}

/// The forwarder's counters (the REST bridge's produces).
#[derive(Default)]
pub struct ForwardStats {
    /// Produces a leader answered (its refusals of partitions included).
    pub answered: std::sync::atomic::AtomicU64,
    /// Produces with no answer: the link failed, or no answer in time.
    pub failed: std::sync::atomic::AtomicU64,
    /// Record bytes sent in forwarded produces.
    pub bytes: std::sync::atomic::AtomicU64,
}

impl ForwardStats {
    fn count(&self, outcome: &Result<Vec<PartitionAck>, ForwardError>) {
        let c = if outcome.is_ok() { &self.answered } else { &self.failed };
        c.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// One request for a link: its frame (correlation id patched in by the
/// link) and where its answer goes.
struct Job {
    frame: BytesMut,
    reply: oneshot::Sender<Result<Bytes, String>>,
}

type Pending = Arc<Mutex<VecDeque<(i32, oneshot::Sender<Result<Bytes, String>>)>>>;

impl Forwarder {
    pub fn new(broker: &Arc<Broker>) -> Forwarder {
        Forwarder { broker: Arc::downgrade(broker), links: Mutex::new(HashMap::new()), stats: ForwardStats::default() }
    }

    /// Links of `lane` open now (each made at its first request, gone
    /// when it fails until the next).
    pub fn links(&self, lane: Lane) -> usize {
        self.links.lock().expect("links lock").iter().filter(|((_, l), tx)| *l == lane && !tx.is_closed()).count()
    }

    /// Produces `parts` ((partition, record batches)) of `topic` at
    /// `leader` with `acks` (-1 or 1), as this node (its inter-broker
    /// principal); the leader's answer per partition, in the order asked.
    pub async fn produce(&self, leader: i32, topic: &str, parts: Vec<(i32, Bytes)>, acks: i16) -> Result<Vec<PartitionAck>, ForwardError> {
        let bytes: usize = parts.iter().map(|(_, b)| b.len()).sum();
        let outcome = self.send(leader, topic, parts, acks).await;
        self.stats.count(&outcome);
        self.stats.bytes.fetch_add(bytes as u64, std::sync::atomic::Ordering::Relaxed);
        outcome
    }

    async fn send(&self, leader: i32, topic: &str, parts: Vec<(i32, Bytes)>, acks: i16) -> Result<Vec<PartitionAck>, ForwardError> {
        let fail = |why: String| ForwardError { leader, why };
        let asked: Vec<i32> = parts.iter().map(|(p, _)| *p).collect();
        let data = parts.into_iter().map(|(p, records)| PartitionProduceData::default().with_index(p).with_records(Some(records))).collect();
        let req = ProduceRequest::default()
            .with_acks(acks)
            .with_timeout_ms(FORWARD_WITHIN.as_millis() as i32)
            .with_transactional_id(None)
            .with_topic_data(vec![TopicProduceData::default().with_name(TopicName(StrBytes::from_string(topic.to_owned()))).with_partition_data(data)]);
        let body = self.call(leader, Lane::Produce, kafka_protocol::messages::ApiKey::Produce, VERSION, &req).await?;
        let a = decode_response(&body).map_err(|e| fail(format!("the answer does not decode: {e}")))?;
        // One answer per partition asked, by name and index.
        let mut acks = Vec::with_capacity(asked.len());
        for p in asked {
            let got = a.topics.iter().filter(|(name, _)| name.as_ref() == topic.as_bytes()).flat_map(|(_, ps)| ps).find(|ack| ack.partition == p);
            acks.push(got.cloned().ok_or_else(|| fail(format!("the answer has no partition {p}")))?);
        }
        Ok(acks)
    }

    /// Sends `req` (API `api`, flexible version `version`: request header
    /// v2) to node `node` over its link for `lane`, as this node (its inter-broker
    /// principal), and returns the answer's bytes from its correlation id
    /// on, for a checked decoder (never `kafka-protocol`'s: see
    /// `protocol::response`). Answers wait at most [`FORWARD_WITHIN`] and
    /// a little.
    pub async fn call<R: Encodable>(&self, node: i32, lane: Lane, api: kafka_protocol::messages::ApiKey, version: i16, req: &R) -> Result<Bytes, ForwardError> {
        let fail = |why: String| ForwardError { leader: node, why };
        let broker = self.broker.upgrade().ok_or_else(|| fail("the broker is stopping".into()))?;
        let header = RequestHeader::default()
            .with_request_api_key(api as i16)
            .with_request_api_version(version)
            .with_client_id(Some(StrBytes::from_string(format!("canopy-forward-{}", broker.node_id()))));
        let mut frame = BytesMut::with_capacity(64 + req.compute_size(version).unwrap_or(0));
        frame.extend_from_slice(&[0; 4]);
        header.encode(&mut frame, 2).map_err(|e| fail(e.to_string()))?;
        req.encode(&mut frame, version).map_err(|e| fail(e.to_string()))?;
        let len = (frame.len() - 4) as i32;
        frame[..4].copy_from_slice(&len.to_be_bytes());
        let (reply, answer) = oneshot::channel();
        let link = self.link(&broker, node, lane);
        drop(broker);
        link.send(Job { frame, reply }).await.map_err(|_| fail("the link stopped".into()))?;
        match tokio::time::timeout(FORWARD_WITHIN + Duration::from_secs(5), answer).await {
            Ok(Ok(Ok(body))) => Ok(body),
            Ok(Ok(Err(why))) => Err(fail(why)),
            Ok(Err(_)) => Err(fail("the link stopped".into())),
            Err(_) => Err(fail("no answer in time".into())),
        }
    }

    fn link(&self, broker: &Arc<Broker>, node: i32, lane: Lane) -> mpsc::Sender<Job> {
        let mut links = self.links.lock().expect("links lock");
        if let Some(tx) = links.get(&(node, lane)).filter(|tx| !tx.is_closed()) {
            return tx.clone();
        }
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(run_link(Arc::downgrade(broker), node, rx));
        links.insert((node, lane), tx.clone());
        tx
    }
}

/// A leader's link: connects when a request comes, writes requests as they
/// come, and hands answers back in order. Ends when the forwarder goes.
async fn run_link(broker: std::sync::Weak<Broker>, leader: i32, mut rx: mpsc::Receiver<Job>) {
    let mut correlation = 0i32;
    while let Some(first) = rx.recv().await {
        let Some(b) = broker.upgrade() else { return };
        let conn = match tokio::time::timeout(FORWARD_WITHIN, connect(&b, leader)).await {
            Ok(Ok(c)) => c,
            Ok(Err(why)) => {
                let _ = first.reply.send(Err(why));
                continue;
            }
            Err(_) => {
                let _ = first.reply.send(Err("connecting timed out".into()));
                continue;
            }
        };
        drop(b);
        let (rd, mut wr) = tokio::io::split(conn);
        let pending: Pending = Arc::default();
        let (dead_tx, mut dead) = oneshot::channel::<String>();
        let reader = tokio::spawn(read_answers(rd, pending.clone(), dead_tx));
        let mut next = Some(first);
        let why = loop {
            let mut job = match next.take() {
                Some(j) => j,
                None => tokio::select! {
                    j = rx.recv() => match j {
                        Some(j) => j,
                        None => {
                            reader.abort();
                            return;
                        }
                    },
                    why = &mut dead => break why.unwrap_or_else(|_| "the connection closed".into()),
                },
            };
            correlation = correlation.wrapping_add(1);
            job.frame[8..12].copy_from_slice(&correlation.to_be_bytes());
            pending.lock().expect("pending lock").push_back((correlation, job.reply));
            if let Err(e) = wr.write_all(&job.frame).await {
                break e.to_string();
            }
        };
        reader.abort();
        for (_, reply) in pending.lock().expect("pending lock").drain(..) {
            let _ = reply.send(Err(why.clone()));
        }
    }
}

/// Reads answers off a link and hands each to the oldest request waiting;
/// on an error, says why (the writer then fails every request waiting).
async fn read_answers(mut rd: tokio::io::ReadHalf<Conn>, pending: Pending, dead: oneshot::Sender<String>) {
    let why = loop {
        let len = match rd.read_i32().await {
            Ok(l) => l,
            Err(e) => break e.to_string(),
        };
        let Some(len) = usize::try_from(len).ok().filter(|l| (4..=MAX_ANSWER_BYTES).contains(l)) else { break format!("an answer of {len} bytes") };
        let mut body = vec![0; len];
        if let Err(e) = rd.read_exact(&mut body).await {
            break e.to_string();
        }
        let id = i32::from_be_bytes(body[..4].try_into().expect("4 bytes"));
        let Some((want, reply)) = pending.lock().expect("pending lock").pop_front() else { break format!("answer {id} to no request") };
        if id != want {
            let _ = reply.send(Err(format!("answer {id} to request {want}")));
            break format!("answer {id} to request {want}");
        }
        let _ = reply.send(Ok(Bytes::from(body)));
    };
    let _ = dead.send(why);
}
