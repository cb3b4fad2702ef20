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
