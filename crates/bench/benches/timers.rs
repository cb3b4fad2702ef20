//! Timer core, side by side in one run: kafka-delay's hierarchical wheel, a binary heap
//! (`std::collections::BinaryHeap`; cancel = lazy deletion with a tombstone set) and tokio-util's
//! `DelayQueue`, at 100K, 1M and 10M pending records with random due times over an hour at 1 ms
//! resolution.
//!
//! Per record: `insert` (100K more into a structure already holding N), `cancel` (N held, 100K
//! distinct random ones cancelled), `expire` (N held, all handed out in due order: the amortized
//! cost, cascades and heap sifts included). Each sample rebuilds the structure (not timed). Then memory: a child process per structure
//! holds 10M entries and reports its resident-memory growth per entry.
//!
//! `cargo bench --bench timers` prints criterion's figures, then a table of ns per record with
//! ratios, and writes it to `$CARGO_TARGET_DIR/bench-timers.json` (or the repository's `target/`).
//! `KAFKA_DELAY_BENCH_SIZES=100000,1000000` limits the sizes.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, SamplingMode, Throughput};
use kafka_delay_core::wheel::{Handle, Wheel};
use tokio_util::time::{delay_queue, DelayQueue};

const T0: u64 = 1_763_700_000_000;
const HOUR_MS: u64 = 3_600_000;
/// Operations timed per sample.
const OPS: usize = 100_000;
/// Entries held by the memory children.
const MEMORY_ENTRIES: usize = 10_000_000;

/// SplitMix64: a reproducible random sequence without a dependency.
fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// `n` due times, uniformly random over the hour after `T0`, 1 ms resolution, never at `T0`.
fn dues(n: usize, seed: u64) -> Vec<u64> {
    (0..n as u64)
        .map(|i| T0 + 1 + splitmix(seed ^ i) % HOUR_MS)
        .collect()
}

/// One timer structure under test.
trait Timers: Sized {
    const NAME: &'static str;
    type Handle: Copy;
    fn new() -> Self;
    fn insert(&mut self, due: u64, id: u64) -> Self::Handle;
    fn cancel(&mut self, handle: Self::Handle);
    /// Hands out everything due at or before `now`; returns how many.
    fn expire(&mut self, now: u64) -> usize;
}

struct OurWheel(Wheel<u64>);

impl Timers for OurWheel {
    const NAME: &'static str = "wheel";
    type Handle = Handle;
    fn new() -> Self {
        OurWheel(Wheel::new(T0))
    }
    fn insert(&mut self, due: u64, id: u64) -> Handle {
        self.0.insert(due, id).expect("due after T0")
    }
    fn cancel(&mut self, handle: Handle) {
        std::hint::black_box(self.0.cancel(handle));
    }
    fn expire(&mut self, now: u64) -> usize {
        let mut n = 0;
        while let Some(e) = self.0.poll(now) {
            std::hint::black_box(e);
            n += 1;
        }
        n
    }
}

/// A min-heap of `(due, id)`; cancel records the id in a tombstone set, expire skips those.
struct Heap {
    heap: BinaryHeap<Reverse<(u64, u64)>>,
    tombstones: HashSet<u64>,
}

impl Timers for Heap {
    const NAME: &'static str = "binary_heap";
    type Handle = u64;
    fn new() -> Self {
        Heap {
            heap: BinaryHeap::new(),
            tombstones: HashSet::new(),
        }
    }
    fn insert(&mut self, due: u64, id: u64) -> u64 {
        self.heap.push(Reverse((due, id)));
        id
    }
    fn cancel(&mut self, id: u64) {
        self.tombstones.insert(id);
    }
    fn expire(&mut self, now: u64) -> usize {
        let mut n = 0;
        while let Some(&Reverse((due, id))) = self.heap.peek() {
            if due > now {
                break;
            }
            self.heap.pop();
            if !self.tombstones.is_empty() && self.tombstones.remove(&id) {
                continue;
            }
            std::hint::black_box((due, id));
            n += 1;
        }
        n
    }
}

/// tokio-util's `DelayQueue` on a paused current-thread runtime, so that time moves only when
/// the benchmark says so.
struct Queue {
    rt: tokio::runtime::Runtime,
    queue: DelayQueue<u64>,
    base: tokio::time::Instant,
}

impl Queue {
    fn at(&self, due: u64) -> tokio::time::Instant {
        self.base + Duration::from_millis(due - T0)
    }
}

