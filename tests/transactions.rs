//! Kafka transactions as exactly-once firing uses them (`kafka_delay::txn`), on Apache
//! Kafka (the mock cluster neither fences producers nor checks a group's generation): what a
//! transaction commits is visible to read_committed consumers with its offsets, what it aborts
//! is not, a newer producer with the same transactional id fences the older one, and a member
//! whose generation is over (a zombie) cannot commit; a restore waits for a transaction open in
//! the changelog. An exactly-once instance fires a record due when ingested in the transaction
//! that consumes it, unless a fire limit must pace it.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{collect, reader, unique, Kafka};
use kafka_delay::changelog::restore::{restore, Part};
use kafka_delay::changelog::Changelog;
use kafka_delay::config::RunArgs;
use kafka_delay::store::{Store, StoreOptions};
use kafka_delay::txn::{
    check, Cut, GroupMetadata, Out, Renew, Setup, Transactions, TxnError, TxnProducer,
};
use kafka_delay_core::changelog::Entry;
use kafka_delay_core::record::StoredRecord;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::Producer;
use rdkafka::{Offset, TopicPartitionList};

const CUT: Cut = Cut {
    interval: Duration::from_millis(20),
    max_records: 1_000,
    timeout: Duration::from_secs(30),
    commit_wait: Duration::from_secs(30),
    // librdkafka's default transaction timeout, the producers' here.
    stuck: Cut::stuck_after(Duration::from_secs(60)),
};

fn transactional(kafka: &Kafka, id: &str) -> TxnProducer {
    kafka_delay::txn::producer(
        ClientConfig::new()
            .set("bootstrap.servers", kafka.brokers())
            .set("transactional.id", id)
            .set("linger.ms", "5"),
    )
    .expect("transactional producer")
}

/// Makes a new transactional producer with id `id`, as a loop renews its fenced one.
fn renewer(kafka: &Kafka, id: &str) -> Renew {
    let (brokers, id) = (kafka.brokers().to_owned(), id.to_owned());
    Arc::new(move || {
        kafka_delay::txn::producer(
            ClientConfig::new()
                .set("bootstrap.servers", &brokers)
                .set("transactional.id", &id),
        )
    })
}

/// A member of `group` consuming `topic`, once it has its assignment.
fn member(kafka: &Kafka, group: &str, topic: &str) -> Arc<BaseConsumer> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", kafka.brokers())
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("session.timeout.ms", "6000")
        // A member that stops polling leaves the group after 6 s, as a paused process would.
        .set("max.poll.interval.ms", "6000")
        .create()
        .expect("consumer");
    c.subscribe(&[topic]).expect("subscribe");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    tokio::task::block_in_place(|| {
        while c.assignment().map_or(0, |a| a.count()) == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "no assignment in 60 s"
            );
            let _ = c.poll(Duration::from_millis(100));
        }
    });
    Arc::new(c)
}

fn metadata_of(c: &Arc<BaseConsumer>) -> GroupMetadata {
    let c = c.clone();
    Arc::new(move || c.group_metadata())
}

fn out(topic: &str, value: &str) -> Out {
    Out {
        topic: topic.to_owned(),
        partition: Some(0),
        value: Some(value.as_bytes().to_vec()),
        ..Out::default()
    }
}

async fn values(kafka: &Kafka, topic: &str) -> Vec<String> {
    let r = reader(kafka, topic, 1);
    collect(&r, usize::MAX, Duration::from_secs(3))
        .await
        .iter()
        .filter_map(|g| g.value())
        .collect()
}

