//! Canopy: a Kafka-compatible ingestion broker with hierarchical topics.
//! See DESIGN.md (shared) for the words, layers and invariants.

pub mod auth;
pub mod cluster;
pub mod config;
pub mod engine;
pub mod kafka;
pub mod limits;
pub mod meta;
pub mod metrics;
pub mod probe;
pub mod protocol;
pub mod rest;
pub mod server;
pub mod sim;
pub mod storage;
pub mod tls;
