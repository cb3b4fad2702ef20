"""Helpers for kafka-delay: delayed records, cancels and retries for confluent-kafka, and the
header contract as the broker applies it (tested on schemas/contract-vectors.json)."""

from .contract import Contract, Outcome, Policy, Record, Rejected, interpret  # noqa: F401
from .helpers import attempt, cancel, delayed, retry  # noqa: F401
from .share import retry_and_accept, share_retry, share_retry_id  # noqa: F401
