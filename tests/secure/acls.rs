//! The ACLs `kafka-delay acls` prints are enough and none is spare: with every line granted an
//! instance starts, fires a record and dead-letters a malformed one, and the console reads the
//! dead letter; then each line is taken away in turn (and granted again after), and what the
//! line's comment says it is for fails, with the refusal named where an operator looks (the
//! instance's log, the console's answer).

use std::time::{Duration, Instant};

use rdkafka::consumer::StreamConsumer;
use rdkafka::message::Message;
use rdkafka::producer::FutureProducer;
use tempfile::TempDir;

use super::common::apache::Secured;
use super::common::http_get_at;
use super::{client, header, record, secured, send, Logs, Plan, ACLS, SERIAL};

/// What one instance did.
#[derive(Debug, Default)]
struct Outcome {
    /// It answered `/readyz` with 200.
    ready: bool,
    /// The good record reached its target.
    fired: bool,
    /// The reasons of the run's dead letters.
    dead: Vec<String>,
    /// The console's dead-letter page: status and body.
    console: (u16, String),
    /// The instance's log.
    log: String,
}

/// What a printed line is for, told by the resource it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Line {
    Group,
    ConsoleGroup,
    Sources,
    DeadLetters,
    Cluster,
    RestoreGroup,
    Changelog,
    TransactionalIds,
    Targets,
}

impl Line {
    fn of(plan: &Plan, words: &[String]) -> Line {
        let after = |flag: &str| {
            let at = words.iter().position(|w| w == flag)?;
            words.get(at + 1).map(String::as_str)
        };
        let group = format!("g-secure-{}", plan.t);
        if words.iter().any(|w| w == "--cluster") {
            Line::Cluster
        } else if after("--transactional-id").is_some() {
            Line::TransactionalIds
        } else if let Some(g) = after("--group") {
            match g {
                "kafka-delay-console" => Line::ConsoleGroup,
                g if g == group => Line::Group,
                g if g == format!("{group}-restore") => Line::RestoreGroup,
                g => panic!("a group no case covers: {g}"),
            }
        } else {
            match after("--topic").expect("a resource") {
                t if t == plan.dead_letters() => Line::DeadLetters,
                t if t.starts_with("delay.") => Line::Sources,
                t if t.starts_with(&format!("{group}-")) => Line::Changelog,
                t if t.starts_with("team-a.") => Line::Targets,
                t => panic!("a topic no case covers: {t}"),
            }
        }
    }

    /// How long a run without this line watches for its two records. Without the targets'
    /// line every record is refused and retried before it is dead-lettered, and so is each
    /// record the runs before left unfired: its dead letter comes after all their retries.
    fn watch(self) -> Duration {
        match self {
            Line::Targets => Duration::from_secs(60),
            _ => Duration::from_secs(20),
        }
    }

    /// Asserts that `o`, run without this line, failed as the line's purpose says.
    fn check(self, o: &Outcome, plan: &Plan) {
        let logged = |s: &str| o.log.contains(s);
        let what = format!("without the {self:?} line: {o:?}");
        match self {
            Line::Group => assert!(!o.fired && logged("GroupAuthorizationFailed"), "{what}"),
            // A restore reads its partitions by offset, but librdkafka asks for the group's
            // coordinator too, and its refusal fails the restore when it comes before the
            // restore's end: the partitions stay paused and the restore is tried again. A try
            // whose fetches end first gets through, so whether anything fires by the end of
            // the run is a race; the refused restore is not.
            Line::RestoreGroup => assert!(
                logged("cannot restore assigned partitions") && logged("GroupAuthorizationFailed"),
                "{what}"
            ),
            Line::ConsoleGroup => assert!(
                o.fired && o.console.0 != 200 && o.console.1.contains("GroupAuthorizationFailed"),
                "{what}"
            ),
            Line::Sources => assert!(
                !o.fired && o.dead.is_empty() && logged("Subscribed topic not available"),
                "{what}"
            ),
            Line::DeadLetters => assert!(
                !o.ready
                    && logged(&format!("dead-letter topic '{}'", plan.dead_letters()))
                    && logged("TopicAuthorizationFailed"),
                "{what}"
            ),
            Line::Cluster => {
                assert!(
                    !o.ready && logged("DescribeConfigs on the cluster"),
                    "{what}"
                )
            }
            Line::Changelog => assert!(
                !o.ready && logged("changelog topic '") && logged("TopicAuthorizationFailed"),
                "{what}"
            ),
            Line::TransactionalIds => {
                assert!(
                    !o.ready && logged("refuses this principal its transactional id"),
                    "{what}"
                )
            }
            Line::Targets => assert!(
                !o.fired && o.dead.iter().any(|d| d == "target-denied"),
                "{what}"
            ),
        }
    }
}

/// Runs `kafka-acls` with a printed line's words, `--remove --force` for `--add`.
fn remove(cluster: &Secured, words: &[String]) {
    let mut args: Vec<&str> = vec!["--remove", "--force"];
    args.extend(words.iter().map(String::as_str).filter(|w| *w != "--add"));
    cluster.tool(ACLS, &args);
}

