//! A small pool of threads for CPU-heavy request work: inflating and
//! recompressing produced batches, inflating REST bodies. It keeps that work
//! off tokio's async workers, so one client's heavy batches cannot stop the
//! broker from answering anyone else (on two cores, two connections
//! sending batches that inflate to the cap used to occupy both workers).
//!
//! Jobs wait in one short FIFO queue; a submitter that finds it full
//! waits (asynchronously) for room, and a job whose submitter has gone is
//! skipped. A connection's requests run one at a time (Produce requests
//! may overlap, each validating its partitions in turn), so the queue
//! serves connections about in turn and a heavy client gets its share, not
//! the pool. Threads: `validation_threads` (0: one per core).
//!
//! Rejected: tokio's `spawn_blocking` (up to 512 threads: heavy work from
//! many clients at once would still take every core), and inline work on
//! the async workers (what caused the stalls).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot};

type Job = Box<dyn FnOnce() + Send>;

/// Jobs that may wait for a thread, per thread: a submitter that finds
/// the queue full waits with its bytes still counted against the request
/// budget; a queued job's bytes are not, so the queue is short.
const QUEUE_PER_THREAD: usize = 4;

#[derive(Debug)]
pub struct CpuPool {
    tx: mpsc::Sender<Job>,
    threads: usize,
    /// Jobs queued or running.
    pending: Arc<AtomicUsize>,
}

impl CpuPool {
    /// Starts `threads` threads (0: one per core). They end when the pool
    /// is dropped, after the jobs already queued.
    pub fn new(threads: usize) -> CpuPool {
        let threads = if threads == 0 { std::thread::available_parallelism().map_or(2, |n| n.get()) } else { threads };
        let (tx, rx) = mpsc::channel::<Job>(threads * QUEUE_PER_THREAD);
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..threads {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("canopy-cpu-{i}"))
                .spawn(move || loop {
                    // One thread waits on the queue at a time; the others
                    // wait for it to take a job.
                    let job = rx.lock().expect("cpu pool queue lock").blocking_recv();
                    match job {
                        Some(job) => job(),
                        None => return,
                    }
                })
                .expect("spawn a cpu pool thread");
        }
        CpuPool { tx, threads, pending: Arc::new(AtomicUsize::new(0)) }
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Jobs queued or running now.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::Relaxed)
    }

    /// Runs `f` on a pool thread and returns its result; `None` if the pool
    /// is gone (shutdown) or `f` panicked.
    pub async fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
        let (reply, rx) = oneshot::channel();
        let counted = Counted::new(&self.pending);
        let job: Job = Box::new(move || {
            // Whoever asked is gone (its request was cancelled): skip it.
            if reply.is_closed() {
                return;
            }
            let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
            // Done before the answer is seen.
            drop(counted);
            if let Ok(out) = out {
                let _ = reply.send(out);
            }
        });
        self.tx.send(job).await.ok()?;
        rx.await.ok()
    }
}

/// One job in `pending` until it has run or was dropped unrun.
struct Counted(Arc<AtomicUsize>);

impl Counted {
    fn new(pending: &Arc<AtomicUsize>) -> Counted {
        pending.fetch_add(1, Ordering::Relaxed);
        Counted(pending.clone())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn jobs_run_off_the_caller_and_panics_are_contained() {
        let pool = CpuPool::new(2);
        assert_eq!(pool.threads(), 2);
        let here = std::thread::current().id();
        let there = pool.run(|| std::thread::current().id()).await.unwrap();
        assert_ne!(here, there);
        assert_eq!(pool.run(|| -> u8 { panic!("boom") }).await, None);
        // The pool still works after a job panicked.
        let mut sum = 0;
        for i in 0..50 {
            sum += pool.run(move || i * 2).await.unwrap();
        }
        assert_eq!(sum, (0..50).map(|i| i * 2).sum::<i32>());
        assert_eq!(pool.pending(), 0);
    }
}
