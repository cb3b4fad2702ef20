"""kafka-delay's header contract, as the broker applies it to a consumed record.

`interpret(record, now_ms, contract)` says what the broker will do with a record: schedule it
(target, due time, id), count it as a retry, dead-letter an exhausted retry, cancel a pending
record, or reject it with a `delay-error` code. It is a pure function of the record and the
clock, tested on the shared vectors in `schemas/contract-vectors.json`, which the broker's own
contract tests read as well.
"""

from __future__ import annotations

import email.utils
import math
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import List, Optional, Sequence, Tuple

# Control headers (the broker's, never published) and the retry headers.
TARGET = "delay-target"
UNTIL = "delay-until"
AFTER = "delay-after"
ID = "delay-id"
SCHEDULER_EPOCH = "scheduler-epoch"
SCHEDULER_TARGET_TOPIC = "scheduler-target-topic"
SCHEDULER_TARGET_KEY = "scheduler-target-key"
ERROR = "delay-error"
ERROR_DETAIL = "delay-error-detail"
RETRY_AFTER = "retry-after"
RETRY_ATTEMPT = "retry-attempt"
RETRY_FIRST_FAILED_AT = "retry-first-failed-at"
RETRY_MAX_ATTEMPTS = "retry-max-attempts"
RETRY_REASON = "retry-reason"
RESERVED_PREFIXES = ("delay-", "scheduler-")
RETRY_MANAGED = (RETRY_AFTER, RETRY_ATTEMPT, RETRY_FIRST_FAILED_AT)

MAX_ATTEMPTS_LIMIT = 1_000_000
MIN_PLAUSIBLE_EPOCH_MS = 100_000_000_000
MAX_I64 = 2**63 - 1
MAX_U64 = 2**64 - 1
MAX_TOPIC_LEN = 249
UNITS = (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1_000), ("ms", 1))
RFC3339 = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$"
)

Header = Tuple[str, Optional[bytes]]


class Rejected(Exception):
    """A record the broker dead-letters at ingest: `code` is its `delay-error`."""

    def __init__(self, code: str, detail: str):
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


class TimeError(ValueError):
    pass


@dataclass
class Policy:
    """A retry backoff policy (the broker's `--retry-default` / `--retry-policy` keys)."""

    backoff: str = "exponential"
    delay_ms: int = 1_000
    factor: float = 2.0
    max_delay_ms: int = 300_000
    jitter: float = 0.1
    max_attempts: int = 5
    dead_letter: str = "{target}.dlt"

    @staticmethod
    def parse(spec: str, base: Optional["Policy"] = None) -> "Policy":
        p = Policy(**(base or Policy()).__dict__)
        for part in filter(None, (s.strip() for s in spec.split(","))):
            key, _, value = part.partition("=")
            if key == "backoff":
                if value not in ("exponential", "fixed"):
                    raise ValueError(f"backoff '{value}' (use exponential or fixed)")
                p.backoff = value
            elif key == "delay":
                p.delay_ms = parse_duration_ms(value)
            elif key == "factor":
                p.factor = float(value)
            elif key == "max-delay":
                p.max_delay_ms = parse_duration_ms(value)
            elif key == "jitter":
                p.jitter = float(value)
            elif key == "max-attempts":
                p.max_attempts = int(value)
            elif key == "dead-letter":
                p.dead_letter = value
            else:
                raise ValueError(f"unknown key '{key}'")
        return p

    def delay_for(self, attempt: int, u: float) -> int:
        """The wait before retry `attempt` (1-based), `u` uniform in [0, 1) for the jitter."""
        n = max(attempt, 1) - 1
        if self.backoff == "fixed":
            raw = float(self.delay_ms)
        else:
            raw = min(self.delay_ms * self.factor ** min(n, 1_000), float(self.max_delay_ms))
        jittered = raw * (1.0 + self.jitter * (2.0 * min(max(u, 0.0), 1.0) - 1.0))
        if self.backoff != "fixed":
            jittered = min(jittered, float(self.max_delay_ms))
        return max(int(math.floor(jittered + 0.5)), 0)

    def dead_letter_topic(self, target: str) -> str:
        return self.dead_letter.replace("{target}", target)


@dataclass
class Contract:
    """The rules the broker checks records against (its flags of the same names)."""

    source_pattern: str = r"^delay\..+"
    retry_topics: str = r"^delay\.retry$"
    max_delay_ms: int = 365 * 86_400_000
    max_record_bytes: int = 1_048_576
    retry_default: Policy = field(default_factory=Policy)
    target_allow: Optional[str] = None
    allow_internal_targets: bool = False