impl Timers for Queue {
    const NAME: &'static str = "delay_queue";
    type Handle = delay_queue::Key;
    fn new() -> Self {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .expect("runtime");
        let base = rt.block_on(async { tokio::time::Instant::now() });
        Queue {
            rt,
            queue: DelayQueue::new(),
            base,
        }
    }
    fn insert(&mut self, due: u64, id: u64) -> delay_queue::Key {
        let at = self.at(due);
        let _guard = self.rt.enter();
        self.queue.insert_at(id, at)
    }
    fn cancel(&mut self, key: delay_queue::Key) {
        let _guard = self.rt.enter();
        std::hint::black_box(self.queue.try_remove(&key));
    }
    fn expire(&mut self, now: u64) -> usize {
        let target = self.at(now);
        let queue = &mut self.queue;
        self.rt.block_on(async move {
            let wait = target.saturating_duration_since(tokio::time::Instant::now());
            tokio::time::advance(wait).await;
            let mut n = 0;
            loop {
                let pending = std::future::poll_fn(|cx: &mut Context<'_>| loop {
                    match queue.poll_expired(cx) {
                        Poll::Ready(Some(e)) => {
                            std::hint::black_box(e.into_inner());
                            n += 1;
                        }
                        Poll::Ready(None) => return Poll::Ready(false),
                        Poll::Pending => return Poll::Ready(true),
                    }
                })
                .await;
                if !pending || queue.peek().is_none() {
                    return n;
                }
                // The queue waits on tokio's timer driver even for deadlines already passed:
                // let the (paused) runtime turn it.
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    }
}

/// Nanoseconds per record of every sample, by (structure, operation, size).
static SAMPLES: Mutex<Vec<(&'static str, &'static str, usize, f64)>> = Mutex::new(Vec::new());

fn record(structure: &'static str, op: &'static str, n: usize, took: Duration, ops: usize) {
    let per = took.as_nanos() as f64 / ops as f64;
    SAMPLES.lock().unwrap().push((structure, op, n, per));
}

/// Builds a structure holding `n` entries (not timed) and returns it with their handles.
fn filled<T: Timers>(n: usize) -> (T, Vec<T::Handle>, Vec<u64>) {
    let d = dues(n, 1);
    let mut t = T::new();
    let handles = d
        .iter()
        .enumerate()
        .map(|(i, &due)| t.insert(due, i as u64))
        .collect();
    (t, handles, d)
}

/// Operations timed by `op` at size `n`.
fn ops(op: &str, n: usize) -> usize {
    match op {
        "expire" => n,
        _ => OPS.min(n),
    }
}

fn time_insert<T: Timers>(n: usize) -> Duration {
    let (mut t, _, _) = filled::<T>(n);
    let extra = dues(OPS, 2);
    let start = Instant::now();
    for (i, &due) in extra.iter().enumerate() {
        std::hint::black_box(t.insert(due, (n + i) as u64));
    }
    let took = start.elapsed();
    drop(t);
    took
}

fn time_cancel<T: Timers>(n: usize) -> Duration {
    let (mut t, mut handles, _) = filled::<T>(n);
    // A random sample without repeats (Fisher-Yates on the first OPS positions).
    let k = OPS.min(n);
    for i in 0..k {
        let j = i + (splitmix(i as u64 ^ 3) % (n - i) as u64) as usize;
        handles.swap(i, j);
    }
    let start = Instant::now();
    for &h in &handles[..k] {
        t.cancel(h);
    }
    start.elapsed()
}

/// Hands out every entry, in due order: the amortized cost per record, cascades included.
fn time_expire<T: Timers>(n: usize) -> Duration {
    let (mut t, _, d) = filled::<T>(n);
    let last = d.iter().copied().max().unwrap_or(T0);
    let start = Instant::now();
    let got = t.expire(last);
    let took = start.elapsed();
    assert_eq!(got, n, "expired");
    took
}

fn bench_structure<T: Timers>(c: &mut Criterion, sizes: &[usize]) {
    for (op, f) in [
        ("insert", time_insert::<T> as fn(usize) -> Duration),
        ("cancel", time_cancel::<T>),
        ("expire", time_expire::<T>),
    ] {
        let mut g = c.benchmark_group(format!("{}/{op}", T::NAME));
        g.sampling_mode(SamplingMode::Flat)
            .sample_size(10)
            .warm_up_time(Duration::from_millis(1))
            .measurement_time(Duration::from_millis(1));
        for &n in sizes {
            g.throughput(Throughput::Elements(ops(op, n) as u64));
            g.bench_function(BenchmarkId::from_parameter(n), |b| {
                b.iter_custom(|iters| {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        let took = f(n);
                        record(T::NAME, op, n, took, ops(op, n));
                        total += took;
                    }
                    total
                })
            });
        }
        g.finish();
    }
}

/// Resident memory of this process, bytes.
fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// In a child process: holds `MEMORY_ENTRIES` entries in one structure and prints the resident
/// memory growth per entry (handles are not kept: the broker keeps none).
fn memory_child(structure: &str) {
    let d = dues(MEMORY_ENTRIES, 1);
    let before = rss_bytes();
    let per = match structure {
        "wheel" => grow::<OurWheel>(&d, before),
        "binary_heap" => grow::<Heap>(&d, before),
        "delay_queue" => grow::<Queue>(&d, before),
        other => panic!("unknown structure {other}"),
    };
    println!("{per:.1}");
}

fn grow<T: Timers>(d: &[u64], before: u64) -> f64 {
    let mut t = T::new();
    for (i, &due) in d.iter().enumerate() {
        std::hint::black_box(t.insert(due, i as u64));
    }
    let after = rss_bytes();
    std::hint::black_box(&t);
    (after.saturating_sub(before)) as f64 / d.len() as f64
}

fn memory_per_entry(structure: &str) -> Option<f64> {
    let out = std::process::Command::new(std::env::current_exe().ok()?)
        .env("KAFKA_DELAY_BENCH_MEMORY", structure)
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout).trim().parse().ok()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn report(sizes: &[usize]) {
    let samples = SAMPLES.lock().unwrap().clone();
    let mut m: HashMap<(&str, &str, usize), f64> = HashMap::new();
    for op in ["insert", "cancel", "expire"] {
        for s in ["wheel", "binary_heap", "delay_queue"] {
            for &n in sizes {
                let v: Vec<f64> = samples
                    .iter()
                    .filter(|x| x.0 == s && x.1 == op && x.2 == n)
                    .map(|x| x.3)
                    .collect();
                if !v.is_empty() {
                    m.insert((s, op, n), median(v));
                }
            }
        }
    }
    println!("\nns per record (median of 10 samples; insert and cancel: {OPS} operations, expire: all N)\n");
    println!("| op | N | wheel | binary heap | DelayQueue | heap / wheel | DelayQueue / wheel |");
    println!("|---|---|---|---|---|---|---|");
    let mut rows = Vec::new();
    for op in ["insert", "cancel", "expire"] {
        for &n in sizes {
            let w = m.get(&("wheel", op, n)).copied().unwrap_or(f64::NAN);
            let h = m.get(&("binary_heap", op, n)).copied().unwrap_or(f64::NAN);
            let q = m.get(&("delay_queue", op, n)).copied().unwrap_or(f64::NAN);
            println!(
                "| {op} | {n} | {w:.1} | {h:.1} | {q:.1} | {:.1}x | {:.1}x |",
                h / w,
                q / w
            );
            rows.push(serde_json::json!({
                "op": op, "n": n, "wheel_ns": w, "binary_heap_ns": h, "delay_queue_ns": q,
            }));
        }
    }
    let (small, large) = (sizes[0], sizes[sizes.len() - 1]);
    println!("\ngrowth of the cost from N={small} to N={large} (ratio of ns per record)\n");
    println!("| op | wheel | binary heap | DelayQueue |");
    println!("|---|---|---|---|");
    for op in ["insert", "cancel", "expire"] {
        let g = |s| {
            m.get(&(s, op, large)).unwrap_or(&f64::NAN)
                / m.get(&(s, op, small)).unwrap_or(&f64::NAN)
        };
        println!(
            "| {op} | {:.2}x | {:.2}x | {:.2}x |",
            g("wheel"),
            g("binary_heap"),
            g("delay_queue")
        );
    }
    let mut memory = serde_json::Map::new();
    println!("\nresident memory per pending entry, {MEMORY_ENTRIES} entries (child processes)\n");
    println!("| structure | bytes per entry |");
    println!("|---|---|");
    for s in ["wheel", "binary_heap", "delay_queue"] {
        let b = memory_per_entry(s);
        println!(
            "| {s} | {} |",
            b.map_or("failed".into(), |b| format!("{b:.1}"))
        );
        memory.insert(s.into(), serde_json::json!(b));
    }
    let dir = std::env::var("CARGO_TARGET_DIR")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../../target").into());
    let path = std::path::Path::new(&dir).join("bench-timers.json");
    let json = serde_json::json!({ "ops_per_sample": OPS, "per_record": rows, "memory_bytes_per_entry": memory });
    match std::fs::write(&path, serde_json::to_string_pretty(&json).unwrap()) {
        Ok(()) => println!("\nwritten to {}", path.display()),
        Err(e) => println!("\ncould not write {}: {e}", path.display()),
    }
}

fn main() {
    if let Ok(structure) = std::env::var("KAFKA_DELAY_BENCH_MEMORY") {
        memory_child(&structure);
        return;
    }
    // `cargo test --all-targets` runs this once without `--bench` as a smoke test: small sizes
    // and no report then.
    let benching = std::env::args().any(|a| a == "--bench");
    let sizes: Vec<usize> = match std::env::var("KAFKA_DELAY_BENCH_SIZES") {
        _ if !benching => vec![10_000],
        Ok(s) => s.split(',').filter_map(|n| n.trim().parse().ok()).collect(),
        Err(_) => vec![100_000, 1_000_000, 10_000_000],
    };
    let mut c = Criterion::default().configure_from_args();
    bench_structure::<OurWheel>(&mut c, &sizes);
    bench_structure::<Heap>(&mut c, &sizes);
    bench_structure::<Queue>(&mut c, &sizes);
    c.final_summary();
    if benching {
        report(&sizes);
    }
}
