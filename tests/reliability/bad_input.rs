//! Bad input: a flood of malformed records among valid ones, and secrets kept out of logs.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_bad_input_is_dead_lettered_exactly_and_valid_records_are_unaffected() {
    let total = env_u64("KAFKA_DELAY_BAD_INPUT_RECORDS", 30_000, 1_000_000) as usize;
    let same_ms = total / 10;
    // Several partitions each: librdkafka's mock cluster finds a fetch offset by walking the
    // partition's message sets, so one partition of 100K+ records slows the mock, not us.
    const PARTS: i32 = 8;
    let kafka = Kafka::start();
    let t = Topics::new();
    kafka.create_topic(&t.delay, PARTS).await;
    kafka.create_topic(&t.target, PARTS).await;
    kafka.create_topic(&t.dlt, PARTS).await;
    let data = TempDir::new().unwrap();
    let flags = [
        "--target-allow",
        "^(out|probe)-",
        "--max-record-bytes",
        "4000",
    ];
    let broker = start(config(&kafka, &t, &data, &flags)).await;
    let probe = format!("probe-{}", t.id);
    kafka.create_topic(&probe, 1).await;
    wait_consuming(&kafka, &t, &probe).await;
    let (kafka, t) = (&kafka, &t);
    let due_ok = (now_ms() + 3_000).to_string();
    let same = (now_ms() + 4_000).to_string();
    let bad = malformed(t, &due_ok);
    let started = Instant::now();
    let plan = Flood {
        total,
        same_ms,
        bad: &bad,
        due: (&due_ok, &same),
    };
    let (n_bad, n_good) = produce_flood(kafka, t, &plan, broker.http_addr()).await;
    let produced = started.elapsed();
    // Null-value records with an id-less, target-ful shape are still valid schedules
    // (tombstones are published as tombstones), so valid = every record not in `bad`.
    let deadline = Instant::now() + Duration::from_secs(if soak() { 1_800 } else { 300 });
    let (mut dead, mut delivered) = (0i64, 0i64);
    while Instant::now() < deadline {
        dead = topic_size(kafka, &t.dlt, PARTS);
        delivered = topic_size(kafka, &t.target, PARTS);
        if dead >= n_bad as i64 && delivered >= n_good as i64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let took = started.elapsed();
    if dead != n_bad as i64 || delivered != n_good as i64 {
        let (_, metrics) = http_get(broker.http_addr(), "/metrics").await;
        let interesting: Vec<&str> = metrics
            .lines()
            .filter(|l| {
                l.starts_with("kafka_delay_") && !l.ends_with(" 0") && !l.contains("_bucket")
            })
            .collect();
        eprintln!("metrics:\n{}", interesting.join("\n"));
    }
    eprintln!(
        "bad input: {total} records ({n_bad} malformed, {n_good} valid, {same_ms} due in one ms) produced in {produced:?}; dead letters {dead}, delivered {delivered}, all done in {took:?}"
    );
    println!("| {total} | {n_bad} | {dead} | {n_good} | {delivered} | {same_ms} | {took:?} |");
    assert_eq!(dead, n_bad as i64, "one dead letter per malformed record");
    assert_eq!(
        delivered, n_good as i64,
        "every valid record delivered once"
    );
    assert_eq!(
        http_get(broker.http_addr(), "/readyz").await.0,
        200,
        "no stall"
    );
    broker.shutdown().await;
}

