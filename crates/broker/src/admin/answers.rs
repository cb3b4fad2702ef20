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

/// A member asked by a request across the group (`/api/v1/group/...`), and what it said.
#[derive(Debug, Clone, Serialize)]
pub struct Answered {
    /// Its advertised HTTP address (null: this instance, alone in its group, or a member
    /// that advertises none).
    pub http: Option<String>,
    /// Its `client.id` (null when alone in its group).
    pub client_id: Option<String>,
    /// Whether it answered.
    pub answered: bool,
    /// Why not, when it did not.
    pub error: Option<String>,
    /// Its answer, where the request shows one per member (a bulk action's counts).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
}

/// A page of the group's pending records, from every member, in due order.
#[derive(Debug, Clone, Serialize)]
pub struct GroupListing {
    /// The records (each a listing's record with `served_by`, the member holding it).
    pub records: Vec<Value>,
    /// Where the next page starts, for every member at once; null on the last.
    pub next_cursor: Option<String>,
    /// Some member did not answer: its records are not on this page (the cursor keeps its
    /// place).
    pub partial: bool,
    /// The members asked.
    pub members: Vec<Answered>,
}

/// What a bulk action did across the group.
#[derive(Debug, Clone, Serialize)]
pub struct GroupBulk {
    /// Records it matched, over the members that answered.
    pub matched: u64,
    /// Records it changed, over the members that answered.
    pub changed: u64,
    /// Some member has more matching records: repeat the request.
    pub more: bool,
    /// Some member did not answer: the action was not applied there; repeat it.
    pub partial: bool,
    /// Each member and what it did (`result`: its `matched`, `changed`, `more`).
    pub members: Vec<Answered>,
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
