//! The simulator's long mode: many seeds, one seed replayed, or a planted
//! bug hunted (see `canopy::sim`).
//!
//! ```text
//! canopy-sim --seeds 1000000            # seeds 0..N (or --from S)
//! canopy-sim --seed 1234                # replay one seed
//! canopy-sim --plant skip-fsync --seeds 10000   # the first seed that finds it
//! canopy-sim --plant skip-fsync --seeds 1000 --count  # how many of them find it
//! ```

use std::process::ExitCode;
use std::time::Instant;

use canopy::sim::{self, Plant, SimConfig};

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let (mut from, mut seeds, mut steps, mut plant, mut one, mut count, mut trace) = (0u64, 1000u64, SimConfig::default().steps, None, None, false, false);
    while let Some(a) = args.next() {
        let mut value = |what: &str| args.next().unwrap_or_else(|| panic!("{what} needs a value"));
        match a.as_str() {
            "--seeds" => seeds = value("--seeds").parse().expect("--seeds N"),
            "--from" => from = value("--from").parse().expect("--from S"),
            "--seed" => one = Some(value("--seed").parse::<u64>().expect("--seed S")),
            "--steps" => steps = value("--steps").parse().expect("--steps N"),
            "--plant" => {
                let name = value("--plant");
                plant = Some(Plant::parse(&name).unwrap_or_else(|| {
                    let names: Vec<&str> = Plant::ALL.iter().map(|(n, _)| *n).collect();
                    panic!("unknown bug {name}: one of {names:?}")
                }));
            }
            "--count" => count = true,
            "--trace" => trace = true,
            "-h" | "--help" => {
                println!("canopy-sim [--seeds N] [--from S] [--seed S] [--steps N] [--plant BUG [--count]] [--trace]");
                return ExitCode::SUCCESS;
            }
            other => panic!("unknown argument {other}"),
        }
    }
    if trace {
        // Storage's own log lines (truncations, deletions) beside the steps.
        tracing_subscriber::fmt().with_writer(std::io::stderr).with_target(false).without_time().init();
    }
    let cfg = SimConfig { steps, plant, trace };
    let range = match one {
        Some(s) => s..s + 1,
        None => from..from + seeds,
    };
    let started = Instant::now();
    if count {
        let n = range.end - range.start;
        let found = range.filter(|&seed| sim::run(seed, cfg).is_err()).count();
        println!("{found} of {n} seeds find the planted bug ({:.1} s)", started.elapsed().as_secs_f64());
        return ExitCode::SUCCESS;
    }
    let mut runs = 0u64;
    // Every seed's disk history folded together (`Outcome::add`): two
    // processes that ran the same seeds print the same digest, or a seed
    // did not replay exactly.
    let mut total = sim::Outcome::default();
    for seed in range {
        match sim::run(seed, cfg) {
            Ok(o) => {
                runs += 1;
                total.add(&o);
            }
            Err(f) => {
                println!("{f}");
                if plant.is_some() {
                    println!("planted bug found by seed {seed}, after {runs} clean seeds, in {:.1} s", started.elapsed().as_secs_f64());
                    return ExitCode::SUCCESS;
                }
                return ExitCode::FAILURE;
            }
        }
        if runs % 10_000 == 0 {
            eprintln!("{runs} seeds, {:.0} s", started.elapsed().as_secs_f64());
        }
    }
    let t = &total;
    println!(
        "{runs} seeds passed: {} steps, {} batches acknowledged, {} crashes, {} disk faults and {} catalog failures injected, {} idempotent batches appended and {} answered to their producers ({} new epochs after UNKNOWN_PRODUCER_ID), {} transactional batches appended, {} transactions committed and {} aborted, {} batches refused to a transaction, {} placed as a follower's copy and {} placed below the log end and refused, {} leader epochs begun and {} stale epochs refused, {} truncations made and {} refused, {} retention and compaction calls with the writer working inside, {} segments recovered from index files and {} by walking, history digest {:016x}, {:.1} s",
        t.steps, t.acked, t.crashes, t.disk.faults, t.catalog_faults, t.idempotent_appends, t.producer_answers, t.producer_epochs, t.txn_batches, t.txn_commits, t.txn_aborts, t.txn_refusals, t.placed_appends, t.misplaced_refusals, t.epochs_begun, t.stale_epoch_refusals, t.truncations, t.refused_truncations, t.interleaved, t.indexed_segments, t.walked_segments, t.disk.history,
        started.elapsed().as_secs_f64()
    );
    if plant.is_some() {
        println!("the planted bug was not found");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