/// The malformed cases, each its headers and whether its value is the oversized one: every
/// way a record can break the header contract, with a target the broker must refuse among them.
fn malformed(t: &Topics, due_ok: &str) -> Vec<(Headers<'static>, bool)> {
    let due_ok = due_ok.to_owned();
    let internal = "__consumer_offsets";
    let long = "x".repeat(250);
    let loop_target = t.delay_topic("loop");
    vec![
        (vec![("delay-until", due_ok.clone().into())], false),
        (
            vec![
                ("delay-target", b"".to_vec()),
                ("delay-until", due_ok.clone().into()),
            ],
            false,
        ),
        (
            vec![
                ("delay-target", t.target.clone().into()),
                ("delay-target", b"other".to_vec()),
                ("delay-until", due_ok.clone().into()),
            ],
            false,
        ),
        (
            vec![
                ("delay-target", vec![0xff, 0xfe]),
                ("delay-until", due_ok.clone().into()),
            ],
            false,
        ),
        (
            vec![
                ("delay-target", t.target.clone().into()),
                ("delay-until", b"-5".to_vec()),
            ],
            false,
        ),
        (
            vec![
                ("delay-target", t.target.clone().into()),
                ("delay-until", b"1.5e12".to_vec()),
            ],
            false,
        ),
        (
            vec![
                ("delay-target", t.target.clone().into()),
                ("delay-until", b"99999999999999999999999".to_vec()),
            ],
            false,
        ),
        (
            vec![
                ("delay-target", t.target.clone().into()),
                ("delay-until", b"1763700000".to_vec()),
            ],
            false,
        ),
        (vec![("delay-target", t.target.clone().into())], false),
        (
            vec![
                ("delay-target", long.clone().into()),
                ("delay-until", due_ok.clone().into()),
            ],
            false,
        ),
        (
            vec![
                ("delay-target", b"bad topic!".to_vec()),
                ("delay-until", due_ok.clone().into()),
            ],
            false,
        ),
        (
            vec![
                ("delay-target", internal.into()),
                ("delay-until", due_ok.clone().into()),
            ],
            false,
        ),
        (
            vec![
                ("delay-target", loop_target.clone().into()),
                ("delay-until", due_ok.clone().into()),
            ],
            false,
        ),
        (
            vec![
                ("delay-target", b"not-allowed".to_vec()),
                ("delay-until", due_ok.clone().into()),
            ],
            false,
        ),
        (
            vec![
                ("delay-target", t.target.clone().into()),
                ("delay-until", due_ok.clone().into()),
            ],
            true,
        ),
    ]
}

/// What the flood sends: `total` records, every third malformed (cycling through `bad`), the
/// first `same_ms` valid ones due in one millisecond (`due.1`), the rest at `due.0`.
struct Flood<'a> {
    total: usize,
    same_ms: usize,
    bad: &'a [(Headers<'static>, bool)],
    due: (&'a str, &'a str),
}