@dataclass
class Record:
    """A consumed record: what the broker sees of it."""

    topic: str
    headers: Sequence[Header]
    key: Optional[bytes] = None
    value: Optional[bytes] = None
    timestamp_ms: Optional[int] = None


@dataclass
class Outcome:
    """What the broker does with a record. `kind` is schedule, retry, exhausted or cancel."""

    kind: str
    target: Optional[str] = None
    due_ms: Optional[int] = None
    id: Optional[bytes] = None
    key: Optional[bytes] = None
    value: Optional[bytes] = None
    headers: List[Header] = field(default_factory=list)
    attempt: Optional[int] = None
    dead_letter: Optional[str] = None


def parse_duration_ms(text: str) -> int:
    """`250ms`, `30s`, `5m`, `2h`, `1d`, `1h30m`: whole numbers, units largest first."""
    if not text:
        raise TimeError("empty duration")
    total, i, last = 0, 0, None
    while i < len(text):
        start = i
        while i < len(text) and text[i].isascii() and text[i].isdigit():
            i += 1
        if start == i:
            raise TimeError(f"'{text}' is not a duration (like 30s, 5m, 1h30m, 250ms)")
        number = int(text[start:i])
        unit_start = i
        while i < len(text) and text[i].isascii() and text[i].isalpha():
            i += 1
        unit = text[unit_start:i]
        ranks = [u for u, _ in UNITS]
        if unit not in ranks:
            raise TimeError(f"'{text}' needs a unit: d, h, m, s or ms")
        rank = ranks.index(unit)
        if last is not None and rank <= last:
            raise TimeError(f"'{text}' repeats a unit or puts a smaller one first")
        last = rank
        total += number * UNITS[rank][1]
        if total > MAX_U64:
            raise TimeError(f"'{text}' is out of range")
    return total


def parse_integer(text: str, what: str) -> int:
    if not text:
        raise TimeError(f"empty {what}")
    if text.startswith("-") and len(text) > 1 and _digits(text[1:]):
        raise TimeError(f"{what} '{text}' is negative")
    if not _digits(text):
        raise TimeError(f"{what} '{text}' is not a whole number of digits")
    value = int(text)
    if value > MAX_I64:
        raise TimeError(f"{what} '{text}' is out of range")
    return value


def parse_epoch_ms_or_rfc3339(text: str) -> int:
    if _digits(text) or (text.startswith("-") and "T" not in text):
        ms = parse_integer(text, "epoch milliseconds")
        if ms < MIN_PLAUSIBLE_EPOCH_MS:
            raise TimeError(f"'{text}' looks like epoch seconds (multiply by 1000)")
        return ms
    if not RFC3339.match(text):
        raise TimeError(f"'{text}' is neither epoch milliseconds nor RFC 3339")
    parsed = datetime.fromisoformat(text.replace("z", "Z").replace("t", "T"))
    ms = round(parsed.timestamp() * 1000)
    if ms < 0:
        raise TimeError(f"'{text}' is before the Unix epoch")
    return ms


def parse_retry_after(text: str, base_ms: int) -> int:
    digits = text[1:] if text.startswith("-") else text
    if digits and _digits(digits):
        return base_ms + parse_integer(text, "seconds") * 1_000
    if "," in text or text.endswith("GMT"):
        try:
            parsed = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError) as e:
            raise TimeError(f"'{text}' is not an HTTP-date") from e
        return round(parsed.timestamp() * 1000)
    return base_ms + parse_duration_ms(text)


def attempt(headers: Sequence[Header]) -> int:
    """The retry count a record carries: 0 on a first delivery."""
    for key, value in headers:
        if key == RETRY_ATTEMPT and value is not None:
            return int(value.decode())
    return 0


