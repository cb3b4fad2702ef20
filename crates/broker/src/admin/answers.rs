//! The admin API's answers as types: each serializes to the shape
//! `schemas/admin.openapi.json` documents (a test checks every one against it).

use serde::Serialize;
use serde_json::Value;

use crate::changelog::owners::Owner;

/// Where a pending record came from.
#[derive(Debug, Clone, Serialize)]
pub struct Source {
    /// Source topic.
    pub topic: String,
    /// Source partition.
    pub partition: i32,
    /// Source offset.
    pub offset: i64,
}

/// A pending record in a listing.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// The record id on this instance: 16 hex digits.
    pub id: String,
    /// Due time, epoch ms.
    pub due_ms: u64,
    /// Due time, RFC 3339.
    pub due: String,
    /// Target topic.
    pub target: String,
    /// Where it came from.
    pub source: Source,
    /// `topic:partition:offset` of the source record: names it on every instance.
    #[serde(rename = "ref")]
    pub reference: String,
}

/// A header of a pending record, its value as text (null when absent or not UTF-8).
#[derive(Debug, Clone, Serialize)]
pub struct HeaderText {
    /// Key.
    pub key: String,
    /// Value.
    pub value: Option<String>,
}

/// A pending record in full.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    /// What a listing shows.
    #[serde(flatten)]
    pub summary: Summary,
    /// The `delay-id` header.
    pub delay_id: Option<String>,
    /// The key as UTF-8 text.
    pub key: Option<String>,
    /// The value as UTF-8 text.
    pub value: Option<String>,
    /// The value in hex (the first bytes, for the console).
    pub value_hex: Option<String>,
    /// The value's length.
    pub value_bytes: Option<usize>,
    /// The record's own headers.
    pub headers: Vec<HeaderText>,
}

/// Another instance of the group and its partitions.
#[derive(Debug, Clone, Serialize)]
pub struct Member {
    /// Its advertised HTTP address.
    pub http: Option<String>,
    /// Its source partitions.
    pub partitions: Vec<(String, i32)>,
}

/// With several instances: the others, or why they could not be named.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum Elsewhere {
    /// The other members.
    Members(Vec<Member>),
    /// The group could not be described.
    Error {
        /// Why.
        error: String,
    },
}

/// A page of pending records.
#[derive(Debug, Clone, Serialize)]
pub struct Listing {
    /// The records, in due order.
    pub records: Vec<Summary>,
    /// Where the next page starts; null on the last.
    pub next_cursor: Option<String>,
    /// The other instances (with several).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub elsewhere: Option<Elsewhere>,
}

/// What a bulk action did.
#[derive(Debug, Clone, Serialize)]
pub struct BulkResult {
    /// Records it matched.
    pub matched: usize,
    /// Records it changed.
    pub changed: usize,
    /// More records match: repeat the request.
    pub more: bool,
    /// The other instances (with several).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub elsewhere: Option<Elsewhere>,
}

/// The record a cancel took out.
#[derive(Debug, Clone, Serialize)]
pub struct Cancelled {
    /// It, as it was.
    pub cancelled: Summary,
}

/// A record moved (rescheduled, or fired now).
#[derive(Debug, Clone, Serialize)]
pub struct Moved {
    /// It, as it is now.
    pub record: Summary,
    /// Its due time before.
    pub previous_due_ms: u64,
}

/// Who owns which partition.
#[derive(Debug, Clone, Serialize)]
pub struct Owners {
    /// This instance's advertised HTTP address.
    pub this: Option<String>,
    /// Every member of the group.
    pub owners: Vec<Owner>,
}

/// An error answer (any status but 2xx): what went wrong, in a sentence.
#[derive(Debug, Clone, Serialize)]
pub struct Problem {
    /// The sentence.
    pub error: String,
}

/// An answer as the JSON value handlers return (the logging of state changes prints it).
pub(crate) fn value<T: Serialize>(answer: &T) -> Value {
    serde_json::to_value(answer).unwrap_or(Value::Null)
}
