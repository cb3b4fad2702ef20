//! Every typed answer of the admin API against the 200 response `schemas/admin.openapi.json`
//! documents for its route: the types, the required fields, and no field the document does not
//! name (what a client generated from the document would read).

use serde_json::{json, Value};

use super::answers::{
    value, Answered, BulkResult, Cancelled, Elsewhere, GroupBulk, GroupListing, HeaderText,
    Listing, Member, Moved, Owners, Problem, Record, Source, Summary,
};
use crate::changelog::owners::Owner;

fn doc() -> Value {
    serde_json::from_str(include_str!("../../../../schemas/admin.openapi.json")).unwrap()
}

/// The schema of `method path`'s 200 answer.
fn answer_schema(doc: &Value, method: &str, path: &str) -> Value {
    doc["paths"][path][method]["responses"]["200"]["content"]["application/json"]["schema"].clone()
}

fn resolve<'a>(doc: &'a Value, schema: &'a Value) -> &'a Value {
    match schema.get("$ref").and_then(Value::as_str) {
        Some(r) => {
            let name = r.trim_start_matches("#/components/schemas/");
            resolve(doc, &doc["components"]["schemas"][name])
        }
        None => schema,
    }
}

fn type_matches(want: &str, v: &Value) -> bool {
    match want {
        "string" => v.is_string(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        "array" => v.is_array(),
        "object" => v.is_object(),
        "null" => v.is_null(),
        other => panic!("schema type {other} not known to this check"),
    }
}

/// The properties a schema names, with those of its `allOf` parts.
fn properties(doc: &Value, schema: &Value) -> serde_json::Map<String, Value> {
    let schema = resolve(doc, schema);
    let mut out = schema["properties"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    for part in schema["allOf"].as_array().into_iter().flatten() {
        out.extend(properties(doc, part));
    }
    out
}

fn required(doc: &Value, schema: &Value) -> Vec<String> {
    let schema = resolve(doc, schema);
    let mut out: Vec<String> = schema["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r.as_str().map(str::to_owned))
        .collect();
    for part in schema["allOf"].as_array().into_iter().flatten() {
        out.extend(required(doc, part));
    }
    out
}

/// What is wrong with `v` against `schema`, each at its JSON path.
fn check(doc: &Value, schema: &Value, v: &Value, at: &str, wrong: &mut Vec<String>) {
    let schema = resolve(doc, schema);
    if let Some(options) = schema["oneOf"].as_array() {
        let fits = options.iter().any(|o| {
            let mut w = Vec::new();
            check(doc, o, v, at, &mut w);
            w.is_empty()
        });
        if !fits {
            wrong.push(format!("{at}: {v} fits none of oneOf"));
        }
        return;
    }
    let types: Vec<&str> = match &schema["type"] {
        Value::String(t) => vec![t.as_str()],
        Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
        _ => vec![],
    };
    if !types.is_empty() && !types.iter().any(|t| type_matches(t, v)) {
        wrong.push(format!("{at}: {v} is not {types:?}"));
        return;
    }
    match v {
        Value::Object(fields) if !types.is_empty() || schema.get("allOf").is_some() => {
            let props = properties(doc, schema);
            for r in required(doc, schema) {
                if !fields.contains_key(&r) {
                    wrong.push(format!("{at}: required {r} missing"));
                }
            }
            for (k, fv) in fields {
                match props.get(k) {
                    Some(s) => check(doc, s, fv, &format!("{at}.{k}"), wrong),
                    None if props.is_empty() => {} // a free-form object
                    None => wrong.push(format!("{at}: {k} is not documented")),
                }
            }
        }
        Value::Array(items) => {
            if let Some(s) = schema.get("items") {
                for (i, item) in items.iter().enumerate() {
                    check(doc, s, item, &format!("{at}[{i}]"), wrong);
                }
            }
        }
        _ => {}
    }
}

fn assert_fits(method: &str, path: &str, answer: &Value) {
    let doc = doc();
    let schema = answer_schema(&doc, method, path);
    assert!(
        !schema.is_null(),
        "{method} {path}: no 200 answer documented"
    );
    let mut wrong = Vec::new();
    check(&doc, &schema, answer, "$", &mut wrong);
    assert!(wrong.is_empty(), "{method} {path}: {wrong:#?}\n{answer:#}");
}

fn summary() -> Summary {
    Summary {
        id: "00010000000002a0".into(),
        due_ms: 1_700_000_000_000,
        due: "2023-11-14T22:13:20.000Z".into(),
        target: "orders".into(),
        source: Source {
            topic: "delay.orders".into(),
            partition: 1,
            offset: 672,
        },
        reference: "delay.orders:1:672".into(),
    }
}

fn elsewhere() -> Vec<Option<Elsewhere>> {
    vec![
        None,
        Some(Elsewhere::Members(vec![Member {
            http: Some("10.0.0.2:8080".into()),
            partitions: vec![("delay.orders".into(), 0)],
        }])),
        Some(Elsewhere::Error {
            error: "cannot describe group".into(),
        }),
    ]
}

#[test]
fn every_answer_of_the_admin_api_is_the_shape_the_openapi_document_gives() {
    for others in elsewhere() {
        let listing = Listing {
            records: vec![summary()],
            next_cursor: Some("1700000000000-00010000000002a0".into()),
            elsewhere: others.clone(),
        };
        assert_fits("get", "/api/v1/pending", &value(&listing));
        let last = Listing {
            next_cursor: None,
            ..listing
        };
        assert_fits("get", "/api/v1/pending", &value(&last));
        for route in ["cancel", "reschedule", "fire"] {
            let bulk = BulkResult {
                matched: 3,
                changed: 2,
                more: true,
                elsewhere: others.clone(),
            };
            assert_fits("post", &format!("/api/v1/bulk/{route}"), &value(&bulk));
        }
    }
    let record = Record {
        summary: summary(),
        delay_id: Some("reminder-7".into()),
        key: None,
        value: Some("{}".into()),
        value_hex: Some("7b7d".into()),
        value_bytes: Some(2),
        headers: vec![HeaderText {
            key: "delay-target".into(),
            value: Some("orders".into()),
        }],
    };
    assert_fits("get", "/api/v1/pending/{id}", &value(&record));
    let cancelled = Cancelled {
        cancelled: summary(),
    };
    assert_fits("delete", "/api/v1/pending/{id}", &value(&cancelled));
    for route in ["reschedule", "fire"] {
        let moved = Moved {
            record: summary(),
            previous_due_ms: 1_699_999_000_000,
        };
        let path = format!("/api/v1/pending/{{id}}/{route}");
        assert_fits("post", &path, &value(&moved));
    }
    let owners = Owners {
        this: Some("10.0.0.1:8080".into()),
        owners: vec![Owner {
            http: None,
            mode: None,
            client_id: "rdkafka".into(),
            host: "/10.0.0.3".into(),
            partitions: vec![("delay.orders".into(), 2)],
        }],
    };
    assert_fits("get", "/api/v1/owners", &value(&owners));
    // Across the group: one member answered, one did not.
    let members = |result: Option<Value>| {
        vec![
            Answered {
                http: Some("10.0.0.1:8080".into()),
                client_id: Some("10.0.0.1:8080".into()),
                answered: true,
                error: None,
                result,
            },
            Answered {
                http: Some("10.0.0.2:8080".into()),
                client_id: Some("10.0.0.2:8080".into()),
                answered: false,
                error: Some("10.0.0.2:8080 did not answer: connection refused".into()),
                result: None,
            },
        ]
    };
    let mut served = value(&summary());
    served["served_by"] = json!("10.0.0.1:8080");
    for next_cursor in [Some("7b7d".to_owned()), None] {
        let page = GroupListing {
            records: vec![served.clone()],
            next_cursor,
            partial: true,
            members: members(None),
        };
        assert_fits("get", "/api/v1/group/pending", &value(&page));
    }
    for route in ["cancel", "reschedule", "fire"] {
        let one = BulkResult {
            matched: 3,
            changed: 3,
            more: false,
            elsewhere: None,
        };
        let bulk = GroupBulk {
            matched: 3,
            changed: 3,
            more: false,
            partial: true,
            members: members(Some(value(&one))),
        };
        assert_fits(
            "post",
            &format!("/api/v1/group/bulk/{route}"),
            &value(&bulk),
        );
    }
    // Every error answer, whatever the route.
    let doc = doc();
    let problem = value(&Problem {
        error: "no pending record 00010000000002a0".into(),
    });
    let mut wrong = Vec::new();
    check(
        &doc,
        &json!({"$ref": "#/components/schemas/Error"}),
        &problem,
        "$",
        &mut wrong,
    );
    assert!(wrong.is_empty(), "{wrong:?}");
}

#[test]
fn the_check_refuses_what_the_document_does_not_give() {
    let doc = doc();
    let schema = answer_schema(&doc, "get", "/api/v1/pending/{id}");
    let mut wrong = Vec::new();
    let mut v = value(&summary());
    v["colour"] = json!("blue");
    v["due_ms"] = json!("soon");
    v.as_object_mut().unwrap().remove("target");
    check(&doc, &schema, &v, "$", &mut wrong);
    assert!(
        wrong.iter().any(|w| w.contains("colour is not documented")),
        "{wrong:?}"
    );
    assert!(wrong.iter().any(|w| w.contains("$.due_ms")), "{wrong:?}");
    assert!(
        wrong.iter().any(|w| w.contains("required target missing")),
        "{wrong:?}"
    );
}

#[test]
fn every_answer_of_the_console_api_is_the_shape_the_openapi_document_gives() {
    use super::console::answers::{
        Counts, DeadLetter, DeadLetterTopics, DeadLetters, DuePending, FiredRecords, GroupOverview,
        Held, Instance, Lateness, Member, Moving, Overview, Partition, Replays, Started,
        TargetPending,
    };
    use super::console::dead_letters::Topic;
    use super::console::minutes::Minute;
    use super::console::replays::Job;
    use crate::publish::history::Fired;

    let counts = Counts {
        pending: 3,
        by_target: vec![TargetPending {
            target: "orders".into(),
            pending: 3,
        }],
        by_due: crate::store::stats::BUCKETS
            .iter()
            .map(|bucket| DuePending { bucket, pending: 1 })
            .collect(),
        oldest_overdue_ms: 0,
        held: vec![Held {
            target: "orders".into(),
            held: 2.0,
        }],
        fired_total: 4,
        dead_lettered_total: 1,
    };
    let overview = |lateness: Option<f64>| Overview {
        now_ms: 1_700_000_000_000,
        instance: Instance {
            id: lateness.map(|_| "kd-0".to_owned()),
            group: "kafka-delay".into(),
            http: "10.0.0.1:9464".into(),
            version: env!("CARGO_PKG_VERSION"),
            owned_partitions: vec![Partition {
                topic: "delay.orders".into(),
                partition: 0,
            }],
        },
        counts: counts.clone(),
        per_minute: vec![Minute {
            minute_ms: 1_699_999_980_000,
            fired: 4,
            dead_lettered: 1,
        }],
        lateness_ms: Lateness {
            fire_p50: lateness,
            fire_p99: lateness,
            delivery_p50: lateness,
            delivery_p99: lateness,
        },
        moving: Moving {
            partitions_restoring: 1,
            restore_remaining_entries: 1_200,
            partitions_standby: 2,
            standby_records: 40,
            standby_lag_entries: 3,
        },
    };
    assert_fits("get", "/api/v1/overview", &value(&overview(None)));
    assert_fits("get", "/api/v1/overview", &value(&overview(Some(5.0))));
    // The group's: a member that answered, one that did not, one that is not kafka-delay.
    let member = |answered: bool, http: Option<&str>| Member {
        http: http.map(str::to_owned),
        client_id: Some("kafka-delay/changelog@10.0.0.1:9464".into()),
        mode: http.map(|_| "changelog".to_owned()),
        partitions: vec![Partition {
            topic: "delay.orders".into(),
            partition: 0,
        }],
        answered,
        error: (!answered).then(|| "10.0.0.2:9464 did not answer: no answer within 5 s".into()),
        overview: answered.then(|| value(&overview(Some(5.0)))),
    };
    let group = GroupOverview {
        now_ms: 1_700_000_000_000,
        group: "kafka-delay".into(),
        asked: "10.0.0.1:9464".into(),
        partial: true,
        wait_ms: 5_000,
        counts: Counts {
            held: vec![],
            ..counts.clone()
        },
        members: vec![
            member(true, Some("10.0.0.1:9464")),
            member(false, Some("10.0.0.2:9464")),
            member(false, None),
        ],
    };
    assert_fits("get", "/api/v1/group/overview", &value(&group));
    let fired = FiredRecords {
        records: vec![Fired {
            id: 0x2a0,
            target: "orders".into(),
            key: None,
            delay_id: Some("reminder-7".into()),
            due_ms: 1_700_000_000_000,
            fired_ms: 1_700_000_000_004,
            acked_ms: 1_700_000_000_009,
        }],
        kept: crate::publish::history::CAPACITY,
    };
    assert_fits("get", "/api/v1/fired", &value(&fired));
    let topics = DeadLetterTopics {
        topics: vec![Topic {
            name: "kafka-delay.dlt".into(),
            partitions: 3,
            records: 12,
        }],
    };
    assert_fits("get", "/api/v1/dead-letters", &value(&topics));
    let letter = DeadLetter {
        topic: "kafka-delay.dlt".into(),
        partition: 0,
        offset: 11,
        timestamp_ms: 1_700_000_000_000,
        reason: Some("bad-due".into()),
        detail: Some("delay-due is not a time".into()),
        target: None,
        key: Some("k".into()),
        value: Some("{}".into()),
        value_bytes: Some(2),
        value_hex: Some("7b7d".into()),
        headers: vec![HeaderText {
            key: "delay-due".into(),
            value: None,
        }],
    };
    let letters = DeadLetters {
        records: vec![letter],
    };
    assert_fits("get", "/api/v1/dead-letters/{topic}", &value(&letters));
    let job = Job {
        id: 1,
        from: "kafka-delay.dlt".into(),
        to: "orders".into(),
        rate: Some(10.0),
        filters: vec!["reason=bad-due".into()],
        state: "running",
        total: 12,
        read: 4,
        moved: 3,
        skipped: 1,
        failed: 0,
        error: None,
    };
    let started = Started {
        replay: job.clone(),
    };
    let path = "/api/v1/dead-letters/{topic}/replay";
    assert_fits("post", path, &value(&started));
    let replays = Replays { replays: vec![job] };
    assert_fits("get", "/api/v1/replays", &value(&replays));
}