/// Produces the flood, keeping the broker within 50K records of the producer (the mock cluster
/// keeps only about 5 MB per partition); returns how many were malformed and how many valid.
async fn produce_flood(
    kafka: &Kafka,
    t: &Topics,
    plan: &Flood<'_>,
    broker: std::net::SocketAddr,
) -> (u64, u64) {
    let Flood {
        total,
        same_ms,
        bad,
        due: (due_ok, same),
    } = *plan;
    let big = vec![b'v'; 5_000];
    let producer: FutureProducer = rdkafka::config::ClientConfig::new()
        .set("bootstrap.servers", kafka.brokers())
        .set("linger.ms", "20")
        .set("queue.buffering.max.messages", "200000")
        .create()
        .unwrap();
    let (mut n_bad, mut n_good) = (0u64, 0u64);
    let mut pending = Vec::new();
    for i in 0..total {
        // Every third record is malformed; 1 in 10 valid ones are due in the same millisecond.
        let (headers, oversized, key): (Headers<'_>, bool, Option<Vec<u8>>) = if i % 3 == 0 {
            let (h, o) = bad[(i / 3) % bad.len()].clone();
            n_bad += 1;
            (h, o, None)
        } else {
            n_good += 1;
            let due = if (n_good as usize) <= same_ms {
                same
            } else {
                due_ok
            };
            let key = (i % 7 != 0).then(|| format!("k{i}").into_bytes());
            (
                vec![
                    ("delay-target", t.target.clone().into()),
                    ("delay-until", due.into()),
                ],
                false,
                key,
            )
        };
        let mut hs = OwnedHeaders::new();
        for (k, v) in &headers {
            hs = hs.insert(Header {
                key: k,
                value: Some(v.as_slice()),
            });
        }
        let value: Option<&[u8]> = if oversized {
            Some(&big)
        } else if i % 11 == 0 {
            None
        } else {
            Some(b"v")
        };
        let mut rec = FutureRecord::<[u8], [u8]>::to(&t.delay).headers(hs);
        if let Some(k) = &key {
            rec = rec.key(k);
        }
        if let Some(v) = value {
            rec = rec.payload(v);
        }
        loop {
            match producer.send_result(rec) {
                Ok(f) => {
                    pending.push(f);
                    break;
                }
                Err((_, back)) => {
                    rec = back;
                    for f in pending.drain(..) {
                        f.await.unwrap().map_err(|(e, _)| e).unwrap();
                    }
                }
            }
        }
        if pending.len() >= 50_000 {
            for f in pending.drain(..) {
                f.await.unwrap().map_err(|(e, _)| e).unwrap();
            }
            // The mock cluster keeps only about 5 MB per partition and deletes older batches,
            // so producing far ahead of the broker would lose records inside "Kafka" (a 1M
            // run without this lost half of them there). Keep the broker within 50K records.
            let lag_deadline = Instant::now() + Duration::from_secs(120);
            while ingested(broker).await + 50_000 < i + 1 && Instant::now() < lag_deadline {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    for f in pending.drain(..) {
        f.await.unwrap().map_err(|(e, _)| e).unwrap();
    }
    (n_bad, n_good)
}

/// Records the broker has consumed from its source topics.
async fn ingested(addr: std::net::SocketAddr) -> usize {
    let (_, body) = http_get(addr, "/metrics").await;
    body.lines()
        .filter(|l| l.starts_with("kafka_delay_ingest_records_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as usize
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_given_to_librdkafka_never_appear_in_logs_or_errors() {
    let secret = "Hunter2-very-secret-value";
    let token = "admin-token-that-is-secret-42";
    let data = TempDir::new().unwrap();
    let http = format!("127.0.0.1:{}", free_port());
    let password = format!("sasl.password={secret}");
    // A cluster that does not answer, SASL credentials, an admin token, debug logs: it logs
    // its configuration and its connection errors, then is stopped.
    let mut child = Command::new("timeout")
        .args([
            "-s",
            "TERM",
            "8",
            BIN,
            "run",
            "--brokers",
            "127.0.0.1:1",
            "--data-dir",
        ])
        .arg(data.path())
        .args(["--http-addr", &http, "--admin-token", token])
        .args(["--kafka-config", "security.protocol=SASL_PLAINTEXT"])
        .args([
            "--kafka-config",
            "sasl.mechanism=PLAIN",
            "--kafka-config",
            "sasl.username=u",
        ])
        .args(["--kafka-config", &password])
        .env("KAFKA_DELAY_LOG", "debug")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = String::new();
    let mut err = String::new();
    use std::io::Read;
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    child.wait().unwrap();
    let all = format!("{out}{err}");
    assert!(
        all.contains("sasl.password=[redacted]"),
        "the configuration is logged, redacted:\n{all}"
    );
    assert!(!all.contains(secret), "the SASL password leaked:\n{all}");
    assert!(!all.contains(token), "the admin token leaked:\n{all}");
    // And a configuration error that names the property does not print its value.
    let bad = Command::new(BIN)
        .args(["run", "--brokers", "127.0.0.1:1", "--data-dir"])
        .arg(data.path())
        .args([
            "--kafka-config",
            &password,
            "--kafka-config",
            "sasl.mechanism=NOPE",
        ])
        .args(["--http-addr", &format!("127.0.0.1:{}", free_port())])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&bad.stdout),
        String::from_utf8_lossy(&bad.stderr)
    );
    assert!(
        !bad.status.success(),
        "an unknown SASL mechanism fails at start: {text}"
    );
    assert!(
        !text.contains(secret),
        "the password leaked in an error:\n{text}"
    );
}