fn committed(c: &BaseConsumer, topic: &str) -> Option<i64> {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, 0);
    let got = c.committed_offsets(tpl, Duration::from_secs(10)).ok()?;
    match got.elements().first()?.offset() {
        Offset::Offset(o) => Some(o),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_a_transaction_commits_its_records_with_its_offsets_and_an_abort_shows_nothing(
) {
    let kafka = Kafka::start();
    let (source, target) = (unique("txn-src"), unique("txn-out"));
    kafka.create_topic(&source, 1).await;
    kafka.create_topic(&target, 1).await;
    let group = unique("txn-group");
    let consumer = member(&kafka, &group, &source);
    let producer = transactional(&kafka, &unique("txn"));
    let (txn, _task) =
        Transactions::start(producer, Setup::new(metadata_of(&consumer), CUT)).unwrap();

    let offsets = vec![(source.clone(), 0, 42)];
    let records = vec![out(&target, "a"), out(&target, "b")];
    txn.submit(records, offsets).await.expect("committed");
    // A record over the client's size limit fails the transaction it is in: the record
    // before it, and the offsets, are aborted with it.
    let mut too_big = out(&target, "");
    too_big.value = Some(vec![b'x'; 2_000_000]);
    let result = txn
        .submit(
            vec![out(&target, "c"), too_big],
            vec![(source.clone(), 0, 50)],
        )
        .await;
    // The oversize record is named (the second of its piece); nothing of it is visible.
    assert!(
        matches!(&result, Err(TxnError::Rejected(r)) if r.len() == 1 && r[0].0 == 1),
        "{result:?}"
    );
    txn.submit(vec![out(&target, "d")], vec![])
        .await
        .expect("committed");

    assert_eq!(values(&kafka, &target).await, ["a", "b", "d"]);
    assert_eq!(committed(&consumer, &source), Some(42));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_a_newer_producer_with_the_same_transactional_id_fences_the_older() {
    let kafka = Kafka::start();
    let (source, target) = (unique("txn-src"), unique("txn-out"));
    kafka.create_topic(&source, 1).await;
    kafka.create_topic(&target, 1).await;
    let consumer = member(&kafka, &unique("txn-group"), &source);
    let id = unique("txn");
    let (old, _t1) = Transactions::start(
        transactional(&kafka, &id),
        Setup::new(metadata_of(&consumer), CUT),
    )
    .unwrap();
    old.submit(vec![out(&target, "old-1")], vec![])
        .await
        .expect("committed before the newer producer");
    let (new, _t2) = Transactions::start(
        transactional(&kafka, &id),
        Setup::new(metadata_of(&consumer), CUT),
    )
    .unwrap();
    let fenced = old.submit(vec![out(&target, "old-2")], vec![]).await;
    assert!(matches!(fenced, Err(TxnError::Fenced(_))), "{fenced:?}");
    let again = old.submit(vec![out(&target, "old-3")], vec![]).await;
    assert!(matches!(again, Err(TxnError::Fenced(_))), "{again:?}");
    new.submit(vec![out(&target, "new-1")], vec![])
        .await
        .expect("the newer producer commits");
    assert_eq!(values(&kafka, &target).await, ["old-1", "new-1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_work_that_arrives_while_fenced_waits_for_the_renewed_producer() {
    let kafka = Kafka::start();
    let target = unique("txn-out");
    kafka.create_topic(&target, 1).await;
    let id = unique("txn");
    let no_offsets: GroupMetadata = Arc::new(|| None);
    let setup = Setup {
        renew: Some(renewer(&kafka, &id)),
        ..Setup::new(no_offsets.clone(), CUT)
    };
    let (txn, _task) = Transactions::start(transactional(&kafka, &id), setup).unwrap();
    let (newer, _t2) =
        Transactions::start(transactional(&kafka, &id), Setup::new(no_offsets, CUT)).unwrap();
    let fenced = txn.submit(vec![out(&target, "fenced")], vec![]).await;
    assert!(matches!(fenced, Err(TxnError::Fenced(_))), "{fenced:?}");
    // Sent at once, as a dead letter is after its record's refusal: it waits for the new
    // producer and commits, instead of being answered "fenced" until the next renewal.
    txn.submit(vec![out(&target, "renewed")], vec![])
        .await
        .expect("committed by the renewed producer");
    // The renewal fenced the newer producer in turn.
    let fenced = newer.submit(vec![out(&target, "newer")], vec![]).await;
    assert!(matches!(fenced, Err(TxnError::Fenced(_))), "{fenced:?}");
    assert_eq!(values(&kafka, &target).await, ["renewed"]);
}

/// A transaction that hangs before its commit is sent (here the read of the group's metadata
/// for its offsets blocks, as a call to an unanswering coordinator would) is given up once it
/// ran past `Cut::stuck`, while the call still hangs: its work is answered as fenced, the
/// producer renewed, and the same work commits on the new producer, once. When the hung call
/// returns, the given-up transaction does not commit. Without the limit (as long as the hang)
/// the loop, and every record of the instance, would wait for the call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_a_transaction_hung_before_its_commit_is_given_up_and_its_work_commits_once_renewed(
) {
    const HANG: Duration = Duration::from_secs(5);
    let kafka = Kafka::start();
    let (source, target) = (unique("txn-hang-src"), unique("txn-hang-out"));
    kafka.create_topic(&source, 1).await;
    kafka.create_topic(&target, 1).await;
    let consumer = member(&kafka, &unique("txn-hang"), &source);
    // The member stays in its group however long the test takes (it polls as ingest does).
    let polling = Arc::new(AtomicBool::new(true));
    let poller = {
        let (c, polling) = (consumer.clone(), polling.clone());
        std::thread::spawn(move || {
            while polling.load(Ordering::SeqCst) {
                let _ = c.poll(Duration::from_millis(100));
            }
        })
    };
    // The first read of the metadata hangs for HANG; `returned` says when it is over.
    let (first, returned) = (
        Arc::new(AtomicBool::new(true)),
        Arc::new(AtomicBool::new(false)),
    );
    let metadata: GroupMetadata = {
        let (c, first, returned) = (consumer.clone(), first.clone(), returned.clone());
        Arc::new(move || {
            if first.swap(false, Ordering::SeqCst) {
                std::thread::sleep(HANG);
                returned.store(true, Ordering::SeqCst);
            }
            c.group_metadata()
        })
    };
    let id = unique("txn");
    let cut = Cut {
        stuck: Duration::from_secs(1),
        ..CUT
    };
    let setup = Setup {
        renew: Some(renewer(&kafka, &id)),
        ..Setup::new(metadata, cut)
    };
    let (txn, _task) = Transactions::start(transactional(&kafka, &id), setup).unwrap();
    let work = || (vec![out(&target, "a")], vec![(source.clone(), 0, 1)]);
    let (records, offsets) = work();
    let hung = txn.submit(records, offsets).await;
    assert!(matches!(hung, Err(TxnError::Fenced(_))), "{hung:?}");
    assert!(
        !returned.load(Ordering::SeqCst),
        "answered only once the hung call returned"
    );
    let (records, offsets) = work();
    txn.submit(records, offsets)
        .await
        .expect("committed on the renewed producer");
    // The hung call returns; the transaction it belonged to must not commit after it.
    while !returned.load(Ordering::SeqCst) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(values(&kafka, &target).await, ["a"]);
    assert_eq!(committed(&consumer, &source), Some(1));
    polling.store(false, Ordering::SeqCst);
    poller.join().unwrap();
}

/// A commit that outlives its call (librdkafka goes on with it in the background: a
/// coordinator slow to answer, a connection cut while the answer was on its way) is waited
/// for, never aborted: the abort would be refused while the commit goes on, the producer
/// renewed and the work answered as failed, so a caller sending it again (as firing does)
/// would deliver every record of a transaction that did commit twice. Here every call waits
/// 1 ms, less than any commit takes, and each value must be read once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_a_commit_that_outlives_its_call_is_waited_for_and_commits_once() {
    let kafka = Kafka::start();
    let target = unique("txn-slow-commit");
    kafka.create_topic(&target, 1).await;
    let id = unique("txn");
    let cut = Cut {
        commit_wait: Duration::from_millis(1),
        ..CUT
    };
    let setup = Setup {
        renew: Some(renewer(&kafka, &id)),
        ..Setup::new(Arc::new(|| None), cut)
    };
    let (txn, _task) = Transactions::start(transactional(&kafka, &id), setup).unwrap();
    let sent: Vec<String> = (0..20).map(|i| format!("v{i}")).collect();
    each_once(&kafka, &txn, &target, &sent).await;
}

/// Submits each of `sent` to `target` in a transaction of its own, once more when it is
/// answered as failed (as firing sends such work again), then asserts that each was read
/// once and none was answered as failed.
async fn each_once(kafka: &Kafka, txn: &Transactions, target: &str, sent: &[String]) {
    let mut failed = Vec::new();
    for value in sent {
        if let Err(e) = txn.submit(vec![out(target, value)], Vec::new()).await {
            failed.push(format!("{value}: {e}"));
            let again = txn.submit(vec![out(target, value)], Vec::new()).await;
            failed.push(format!("{value} again: {again:?}"));
        }
    }
    assert_eq!(
        values(kafka, target).await,
        sent,
        "each value once; answered as failed: {failed:?}"
    );
    assert_eq!(failed, Vec::<String>::new());
}

/// A commit that happened though its call failed (its answer lost; here the test seam
/// `Setup::lose_answers` reports the first successful commit as failed, with an error that
/// does not say whether it committed) is read from the log before its work is answered: the
/// work is done and not sent again. Without the lookup it is answered as failed, and sent
/// again (as firing does) it is delivered twice.
#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_a_commit_whose_answer_is_lost_is_read_from_the_log_and_done_once() {
    let kafka = Kafka::start();
    let target = unique("txn-lost-answer");
    kafka.create_topic(&target, 1).await;
    let id = unique("txn");
    let mut client = ClientConfig::new();
    client
        .set("bootstrap.servers", kafka.brokers())
        .set("group.id", unique("txn-lookup"));
    let lookup: kafka_delay::txn::Lookup = Arc::new(move |placed| {
        kafka_delay::txn::lookup::committed(&client, placed.first()?, Duration::from_secs(20))
    });
    let setup = Setup {
        renew: Some(renewer(&kafka, &id)),
        lookup: Some(lookup),
        ..Setup::new(Arc::new(|| None), CUT)
    };
    setup.lose_answers.store(1, Ordering::SeqCst);
    let (txn, _task) = Transactions::start(transactional(&kafka, &id), setup).unwrap();
    each_once(&kafka, &txn, &target, &["a".into(), "b".into()]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_a_member_whose_generation_is_over_cannot_commit_offsets_or_records() {
    let kafka = Kafka::start();
    let (source, target) = (unique("txn-src"), unique("txn-out"));
    kafka.create_topic(&source, 1).await;
    kafka.create_topic(&target, 1).await;
    let group = unique("txn-group");
    let zombie = member(&kafka, &group, &source);
    // The zombie's view of the group, frozen: it stops polling and its session runs out.
    // (Taken once: the one transaction below sends it.)
    let frozen = std::sync::Mutex::new(zombie.group_metadata());
    let stale: GroupMetadata = Arc::new(move || frozen.lock().unwrap().take());
    let (txn, _task) = Transactions::start(
        transactional(&kafka, &unique("txn")),
        Setup::new(stale, CUT),
    )
    .unwrap();
    let heir = member(&kafka, &group, &source); // joins once the zombie's session is over
    let result = txn
        .submit(vec![out(&target, "late")], vec![(source.clone(), 0, 7)])
        .await;
    eprintln!("the zombie's transaction: {result:?}");
    // The coordinator no longer knows it (its session ran out): only a rejoin mends that,
    // so ingest gives such a refusal seconds, not the half minute a new generation gets.
    assert!(
        matches!(
            result,
            Err(TxnError::Stale {
                forgotten: true,
                ..
            })
        ),
        "{result:?}"
    );
    assert!(values(&kafka, &target).await.is_empty());
    assert_eq!(committed(&heir, &source), None);
    // Closing a consumer whose poll interval ran out can block for good in librdkafka's close
    // (its revoke waits on a group that finished the rebalance without it): the test is over,
    // so the zombie is closed on a thread of its own that nothing waits for.
    std::thread::spawn(move || drop(zombie));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_the_transaction_check_passes_on_kafka_and_says_why_elsewhere() {
    let kafka = Kafka::start();
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", kafka.brokers());
    tokio::task::block_in_place(|| check(&config, Duration::from_secs(30))).expect("transactions");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    config.set("bootstrap.servers", format!("127.0.0.1:{port}"));
    let e = tokio::task::block_in_place(|| check(&config, Duration::from_secs(3))).unwrap_err();
    assert!(e.contains("cannot run transactions"), "{e}");
}

/// A restore reads the changelog up to the log end it saw, past a transaction still open
/// there: it waits for the transaction's outcome. (Read committed, the end would be where the
/// transaction began: an exactly-once instance's firing that commits after the restore
/// would be missed, and its record fired again by the new owner.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_a_restore_waits_for_a_transaction_open_in_the_changelog() {
    let kafka = Kafka::start();
    let source = unique("txn-src");
    let group = unique("txn-group");
    let brokers = kafka.brokers();
    let flags = ["--brokers", brokers.as_str(), "--group-id", group.as_str()];
    let config = RunArgs::try_parse_flags(flags).unwrap().validate().unwrap();
    let changelog = Changelog::new(&config, Default::default()).unwrap();
    let topic = changelog.topic_of(&source);
    kafka.create_topic(&topic, 1).await;
    let record = StoredRecord::new(1, "out", None, Some(b"k"), Some(b"v"), []);
    let none: GroupMetadata = Arc::new(|| None);
    let (writer, _task) =
        Transactions::start(transactional(&kafka, &unique("w")), Setup::new(none, CUT)).unwrap();
    let committed = vec![
        changelog.out(&source, 0, &Entry::Record(0, &record)),
        changelog.out(&source, 0, &Entry::SourceOffset(1)),
    ];
    writer.submit(committed, vec![]).await.expect("committed");
    // The record's tombstone, in a transaction left open.
    let open = transactional(&kafka, &unique("fire"));
    let gone = changelog.out(&source, 0, &Entry::Gone(0));
    tokio::task::block_in_place(|| {
        open.init_transactions(Duration::from_secs(30)).unwrap();
        open.begin_transaction().unwrap();
    });
    let key = gone.key.unwrap();
    let rec = rdkafka::producer::BaseRecord::<[u8], [u8], usize>::with_opaque_to(&topic, 0)
        .partition(0)
        .key(&key);
    open.send(rec).map_err(|(e, _)| e).expect("handed");
    tokio::task::block_in_place(|| open.flush(Duration::from_secs(30))).expect("written");

    let dir = tempfile::TempDir::new().unwrap();
    let store = Arc::new(Store::open(dir.path(), StoreOptions::default()).unwrap());
    let part = Part {
        pid: store.partition_id(&source, 0).unwrap(),
        topic,
        partition: 0,
        cancelled: Arc::default(),
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let s = store.clone();
    std::thread::spawn(move || {
        let r = restore(&config, &s, vec![part], Duration::from_secs(10), None);
        let _ = tx.send(r.map(drop).map_err(|e| e.to_string()));
    });
    let early = tokio::task::block_in_place(|| rx.recv_timeout(Duration::from_secs(3)));
    assert!(
        early.is_err(),
        "the restore ended while a transaction was open: {early:?}, {} pending",
        store.pending()
    );
    tokio::task::block_in_place(|| open.commit_transaction(Duration::from_secs(30))).unwrap();
    let done = tokio::task::block_in_place(|| rx.recv_timeout(Duration::from_secs(60)));
    done.expect("the restore ended once the transaction committed")
        .expect("restored");
    assert_eq!(store.pending(), 0, "the committed tombstone was applied");
}

/// With `--exactly-once`, a record already due when it is ingested fires in the transaction
/// that consumes it: its target record arrives once, and the changelog holds nothing of it
/// (no entry, no tombstone). A pending record it replaces by id is gone with it. A record its
/// target refuses (too large for the topic) is stored after all and goes through the usual
/// retries to the dead-letter topic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_exactly_once_fires_a_record_due_at_ingest_in_the_transaction_that_consumes_it(
) {
    fires_due_at_ingest(&["--exactly-once"]).await;
}

/// With the changelog (at least once), a record already due when it is ingested fires at once
/// and is never stored: the changelog holds nothing of it, as with exactly-once. Without a
/// linger every record that waits gets an entry and a tombstone, so the changelog shows which
/// records were stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_changelog_fires_a_record_due_at_ingest_without_storing_it() {
    fires_due_at_ingest(&["--changelog", "--changelog-linger", "0s"]).await;
}

/// Records due at ingest, run with `flags`: each arrives once, the one they replace never, the
/// one its target refuses reaches the dead-letter topic, and the changelog holds entries only
/// for the record that waited and the refused one.
async fn fires_due_at_ingest(flags: &[&str]) {
    use kafka_delay_core::changelog::{decode, Restored};
    let env = common::Env::start(1, flags).await;
    let (kafka, t) = (&env.kafka, &env.t);
    let small = format!("small-{}", t.id);
    kafka
        .create_topic_with(&small, 1, &[("max.message.bytes", "2000")])
        .await;
    let producer = kafka.producer();
    let (now, hour) = (common::now_ms(), 3_600_000);
    let later = (now + hour).to_string();
    let due = (now - 1_000).to_string();
    let target = t.target.as_str();
    let x_later = [
        ("delay-target", target),
        ("delay-until", &later),
        ("delay-id", "x"),
    ];
    let x_now = [
        ("delay-target", target),
        ("delay-until", &due),
        ("delay-id", "x"),
    ];
    let now_due = [("delay-target", target), ("delay-until", due.as_str())];
    // Offset 0 was the probe `Env::start` sent: due at once as well.
    common::produce(&producer, &t.delay, None, Some("x-later"), &x_later).await; // 1
    common::produce(&producer, &t.delay, None, Some("x-now"), &x_now).await; // 2
    for i in 0..20 {
        let v = format!("r{i}");
        common::produce(&producer, &t.delay, None, Some(&v), &now_due).await; // 3..=22
    }
    // Bytes no compression shrinks below the topic's limit.
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let big: Vec<u8> = (0..8_000)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed as u8
        })
        .collect();
    let to_small = [
        ("delay-target", small.as_str()),
        ("delay-until", due.as_str()),
    ];
    common::produce_to(&producer, &t.delay, None, None, Some(&big), &to_small).await; // 23

    let got = collect(&reader(kafka, target, 1), 22, Duration::from_secs(30)).await;
    let mut values: Vec<String> = got.iter().filter_map(|g| g.value()).collect();
    values.sort();
    let mut want: Vec<String> = (0..20).map(|i| format!("r{i}")).collect();
    want.push("x-now".into());
    want.sort();
    assert_eq!(
        values, want,
        "each record due at ingest once, the replaced one never"
    );
    let dead = collect(&reader(kafka, &t.dlt, 1), 1, Duration::from_secs(60)).await;
    assert_eq!(
        dead.len(),
        1,
        "the refused record reaches the dead-letter topic"
    );
    assert_eq!(rdkafka::Message::payload(&dead[0].msg), Some(&big[..]));
    assert!(
        dead[0].header("delay-error").is_some(),
        "{:?}",
        dead[0].headers()
    );

    let port = env.broker.http_addr().port();
    let pending = common::metric_at(port, "kafka_delay_pending_records").await;
    assert_eq!(pending, Some(0.0), "x-later was replaced by x-now");
    let fired_line = format!("kafka_delay_fire_records_total{{target=\"{}\"}}", t.target);
    let fired = common::metric_at(port, &fired_line).await;
    assert_eq!(
        fired,
        Some(20.0 + 1.0),
        "records fired at ingest are counted"
    );

    // The changelog: an entry only for the record that waited (x-later) and for the refused
    // one, stored after all; every other record fired with its group.
    let changelog = format!("g-{}-{}-changelog", t.id, t.delay);
    let entries = collect(&reader(kafka, &changelog, 1), 1_000, Duration::from_secs(5)).await;
    let mut logged: Vec<i64> = Vec::new();
    for e in &entries {
        let key = rdkafka::Message::key(&e.msg);
        let payload = rdkafka::Message::payload(&e.msg);
        match decode(key, payload).expect("a changelog entry") {
            Restored::Record { offset, .. } | Restored::Pointer { offset, .. } => {
                logged.push(offset)
            }
            // The partition's clock probe writes the tombstone of an offset no source reaches.
            Restored::Gone { offset } if offset < 1_000 => logged.push(-offset - 1),
            Restored::Gone { .. } | Restored::SourceOffset(_) => {}
        }
    }
    logged.sort();
    assert_eq!(
        logged,
        vec![-24, -2, 1, 23],
        "entries and tombstones (negative: -offset-1) only for x-later and the refused record"
    );
}

