"""End to end with confluent-kafka against a real Kafka and the kafka-delay binary: a delayed
record and a retry built by the helpers arrive when due, with the right headers.

Needs KAFKA_DELAY_TEST_BROKERS (Apache Kafka under `make test`) and KAFKA_DELAY_BIN (the
kafka-delay binary); scripts/test-external.sh sets both."""

import os
import socket
import subprocess
import tempfile
import time
import urllib.request
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kafka_delay import attempt, delayed, retry

BROKERS = os.environ.get("KAFKA_DELAY_TEST_BROKERS", "")
BIN = os.environ.get("KAFKA_DELAY_BIN", "")


def header(msg, name):
    for k, v in msg.headers() or []:
        if k == name:
            return v.decode()
    return None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(port, proc, within=60):
    deadline = time.time() + within
    while time.time() < deadline:
        assert proc.poll() is None, f"kafka-delay exited with {proc.returncode}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"kafka-delay not ready within {within} s")


def spawn_broker(run, data, port, *flags):
    """kafka-delay for the test `run`: its delay topics delay.RUN.*, its retry topic
    delay.RUN.retry, group kd-RUN, with `flags` more."""
    return subprocess.Popen(
        [BIN, "run", "--brokers", BROKERS, "--data-dir", data, "--http-addr", f"127.0.0.1:{port}",
         "--group-id", f"kd-{run}", "--instance-id", f"i-{run}",
         "--source-pattern", rf"^delay\.{run}\..+", "--retry-topics", rf"^delay\.{run}\.retry$",
         "--topic-refresh", "500ms", *flags],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def next_message(consumer, want, within=60):
    """The first message for which want(msg) holds, polling at most `within` seconds."""
    deadline = time.time() + within
    while time.time() < deadline:
        msg = consumer.poll(0.5)
        if msg is None or msg.error():
            continue
        if want(msg):
            return msg
    raise AssertionError(f"no such message within {within} s")


def test_a_delayed_record_and_a_retry_arrive_when_due():
    assert BROKERS and BIN, "set KAFKA_DELAY_TEST_BROKERS and KAFKA_DELAY_BIN (scripts/test-external.sh does)"
    run = "py_" + uuid.uuid4().hex[:10]
    delay_topic, retry_topic, target, dlt = f"delay.{run}.in", f"delay.{run}.retry", f"out-{run}", f"dlt-{run}"
    admin = AdminClient({"bootstrap.servers": BROKERS})
    for f in admin.create_topics([NewTopic(t, 1, 1) for t in (delay_topic, retry_topic, target, dlt)]).values():
        f.result(30)
    port = free_port()
    with tempfile.TemporaryDirectory() as data:
        broker = spawn_broker(run, data, port, "--dead-letter-topic", dlt)
        try:
            wait_ready(port, broker)
            producer = Producer({"bootstrap.servers": BROKERS, "linger.ms": 0})
            consumer = Consumer({"bootstrap.servers": BROKERS, "group.id": f"reader-{run}",
                                 "enable.auto.commit": False})
            consumer.assign([TopicPartition(target, 0, 0)])

            sent = int(time.time() * 1000)
            producer.produce(**delayed(delay_topic, target, b"hello", key=b"k1", after="2s",
                                       headers=[("trace-id", "t-1")]))
            assert producer.flush(30) == 0
            msg = next_message(consumer, lambda m: m.key() == b"k1")
            due = int(header(msg, "delay-due-ms"))
            assert due >= sent + 2_000 - 50, "due 2 s after the record's timestamp"
            assert int(header(msg, "delay-fired-ms")) >= due, "never early"
            assert (msg.value(), header(msg, "trace-id")) == (b"hello", "t-1")
            assert header(msg, "delay-target") is None, "control headers are not published"
            assert attempt(msg) == 0

            retried_at = int(time.time() * 1000)
            producer.produce(**retry(msg, topic=retry_topic, after=2, reason="inventory 503"))
            assert producer.flush(30) == 0
            back = next_message(consumer, lambda m: m.key() == b"k1" and header(m, "retry-attempt"))
            assert attempt(back) == 1
            assert int(header(back, "delay-due-ms")) >= retried_at + 2_000 - 50
            assert int(header(back, "delay-fired-ms")) >= int(header(back, "delay-due-ms"))
            assert header(back, "trace-id") == "t-1" and header(back, "retry-reason") == "inventory 503"
            consumer.close()
        finally:
            broker.terminate()
            broker.wait(30)