def interpret(rec: Record, now_ms: int, contract: Contract) -> Outcome:
    """What the broker does with `rec` at wall-clock time `now_ms`; raises `Rejected`."""
    size = len(rec.key or b"") + len(rec.value or b"")
    size += sum(len(k.encode()) + len(v or b"") for k, v in rec.headers)
    if size > contract.max_record_bytes:
        raise Rejected("oversized", f"record is {size} bytes")
    target = _control(rec.headers, TARGET)
    compat_target = _control(rec.headers, SCHEDULER_TARGET_TOPIC)
    delay_id = _control(rec.headers, ID)
    compat = target is None and (
        compat_target is not None
        or _control(rec.headers, SCHEDULER_EPOCH) is not None
        or (rec.value is None and delay_id is None and rec.key is not None)
    )
    if compat:
        return _interpret_compat(rec, compat_target, now_ms, contract)
    id_ = delay_id.encode() if delay_id is not None else None
    if rec.value is None and id_ is not None:
        return Outcome("cancel", id=id_)
    if target is None:
        raise Rejected("missing-target", "no delay-target header")
    check_target(target, contract)
    if re.search(contract.retry_topics, rec.topic) or _control(rec.headers, RETRY_AFTER) is not None:
        return _interpret_retry(rec, target, id_, now_ms, contract)
    return Outcome(
        "schedule",
        target=target,
        due_ms=_due_time(rec, now_ms, contract),
        id=id_,
        key=rec.key,
        value=rec.value,
        headers=_user_headers(rec.headers),
    )


def check_target(target: str, contract: Contract) -> None:
    if not target:
        raise Rejected("invalid-target", "target topic is empty")
    if len(target.encode()) > MAX_TOPIC_LEN:
        raise Rejected("invalid-target", "target topic is longer than 249 characters")
    if target in (".", ".."):
        raise Rejected("invalid-target", f"'{target}' is not a legal topic name")
    if not re.fullmatch(r"[A-Za-z0-9._-]+", target):
        raise Rejected("invalid-target", f"'{target}' has characters Kafka does not allow")
    if target.startswith("__") and not contract.allow_internal_targets:
        raise Rejected("target-internal", f"'{target}' is internal")
    if re.search(contract.source_pattern, target):
        raise Rejected("target-loop", f"'{target}' matches the source pattern and would loop")
    if contract.target_allow is not None and not re.search(contract.target_allow, target):
        raise Rejected("target-not-allowed", f"'{target}' does not match the allow-list")


def _digits(text: str) -> bool:
    return all("0" <= c <= "9" for c in text)


def _control(headers: Sequence[Header], name: str) -> Optional[str]:
    found: Optional[str] = None
    for key, value in headers:
        if key != name:
            continue
        if value is None:
            raise Rejected("invalid-header", f"header {name} has no value")
        try:
            text = value.decode("utf-8")
        except UnicodeDecodeError:
            raise Rejected("invalid-header", f"header {name} is not UTF-8") from None
        if found is not None and found != text:
            raise Rejected("conflicting-headers", f"header {name} appears with different values")
        found = text
    return found


def _user_headers(headers: Sequence[Header]) -> List[Header]:
    return [(k, v) for k, v in headers if not k.startswith(RESERVED_PREFIXES)]


def _within_max_delay(due: int, now_ms: int, contract: Contract) -> int:
    if due > now_ms + contract.max_delay_ms:
        raise Rejected("due-too-far", f"due time {due} is over the maximum delay")
    return due


def _topic_delay_ms(topic: str) -> Optional[int]:
    if "." not in topic:
        return None
    try:
        return parse_duration_ms(topic.rsplit(".", 1)[1])
    except TimeError:
        return None


def _due_time(rec: Record, now_ms: int, contract: Contract) -> int:
    until = _control(rec.headers, UNTIL)
    after = _control(rec.headers, AFTER)
    epoch = _control(rec.headers, SCHEDULER_EPOCH)
    if sum(x is not None for x in (until, after, epoch)) > 1:
        raise Rejected("conflicting-due-time", "more than one of delay-until, delay-after, scheduler-epoch")
    base = rec.timestamp_ms if rec.timestamp_ms is not None else now_ms
    try:
        if until is not None:
            due = parse_epoch_ms_or_rfc3339(until)
        elif after is not None:
            digits = after[1:] if after.startswith("-") else after
            ms = parse_integer(after, "milliseconds") if digits and _digits(digits) else parse_duration_ms(after)
            due = base + ms
            if due > MAX_U64:
                raise TimeError(f"delay-after '{after}' overflows")
        elif epoch is not None:
            due = parse_integer(epoch, "epoch seconds") * 1_000
        else:
            fixed = _topic_delay_ms(rec.topic)
            if fixed is None:
                raise Rejected("missing-due-time", "no delay-until or delay-after header")
            due = base + fixed
    except TimeError as e:
        raise Rejected("invalid-due-time", str(e)) from None
    return _within_max_delay(due, now_ms, contract)