/// With a fire limit, records due when ingested are paced like any other: nothing fires at
/// ingest then (the limiter paces what the wheel hands it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apache_kafka_exactly_once_with_a_fire_limit_paces_records_due_at_ingest() {
    let t = common::Topics::new();
    let rule = format!("^{}$=10/s,burst=1", t.target);
    let env = common::Env::start_with(t, 1, &["--exactly-once", "--fire-rate", &rule]).await;
    let (kafka, t) = (&env.kafka, &env.t);
    let producer = kafka.producer();
    let due = (common::now_ms() - 1_000).to_string();
    let headers = [
        ("delay-target", t.target.as_str()),
        ("delay-until", due.as_str()),
    ];
    for i in 0..20 {
        let v = format!("r{i}");
        common::produce(&producer, &t.delay, None, Some(&v), &headers).await;
    }
    let got = collect(&reader(kafka, &t.target, 1), 20, Duration::from_secs(30)).await;
    assert_eq!(got.len(), 20, "every record fires");
    let first = got.iter().map(|g| g.received_ms).min().unwrap();
    let last = got.iter().map(|g| g.received_ms).max().unwrap();
    // 20 records at 10/s take about 2 s; fired at ingest they would arrive within a few
    // transactions of their groups.
    assert!(
        last - first >= 1_000,
        "20 records at 10/s arrived within {} ms",
        last - first
    );
}