/// An instance of `plan` with a data directory of its own (what it restores comes from the
/// changelog): started, sent a record due 2 s later and a malformed one (values `{run}-good`
/// and `{run}-bad`) and one due in an hour to each of the first `held` source partitions,
/// watched until the first two are accounted for or `watch` has passed.
async fn run(cluster: &Secured, plan: &Plan, (run, held): (&str, i32), watch: Duration) -> Outcome {
    let (data, logs) = (TempDir::new().unwrap(), Logs::new(plan.t));
    let (mut instance, port) = plan.spawn(run, &data, &logs);
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut outcome = Outcome::default();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(40) {
        if let Ok(Some(_)) = instance.0.try_wait() {
            break;
        }
        if let Some((200, _)) = http_get_at(addr, "/readyz").await {
            outcome.ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let tenant: FutureProducer = client(cluster, "tenant-a")
        .set("enable.idempotence", "true")
        .create()
        .unwrap();
    let (source, out, dead) = (plan.source(), plan.target("out"), plan.dead_letters());
    let (good, bad) = (format!("{run}-good"), format!("{run}-bad"));
    let due = (super::common::now_ms() + 2_000).to_string();
    let mut acks = vec![
        send(
            &tenant,
            record(&source, Some(&good), &good, (&out, &due, None)),
        ),
        send(
            &tenant,
            record(&source, Some(&bad), &bad, (&out, "soon", None)),
        ),
    ];
    // Records due in an hour, one in each source partition: every later run restores them.
    let later = (super::common::now_ms() + 3_600_000).to_string();
    for p in 0..held {
        let key = format!("{run}-held-{p}");
        let r = record(&source, Some(&key), &key, (&out, &later, None)).partition(p);
        acks.push(send(&tenant, r));
    }
    for ack in acks {
        ack.await.unwrap().map_err(|(e, _)| e).unwrap();
    }
    let checker: StreamConsumer = client(cluster, "admin")
        .set("group.id", super::common::unique("acl-checker"))
        .set("isolation.level", "read_committed")
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    tokio::task::block_in_place(|| super::assign_all(&checker, &[&out, &dead]));
    let deadline = Instant::now() + watch;
    // Done when both are accounted for: fired and dead-lettered, or both dead letters.
    let done = |o: &Outcome| o.dead.len() == 2 || (o.fired && o.dead.len() == 1);
    while Instant::now() < deadline && !done(&outcome) {
        let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(500), checker.recv()).await
        else {
            continue;
        };
        let value = m.payload_view::<str>().and_then(Result::ok);
        match value {
            Some(v) if v == good && m.topic() == out => outcome.fired = true,
            Some(v) if v == good || v == bad => {
                outcome
                    .dead
                    .push(header(&m, "delay-error").unwrap_or_default());
            }
            _ => {}
        }
    }
    if let Some(answer) = http_get_at(addr, &format!("/api/v1/dead-letters/{dead}")).await {
        outcome.console = answer;
    }
    drop(instance);
    outcome.log =
        std::fs::read_to_string(logs.path().join(format!("{run}.log"))).unwrap_or_default();
    outcome
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn apache_kafka_secured_cluster_each_printed_acl_is_needed_for_what_it_says() {
    let _serial = SERIAL.lock().await;
    let cluster = tokio::task::block_in_place(secured);
    let plan = tokio::task::block_in_place(|| {
        Plan::new(cluster, "acl", cluster.brokers(), &["--exactly-once"])
    });
    let lines = plan.printed_acls(cluster);
    let mut kinds: Vec<Line> = lines.iter().map(|(_, w)| Line::of(&plan, w)).collect();

    // Everything granted: the record fires, the malformed one is a dead letter the console reads.
    let all = run(cluster, &plan, ("all", 4), Duration::from_secs(20)).await;
    assert!(
        all.ready
            && all.fired
            && all.dead == ["invalid-due-time"]
            && all.console.0 == 200
            && all.console.1.contains("invalid-due-time"),
        "with every printed line granted: {all:?}"
    );

    for (k, (why, words)) in lines.iter().enumerate() {
        let kind = kinds[k];
        tokio::task::block_in_place(|| remove(cluster, words));
        let outcome = run(cluster, &plan, (&format!("without{k}"), 0), kind.watch()).await;
        eprintln!(
            "without the line for {why}: ready {}, fired {}, dead letters {:?}, console {}",
            outcome.ready, outcome.fired, outcome.dead, outcome.console.0
        );
        tokio::task::block_in_place(|| {
            let words: Vec<&str> = words.iter().map(String::as_str).collect();
            cluster.tool(ACLS, &words)
        });
        kind.check(&outcome, &plan);
    }
    // Each line is one of these, and each of these is printed once: a new line needs a case.
    kinds.sort();
    assert_eq!(
        kinds,
        [
            Line::Group,
            Line::ConsoleGroup,
            Line::Sources,
            Line::DeadLetters,
            Line::Cluster,
            Line::RestoreGroup,
            Line::Changelog,
            Line::TransactionalIds,
            Line::Targets
        ]
    );
}
