"""The builders make records the broker's contract reads as intended."""

import datetime as dt

import pytest

from kafka_delay import Contract, Record, attempt, cancel, delayed, interpret, retry, share_retry

NOW = 1_763_700_000_000
SENT = NOW - 1_000


def read(rec, topic=None):
    """What the broker does with a produced record (timestamped SENT)."""
    return interpret(
        Record(topic or rec["topic"], rec["headers"], rec["key"], rec["value"], SENT), NOW, Contract()
    )


class Msg:
    """A consumed confluent_kafka.Message, as far as the helpers use one."""

    def __init__(self, topic, key, value, headers, partition=0, offset=0):
        self._t, self._k, self._v, self._h = topic, key, value, headers
        self._p, self._o = partition, offset

    def partition(self):
        return self._p

    def offset(self):
        return self._o

    def topic(self):
        return self._t

    def key(self):
        return self._k

    def value(self):
        return self._v

    def headers(self):
        return self._h


def test_delayed_after_until_and_id():
    out = read(delayed("delay.orders", "orders", "v", key="k", after="30s", id="job-1"))
    assert (out.kind, out.target, out.due_ms, out.id) == ("schedule", "orders", SENT + 30_000, b"job-1")
    assert read(delayed("delay.orders", "orders", b"v", after=dt.timedelta(seconds=2))).due_ms == SENT + 2_000
    assert read(delayed("delay.orders", "orders", b"v", after=0.25)).due_ms == SENT + 250
    assert read(delayed("delay.orders", "orders", b"v", after=2)).due_ms == SENT + 2_000
    until = dt.datetime(2025, 11, 21, 4, 41, tzinfo=dt.timezone.utc)
    assert read(delayed("delay.orders", "orders", b"v", until=until)).due_ms == NOW + 60_000
    assert read(delayed("delay.30s", "orders", b"v")).due_ms == SENT + 30_000


def test_user_headers_travel_and_bad_arguments_fail_here():
    out = read(delayed("delay.orders", "orders", b"v", after=0, headers=[("trace-id", "t-1")]))
    assert out.headers == [("trace-id", b"t-1")]
    for bad in (
        lambda: delayed("delay.o", "o", b"v", after=1, until=2),
        lambda: delayed("delay.o", "o", b"v", after="soon"),
        lambda: delayed("delay.o", "o", b"v", after=-5),
        lambda: delayed("delay.o", "o", b"v", until=dt.datetime(2030, 1, 1)),
        lambda: delayed("delay.o", "o", b"v", after=1, headers=[("delay-target", "x")]),
    ):
        with pytest.raises(ValueError):
            bad()


def test_cancel():
    out = read(cancel("delay.orders", "job-1", key="k"))
    assert (out.kind, out.id) == ("cancel", b"job-1")


def test_retry_counts_and_copies_headers():
    first = Msg("orders", b"k", b"v", [("trace-id", b"t"), ("delay-origin-offset", b"7")])
    assert attempt(first) == 0
    rec = retry(first, after=30, reason="inventory 503")
    out = read(rec)
    assert (out.kind, out.target, out.attempt, out.due_ms) == ("retry", "orders", 1, SENT + 30_000)
    assert ("trace-id", b"t") in out.headers and ("retry-reason", b"inventory 503") in out.headers
    assert not any(k == "delay-origin-offset" for k, _ in out.headers)
    back = Msg("orders", b"k", b"v", out.headers)
    assert attempt(back) == 1
    again = read(retry(back, after=dt.timedelta(milliseconds=500), max_attempts=1))
    assert (again.kind, again.dead_letter) == ("exhausted", "orders.dlt")


def test_a_number_means_seconds_in_delayed_and_in_retry_alike():
    consumed = Msg("orders", b"k", b"v", [])
    for after, ms in [(30, 30_000), (1.5, 1_500), (dt.timedelta(minutes=1), 60_000), ("250ms", 250)]:
        assert read(delayed("delay.orders", "orders", b"v", after=after)).due_ms == SENT + ms, after
        assert read(retry(consumed, after=after)).due_ms == SENT + ms, after
    for bad in (True, [30], -1, "soon"):
        with pytest.raises((TypeError, ValueError)):
            retry(consumed, after=bad)


def test_a_share_groups_retry_is_named_after_the_delivery_it_retries():
    consumed = Msg("orders", b"k", b"v", [("trace-id", b"t")], partition=3, offset=41)
    out = share_retry(consumed, after=30, reason="inventory 503")
    assert "partition" not in out, "a keyed retry goes where its key does"
    again = share_retry(Msg("orders", b"k", b"v", [("trace-id", b"t")], partition=3, offset=41), after=30)
    read_out, read_again = read(out), read(again)
    assert read_out.id == read_again.id == b"share-retry:orders/3/41", "a redelivery's retry replaces the first"
    assert (read_out.kind, read_out.target, read_out.due_ms) == ("retry", "orders", SENT + 30_000)
    assert read(share_retry(Msg("orders", b"k", b"v", [], 3, 42))).id != read_out.id
    keyless = Msg("orders", None, b"v", [], partition=0, offset=7)
    with pytest.raises(ValueError):
        share_retry(keyless)
    picks = {share_retry(keyless, partitions=6)["partition"] for _ in range(3)}
    assert len(picks) == 1 and picks <= set(range(6)), "one partition per delivery"
