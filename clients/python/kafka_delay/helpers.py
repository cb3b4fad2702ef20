"""Records for kafka-delay, built for confluent-kafka: each builder returns the keyword
arguments of `Producer.produce` (topic, key, value, headers), and `attempt` reads a consumed
`Message`. Nothing here talks to Kafka."""

from __future__ import annotations

import datetime as dt
from typing import Any, Dict, List, Optional, Tuple, Union

from . import contract as c

# A delay: seconds (an int or a float, as time.sleep takes them), a timedelta, or a duration
# string such as "30s" or "500ms". The same in `delayed` and in `retry`.
Duration = Union[int, float, dt.timedelta, str]
Instant = Union[int, dt.datetime]
Bytes = Union[bytes, str, None]


def _bytes(v: Bytes) -> Optional[bytes]:
    return v.encode() if isinstance(v, str) else v


def _ms(d: Duration) -> Union[int, str]:
    """Whole milliseconds of a number of seconds or a timedelta; a duration string checked and
    kept as written."""
    if isinstance(d, bool):
        raise TypeError(f"a delay is seconds, a timedelta or a duration string, not {d!r}")
    if isinstance(d, dt.timedelta):
        ms = d // dt.timedelta(milliseconds=1)
    elif isinstance(d, (int, float)):
        ms = round(d * 1000)
    elif isinstance(d, str):
        c.parse_duration_ms(d)
        return d
    else:
        raise TypeError(f"a delay is seconds, a timedelta or a duration string, not {d!r}")
    if ms < 0:
        raise ValueError(f"a delay cannot be negative: {d!r}")
    return ms


def _instant(t: Instant) -> str:
    """Epoch milliseconds (int) or an aware datetime."""
    if isinstance(t, dt.datetime):
        if t.tzinfo is None:
            raise ValueError("a naive datetime has no time zone: give one (e.g. timezone.utc)")
        return str(round(t.timestamp() * 1000))
    return str(t)


def delayed(
    topic: str,
    target: str,
    value: Bytes,
    *,
    key: Bytes = None,
    after: Optional[Duration] = None,
    until: Optional[Instant] = None,
    id: Optional[str] = None,
    headers: Optional[List[Tuple[str, Bytes]]] = None,
) -> Dict[str, Any]:
    """A record for the delay topic `topic` that kafka-delay publishes to `target` when due:
    `after` the record's timestamp (seconds, a timedelta, or a duration string such as '30m'),
    or `until` a time (give one, or neither on a fixed-delay topic such as `delay.30s`). `id` names it, so that a later record with the same id replaces
    it and `cancel` drops it."""
    if after is not None and until is not None:
        raise ValueError("give after or until, not both")
    hs: List[Tuple[str, Optional[bytes]]] = [(k, _bytes(v)) for k, v in headers or []]
    for k, _ in hs:
        if k.startswith(c.RESERVED_PREFIXES):
            raise ValueError(f"header {k} belongs to kafka-delay")
    hs.append((c.TARGET, target.encode()))
    if after is not None:
        hs.append((c.AFTER, str(_ms(after)).encode()))
    if until is not None:
        hs.append((c.UNTIL, _instant(until).encode()))
    if id is not None:
        hs.append((c.ID, id.encode()))
    return {"topic": topic, "key": _bytes(key), "value": _bytes(value), "headers": hs}


def cancel(topic: str, id: str, *, key: Bytes = None) -> Dict[str, Any]:
    """Drops the pending record named `id`. Ids are scoped to the source partition: send it
    with the same key (and to the same topic) as the record it cancels."""
    return {"topic": topic, "key": _bytes(key), "value": None, "headers": [(c.ID, id.encode())]}


def attempt(msg: Any) -> int:
    """The retry count of a consumed message: 0 on a first delivery, n on the n-th retry."""
    return c.attempt(msg.headers() or [])


def retry(
    msg: Any,
    *,
    topic: str = "delay.retry",
    after: Optional[Duration] = None,
    reason: Optional[str] = None,
    max_attempts: Optional[int] = None,
) -> Dict[str, Any]:
    """The consumed message `msg` sent back through kafka-delay's retry topic: it returns to
    the topic it came from `after` (seconds, a timedelta, or a duration string such as '500ms',
    as in `delayed`; by default the target's backoff policy decides), counted in `retry-attempt`, with
    its key, value and headers. The broker's headers it carried are left behind."""
    hs = [(k, v) for k, v in (msg.headers() or []) if not k.startswith("delay-") and k != c.RETRY_AFTER]
    hs.append((c.TARGET, msg.topic().encode()))
    if after is not None:
        ms = _ms(after)
        hs.append((c.RETRY_AFTER, (ms if isinstance(ms, str) else f"{ms}ms").encode()))
    if reason is not None:
        hs = [(k, v) for k, v in hs if k != c.RETRY_REASON] + [(c.RETRY_REASON, reason.encode())]
    if max_attempts is not None:
        hs = [(k, v) for k, v in hs if k != c.RETRY_MAX_ATTEMPTS]
        hs.append((c.RETRY_MAX_ATTEMPTS, str(max_attempts).encode()))
    return {"topic": topic, "key": msg.key(), "value": msg.value(), "headers": hs}
