"""Delayed retries for a share group (KIP-932) with confluent-kafka's ShareConsumer and
`retry_and_accept`, against a Kafka that serves share groups (4.2 and newer) and the kafka-delay
binary. Every time is the test's own clock: a record back early is one received before its
failure plus its retry-after; duplicates are counted on the topic itself, read from its start
after the last retry could have fired.

Needs KAFKA_DELAY_TEST_BROKERS and KAFKA_DELAY_BIN, as test_e2e.py."""

import tempfile
import time
import uuid

from confluent_kafka import AcknowledgeType, Consumer, Producer, ShareConsumer, TopicPartition
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, NewTopic, ResourceType

from kafka_delay import attempt, retry_and_accept, share_retry

from test_e2e import BIN, BROKERS, free_port, header, spawn_broker, wait_ready

AFTER = {"flaky": 2, "crash": 6, "doomed": 1}  # seconds


def share_consumer(group, topic):
    c = ShareConsumer({"bootstrap.servers": BROKERS, "group.id": group, "share.acknowledgement.mode": "explicit"})
    c.subscribe([topic])
    return c


def read_all(topic):
    """Every record of a one-partition topic from its start, as a read_committed consumer sees it."""
    c = Consumer({"bootstrap.servers": BROKERS, "group.id": f"reader-{uuid.uuid4().hex[:8]}",
                  "isolation.level": "read_committed", "enable.auto.commit": False})
    _, end = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
    c.assign([TopicPartition(topic, 0, 0)])
    out, deadline = [], time.time() + 30
    while (not out or out[-1].offset() < end - 1) and end > 0:
        assert time.time() < deadline, f"{topic} not read to its end within 30 s"
        m = c.poll(0.5)
        if m is not None and not m.error():
            out.append(m)
    c.close()
    return out


def test_a_share_consumers_failed_records_come_back_after_their_retry_after_once_even_across_a_crash():
    assert BROKERS and BIN, "set KAFKA_DELAY_TEST_BROKERS and KAFKA_DELAY_BIN (scripts/test-external.sh does)"
    run = "pyshare_" + uuid.uuid4().hex[:10]
    work, retry_topic, dlt, group = f"work-{run}", f"delay.{run}.retry", f"dlt-{run}", f"g-{run}"
    admin = AdminClient({"bootstrap.servers": BROKERS})
    for f in admin.create_topics([NewTopic(t, 1, 1) for t in (work, retry_topic, dlt)]).values():
        f.result(30)
    # A share group starts at the log's end unless told otherwise (a group config).
    earliest = ConfigResource(ResourceType.GROUP, group, incremental_configs=[
        ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)])
    for f in admin.incremental_alter_configs([earliest]).values():
        f.result(30)
    port = free_port()
    with tempfile.TemporaryDirectory() as data:
        broker = spawn_broker(
            run, data, port, "--retry-policy", f"^{work}$=backoff=fixed,delay=1s,max-attempts=2,dead-letter={dlt}")
        try:
            wait_ready(port, broker)
            producer = Producer({"bootstrap.servers": BROKERS, "linger.ms": 0})

            # A consumer that dies between its retry's send and its acknowledgement: the retry is
            # in Kafka, the record is not acknowledged, and the share group delivers it again.
            producer.produce(work, key=b"crash", value=b"c")
            assert producer.flush(30) == 0
            dying = share_consumer(group, work)
            first, deadline = None, time.time() + 60
            while first is None:
                assert time.time() < deadline, "the share group delivered nothing in 60 s"
                for m in dying.poll(0.5) or []:
                    if not m.error():
                        first = m
            assert first.key() == b"crash"
            failed_at = {"crash": time.time()}
            producer.produce(**share_retry(first, topic=retry_topic, after=AFTER["crash"]))
            assert producer.flush(30) == 0
            dying.close()  # no acknowledgement: closing releases the record, as a dead consumer's lock expiring would

            producer.produce(work, key=b"flaky", value=b"f")
            producer.produce(work, key=b"doomed", value=b"d")
            assert producer.flush(30) == 0

            seen, processed, crash_redelivery = {}, [], None
            consumer = share_consumer(group, work)
            deadline = time.time() + 90
            while len(processed) < 2 or len(seen.get("doomed", [])) < 3:
                assert time.time() < deadline, f"not done in 90 s: seen {seen}, processed {processed}"
                for m in consumer.poll(0.5) or []:
                    if m.error():
                        continue
                    now, k, n = time.time(), m.key().decode(), attempt(m)
                    seen.setdefault(k, []).append(n)
                    if n > 0:
                        waited = now - failed_at[k]
                        assert waited >= AFTER[k], f"{k} attempt {n} back {waited:.3f} s after its failure"
                    if k == "crash" and n == 0:
                        crash_redelivery = m.delivery_count()
                    fails = {"flaky": n < 2, "crash": n == 0, "doomed": True}[k]
                    if fails:
                        failed_at[k] = now
                        retry_and_accept(producer, consumer, m, topic=retry_topic, after=AFTER[k],
                                         reason=f"{k} failed")
                    else:
                        processed.append(k)
                        consumer.acknowledge(m, AcknowledgeType.ACCEPT)
                consumer.commit_sync()
            consumer.close()
            assert crash_redelivery == 2, "the share group delivered the crashed consumer's record a second time"
            assert seen["flaky"] == [0, 1, 2] and seen["doomed"] == [0, 1, 2], seen

            time.sleep(AFTER["crash"] + 2)  # late duplicates have time to show
            returned = {}
            for m in read_all(work):
                if attempt(m) > 0:
                    key = f"{m.key().decode()}#{attempt(m)}"
                    returned[key] = returned.get(key, 0) + 1
            assert returned == {"crash#1": 1, "flaky#1": 1, "flaky#2": 1, "doomed#1": 1, "doomed#2": 1}, returned
            dead = read_all(dlt)
            assert [(m.key(), header(m, "delay-error"), header(m, "retry-reason")) for m in dead] == [
                (b"doomed", "retries-exhausted", "doomed failed")]
        finally:
            broker.terminate()
            broker.wait(30)
