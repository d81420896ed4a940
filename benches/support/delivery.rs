//! A librdkafka producer context that counts delivery reports: how many
//! records were acknowledged and how many failed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use rdkafka::message::DeliveryResult;
use rdkafka::producer::ProducerContext;
use rdkafka::ClientContext;

#[derive(Default)]
pub struct Counter {
    pub ok: AtomicU64,
    pub failed: AtomicU64,
}

#[derive(Clone)]
pub struct Ctx(pub Arc<Counter>);

impl ClientContext for Ctx {}
impl ProducerContext for Ctx {
    type DeliveryOpaque = ();
    fn delivery(&self, r: &DeliveryResult<'_>, _: ()) {
        match r {
            Ok(_) => self.0.ok.fetch_add(1, Ordering::Relaxed),
            Err(_) => self.0.failed.fetch_add(1, Ordering::Relaxed),
        };
    }
}
