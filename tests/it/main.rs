//! The black-box tests: one binary, so librdkafka is linked once.
//! Each module is one area; `common` holds the shared helpers.

mod common;
mod acls;
mod admin;
mod bad_input;
mod cleaning;
mod cluster;
mod cluster_support;
mod compaction;
mod compression;
mod consumer_protocol;
mod configs;
mod crash_loop;
mod crash_recovery;
mod groups;
mod group_parity;
mod fetch_sessions;
mod topic_ids;
mod hostile;
mod idempotence;
mod long_poll;
mod metrics;
mod operator;
mod oauth;
mod pipelining;
mod produce_fetch;
mod quotas;
mod records;
mod recovery;
mod rest;
mod rest_limits;
mod rest_scale;
mod security;
mod subtree;
mod tip;
mod transactions;
