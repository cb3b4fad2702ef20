"""Delayed retries for share groups (KIP-932) with confluent-kafka's `ShareConsumer`: the one
helper here talks to Kafka (it sends the retry and acknowledges the record); the record it sends
is `retry`'s, named after the delivery it retries."""

from __future__ import annotations

import zlib
from typing import Any, Dict, Optional

from . import contract as c
from .helpers import Duration, retry


def share_retry_id(msg: Any) -> str:
    """The `delay-id` of a share group's retry: the delivered record's topic, partition and
    offset, the same however often the share group delivers it."""
    return f"share-retry:{msg.topic()}/{msg.partition()}/{msg.offset()}"


def share_retry(msg: Any, *, partitions: Optional[int] = None, **kwargs: Any) -> Dict[str, Any]:
    """`retry(msg, **kwargs)` named after this delivery (`share_retry_id`). A record without a
    key goes to the retry topic's partition the id picks (`partitions`: how many the retry
    topic has), so a second retry of the same delivery meets the first."""
    rec = retry(msg, **kwargs)
    rid = share_retry_id(msg)
    rec["headers"].append((c.ID, rid.encode()))
    if rec["key"] is None:
        if not partitions:
            raise ValueError("a record without a key needs the retry topic's partition count")
        rec["partition"] = zlib.crc32(rid.encode()) % partitions
    return rec


def retry_and_accept(
    producer: Any,
    consumer: Any,
    msg: Any,
    *,
    topic: str = "delay.retry",
    after: Optional[Duration] = None,
    reason: Optional[str] = None,
    max_attempts: Optional[int] = None,
    timeout: float = 30.0,
) -> None:
    """For a `ShareConsumer` in explicit acknowledgement mode
    (`share.acknowledgement.mode=explicit`): sends `msg` back through kafka-delay's retry topic
    (as `retry` does), waits until Kafka has the retry, then accepts `msg` (the acknowledgement
    goes to the broker with the consumer's next poll or commit).

    If the consumer dies between the send and the acknowledgement, the share group delivers
    `msg` again and the retry sent then replaces the first while that one is pending (both carry
    `share_retry_id(msg)`): one retry, not two. A retry-after shorter than the group's record
    lock (`share.record.lock.duration.ms`, 30 s by default) can let the first fire before a dead
    consumer's record comes back; the second is then a second retry (at least once)."""
    from confluent_kafka import AcknowledgeType, KafkaException

    partitions = None
    if msg.key() is None:
        meta = producer.list_topics(topic, timeout=timeout).topics[topic]
        if meta.error is not None:
            raise KafkaException(meta.error)
        partitions = len(meta.partitions)
    rec = share_retry(
        msg, partitions=partitions, topic=topic, after=after, reason=reason, max_attempts=max_attempts
    )
    failed = []
    producer.produce(**rec, on_delivery=lambda err, _m: failed.append(err) if err else None)
    if producer.flush(timeout) > 0:
        raise KafkaException(f"the retry of {share_retry_id(msg)} was not sent within {timeout} s")
    if failed:
        raise KafkaException(failed[0])
    consumer.acknowledge(msg, AcknowledgeType.ACCEPT)
