//! The Kafka wire, without I/O: framing, request headers, the wire-shape
//! guard that checks every count before `kafka-protocol` decodes a body, and
//! the RecordBatch view the storage layer stores verbatim.

pub mod batch;
pub mod compression;
pub mod consumer;
pub mod fetch;
pub mod frame;
pub mod guard;
pub mod header;
pub mod produce;
pub mod response;
pub mod txn;
pub mod tagged;
