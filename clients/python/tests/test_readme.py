"""The README's Python snippet, run as written against a recording producer."""

import pathlib
import re

from kafka_delay import Contract, Record, interpret

README = (pathlib.Path(__file__).resolve().parents[3] / "README.md").read_text()
NOW = 1_763_700_000_000


class Recorder:
    def __init__(self):
        self.sent = []

    def produce(self, **kwargs):
        self.sent.append(kwargs)


class Msg:
    def topic(self):
        return "orders"

    def key(self):
        return b"order-42"

    def value(self):
        return b'{"id":42}'

    def headers(self):
        return [("trace-id", b"t-1")]


def test_the_readme_python_snippet_schedules_a_reminder_and_a_retry():
    section = README[README.index("**From Python**"):]
    snippet = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    producer = Recorder()
    exec(snippet, {"producer": producer, "body": b"hi", "user": "u-7", "msg": Msg()})
    reminder, again = producer.sent
    read = lambda r: interpret(Record(r["topic"], r["headers"], r["key"], r["value"], NOW), NOW, Contract())
    out = read(reminder)
    assert (out.kind, out.target, out.due_ms, out.id) == ("schedule", "emails", NOW + 1_800_000, b"remind-u-7")
    out = read(again)
    assert (out.kind, out.target, out.attempt, out.due_ms) == ("retry", "orders", 1, NOW + 30_000)
    assert ("trace-id", b"t-1") in out.headers and ("retry-reason", b"inventory 503") in out.headers


class ShareMsg(Msg):
    def partition(self):
        return 2

    def offset(self):
        return 41


class Flushing(Recorder):
    def produce(self, on_delivery=None, **kwargs):
        super().produce(**kwargs)
        on_delivery(None, None)

    def flush(self, timeout):
        return 0


class Acknowledging:
    def __init__(self):
        self.acked = []

    def acknowledge(self, msg, ack_type):
        self.acked.append((msg, ack_type))


def test_the_readme_share_group_call_sends_a_named_retry_and_accepts_the_message():
    section = README[README.index("**In Python** (confluent-kafka's `ShareConsumer`"):]
    call = re.search(r"`(retry_and_accept\(.*?\))`", section).group(1)
    producer, consumer, msg = Flushing(), Acknowledging(), ShareMsg()
    exec(f"from kafka_delay import retry_and_accept\n{call}", {"producer": producer, "consumer": consumer, "msg": msg})
    (sent,) = producer.sent
    out = interpret(Record(sent["topic"], sent["headers"], sent["key"], sent["value"], NOW), NOW, Contract())
    assert (out.kind, out.target, out.attempt, out.due_ms, out.id) == (
        "retry", "orders", 1, NOW + 30_000, b"share-retry:orders/2/41")
    from confluent_kafka import AcknowledgeType

    assert consumer.acked == [(msg, AcknowledgeType.ACCEPT)]
