"""The shared contract vectors (schemas/contract-vectors.json): the Python contract gives every
outcome the broker gives."""

import json
import pathlib

import pytest

from kafka_delay.contract import Contract, Policy, Record, Rejected, interpret

VECTORS = json.loads(
    (pathlib.Path(__file__).resolve().parents[3] / "schemas" / "contract-vectors.json").read_text()
)


def value(v):
    """A vector value: a string, null, {"hex": ..} or {"repeat": s, "times": n}."""
    if v is None:
        return None
    if isinstance(v, str):
        return v.encode()
    if "hex" in v:
        return bytes.fromhex(v["hex"])
    return (v["repeat"] * v["times"]).encode()


def contract():
    spec = VECTORS["contract"]
    return Contract(
        source_pattern=spec["source_pattern"],
        retry_topics=spec["retry_topics"],
        max_delay_ms=spec["max_delay_ms"],
        max_record_bytes=spec["max_record_bytes"],
        retry_default=Policy.parse(spec["retry_default"]),
    )


def has_headers(name, got, want):
    for k, v in want or []:
        assert [hv for hk, hv in got if hk == k] == [value(v)], f"{name}: header {k}"


@pytest.mark.parametrize("case", VECTORS["cases"], ids=[c["name"] for c in VECTORS["cases"]])
def test_vector(case):
    name = case["name"]
    rec = Record(
        topic=case["topic"],
        headers=[(k, value(v)) for k, v in case["headers"]],
        key=value(case["key"]),
        value=value(case["value"]),
        timestamp_ms=case["timestamp_ms"],
    )
    (kind, want), = case["expect"].items()
    if kind == "reject":
        with pytest.raises(Rejected) as e:
            interpret(rec, VECTORS["now_ms"], contract())
        assert e.value.code == want and e.value.detail
        return
    got = interpret(rec, VECTORS["now_ms"], contract())
    assert got.kind == kind, name
    if kind == "cancel":
        assert got.id == value(want["id"])
        return
    assert got.target == want["target"]
    assert got.due_ms == want["due_ms"]
    if kind == "schedule":
        assert got.id == value(want["id"])
        if "key" in want:
            assert got.key == value(want["key"])
        if "value" in want:
            assert got.value == value(want["value"])
        if "headers" in want:
            assert got.headers == [(k, value(v)) for k, v in want["headers"]]
    elif kind == "retry":
        assert got.attempt == want["attempt"]
        has_headers(name, got.headers, want.get("headers"))
    else:
        assert got.dead_letter == want["dead_letter"]
        has_headers(name, got.headers, want.get("headers"))