def _interpret_compat(rec: Record, target: Optional[str], now_ms: int, contract: Contract) -> Outcome:
    if not rec.key:
        raise Rejected("missing-id", "scheduler-* record without a key: the key is the schedule id")
    if rec.value is None:
        return Outcome("cancel", id=rec.key)
    if target is None:
        raise Rejected("missing-target", "no delay-target or scheduler-target-topic header")
    check_target(target, contract)
    due = _due_time(rec, now_ms, contract)
    key = _control(rec.headers, SCHEDULER_TARGET_KEY)
    return Outcome(
        "schedule",
        target=target,
        due_ms=due,
        id=rec.key,
        key=key.encode() if key is not None else rec.key,
        value=rec.value,
        headers=_user_headers(rec.headers),
    )


def _interpret_retry(rec: Record, target: str, id_: Optional[bytes], now_ms: int, contract: Contract) -> Outcome:
    def number(name: str) -> Optional[int]:
        text = _control(rec.headers, name)
        if text is None:
            return None
        try:
            return parse_integer(text, name)
        except TimeError as e:
            raise Rejected("invalid-retry-header", str(e)) from None

    previous = number(RETRY_ATTEMPT) or 0
    if previous > MAX_ATTEMPTS_LIMIT:
        raise Rejected("invalid-retry-header", f"retry-attempt {previous} is over {MAX_ATTEMPTS_LIMIT}")
    first_failed = number(RETRY_FIRST_FAILED_AT)
    if first_failed is not None and first_failed < MIN_PLAUSIBLE_EPOCH_MS:
        raise Rejected("invalid-retry-header", "retry-first-failed-at must be epoch milliseconds")
    lowered = number(RETRY_MAX_ATTEMPTS)
    retry_after = _control(rec.headers, RETRY_AFTER)
    base = rec.timestamp_ms if rec.timestamp_ms is not None else now_ms
    first_failed = first_failed if first_failed is not None else base
    policy = contract.retry_default
    maximum = policy.max_attempts if lowered is None else min(lowered, policy.max_attempts)
    attempt_no = previous + 1
    headers = [(k, v) for k, v in _user_headers(rec.headers) if k not in RETRY_MANAGED]
    if attempt_no > maximum:
        dead_letter = policy.dead_letter_topic(target)
        detail = f"{previous} retries of {maximum} used for target '{target}'"
        try:
            check_target(dead_letter, contract)
        except Rejected as rej:
            if rej.code != "target-not-allowed":
                raise Rejected("retries-exhausted", f"{detail}; its dead-letter topic is not usable") from None
        headers += [
            (TARGET, target.encode()),
            (RETRY_ATTEMPT, str(previous).encode()),
            (RETRY_FIRST_FAILED_AT, str(first_failed).encode()),
            (ERROR, b"retries-exhausted"),
            (ERROR_DETAIL, detail.encode()),
        ]
        return Outcome("exhausted", target=target, dead_letter=dead_letter, due_ms=now_ms,
                       id=id_, key=rec.key, value=rec.value, headers=headers)
    explicit = _control(rec.headers, UNTIL) is not None or _control(rec.headers, AFTER) is not None
    if retry_after is not None and explicit:
        raise Rejected("conflicting-due-time", "retry-after together with delay-until or delay-after")
    if retry_after is not None:
        try:
            due = parse_retry_after(retry_after, base)
        except TimeError as e:
            raise Rejected("invalid-retry-header", f"retry-after: {e}") from None
        due = _within_max_delay(due, now_ms, contract)
    elif explicit:
        due = _due_time(rec, now_ms, contract)
    else:
        seed = (base ^ (attempt_no << 48)) & MAX_U64
        for b in rec.key or b"":
            seed = ((seed ^ b) * 0x0100_0000_01B3) & MAX_U64
        due = _within_max_delay(base + policy.delay_for(attempt_no, unit_interval(seed)), now_ms, contract)
    headers += [(RETRY_ATTEMPT, str(attempt_no).encode()), (RETRY_FIRST_FAILED_AT, str(first_failed).encode())]
    return Outcome("retry", target=target, due_ms=due, id=id_, key=rec.key, value=rec.value,
                   headers=headers, attempt=attempt_no)


def unit_interval(seed: int) -> float:
    """A number in [0, 1) from `seed` (SplitMix64), as the broker computes jitter."""
    z = (seed + 0x9E37_79B9_7F4A_7C15) & MAX_U64
    z = ((z ^ (z >> 30)) * 0xBF58_476D_1CE4_E5B9) & MAX_U64
    z = ((z ^ (z >> 27)) * 0x94D0_49BB_1331_11EB) & MAX_U64
    z ^= z >> 31
    return (z >> 11) / float(1 << 53)
