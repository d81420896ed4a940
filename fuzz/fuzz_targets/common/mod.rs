//! One in-process broker per fuzzing process: an engine over a temporary
//! data directory, the Kafka side (coordinators and all) and the REST
//! bridge, with short waits so no input parks for long.
#![allow(dead_code)]

use std::sync::{Arc, OnceLock};

use canopy::config::{Config, ServeArgs};
use canopy::engine::{system_clock, Engine};
use canopy::kafka::Broker;
use canopy::rest::Bridge;

pub struct InProcess {
    pub rt: tokio::runtime::Runtime,
    pub broker: Arc<Broker>,
    pub bridge: Arc<Bridge>,
    _dir: tempfile::TempDir,
    _stop: tokio::sync::watch::Sender<bool>,
}

pub fn broker() -> &'static InProcess {
    static ONE: OnceLock<InProcess> = OnceLock::new();
    ONE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a temporary data directory");
        let args = ServeArgs {
            data_dir: Some(dir.path().to_owned()),
            group_initial_rebalance_delay_ms: Some(0),
            max_fetch_wait_ms: Some(10),
            flush: Some("never".parse().expect("a flush policy")),
            metrics_enabled: Some(false),
            ..ServeArgs::default()
        };
        let cfg = Config::load(&args).expect("the fuzzing broker's settings");
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime");
        let (stop, stop_rx) = tokio::sync::watch::channel(false);
        let (broker, bridge) = rt.block_on(async {
            let engine = Engine::open(cfg.engine(), system_clock()).expect("the engine opens");
            let broker = canopy::server::broker(&cfg, engine.clone(), ("127.0.0.1".into(), 9092), None, system_clock(), stop_rx).await.expect("the broker starts");
            let bridge = Arc::new(Bridge::new(engine, cfg.rest().expect("REST settings"), Arc::default(), Arc::default(), broker.budget.clone()));
            (broker, bridge)
        });
        InProcess { rt, broker, bridge, _dir: dir, _stop: stop }
    })
}
