//! Who owns which source partition, as the group coordinator says: every member of the group,
//! its mode and advertised HTTP address (carried in its ingest consumer's `client.id`,
//! `kafka-delay/<mode>@<address>`) and its partitions. Any instance can answer it, so the admin
//! API can point at a record's owner.

use std::time::Duration;

use rdkafka::client::{Client, ClientContext};
use serde::Serialize;

use super::GroupError;
use crate::wire::Reader;

/// The `client.id` prefix of an ingest consumer: its mode, `@` and its advertised HTTP address
/// follow.
pub const CLIENT_ID_PREFIX: &str = "kafka-delay/";

/// The `client.id` prefix of an earlier version's ingest consumer with a changelog (it named no
/// mode); the advertised HTTP address follows it.
pub const LEGACY_CLIENT_ID_PREFIX: &str = "kafka-delay@";

/// The ingest consumer's `client.id` of an instance running `mode`, reached at `advertised`.
pub fn client_id(mode: &str, advertised: &str) -> String {
    format!("{CLIENT_ID_PREFIX}{mode}@{advertised}")
}

/// The mode a member's `client.id` names, if it is a kafka-delay instance's that names one.
pub fn mode_of(client_id: &str) -> Option<&str> {
    client_id
        .strip_prefix(CLIENT_ID_PREFIX)
        .and_then(|rest| rest.split_once('@'))
        .map(|(mode, _)| mode)
}

/// The advertised HTTP address a member's `client.id` carries.
pub(super) fn http_of(client_id: &str) -> Option<&str> {
    match client_id.strip_prefix(CLIENT_ID_PREFIX) {
        Some(rest) => rest.split_once('@').map(|(_, http)| http),
        None => client_id.strip_prefix(LEGACY_CLIENT_ID_PREFIX),
    }
}

/// One member of the group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Owner {
    /// Its HTTP address, as it advertises it (`None` for a member that is not kafka-delay).
    pub http: Option<String>,
    /// Its durability mode (`local`, `changelog`, `exactly-once`; `None` for a member that
    /// does not say).
    pub mode: Option<String>,
    /// Its `client.id`.
    pub client_id: String,
    /// The host the coordinator sees it connect from.
    pub host: String,
    /// Its source partitions, sorted.
    pub partitions: Vec<(String, i32)>,
}

/// A group as its coordinator describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    /// Whether no rebalance is under way (the assignments are the ones in force).
    pub stable: bool,
    /// Its members, sorted by `client.id`.
    pub owners: Vec<Owner>,
    /// Its members' ids, `client.id`s and hosts, in the coordinator's order.
    pub members: Vec<Peer>,
}

/// A member of a group as the coordinator names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// Its member id (a static member's begins with its `group.instance.id` and a dash).
    pub member_id: String,
    /// Its `client.id`.
    pub client_id: String,
    /// The host the coordinator sees it connect from.
    pub host: String,
}

impl Peer {
    /// What comes before the UUID of its member id: the coordinator names a member
    /// `<prefix>-<UUID>`, the prefix being a static member's `group.instance.id` and a dynamic
    /// one's `client.id`.
    pub fn id_prefix(&self) -> Option<&str> {
        let uuid_at = self.member_id.len().checked_sub(37)?;
        let (prefix, dash_uuid) = self.member_id.split_at_checked(uuid_at)?;
        let uuid = dash_uuid.strip_prefix('-')?;
        let is_uuid = uuid.chars().all(|c| c.is_ascii_hexdigit() || c == '-');
        (is_uuid && !prefix.is_empty()).then_some(prefix)
    }
}

/// The members of `group`, as the coordinator names them. Blocking.
///
/// # Errors
/// The coordinator did not answer, or an assignment could not be read.
pub fn members<C: ClientContext>(client: &Client<C>, group: &str) -> Result<Vec<Peer>, GroupError> {
    describe(client, group).map(|g| g.members)
}

/// The members of `group` and their partitions. Blocking.
///
/// # Errors
/// The coordinator did not answer, or an assignment could not be read.
pub fn owners<C: ClientContext>(client: &Client<C>, group: &str) -> Result<Vec<Owner>, GroupError> {
    describe(client, group).map(|g| g.owners)
}

/// The members of `group`, their partitions and whether the group is stable. Blocking.
///
/// # Errors
/// The coordinator did not answer, or an assignment could not be read.
pub fn describe<C: ClientContext>(client: &Client<C>, group: &str) -> Result<Group, GroupError> {
    let list = client
        .fetch_group_list(Some(group), Duration::from_secs(10))
        .map_err(|source| GroupError::Describe {
            group: group.to_owned(),
            source,
        })?;
    let mut out = Vec::new();
    let mut members = Vec::new();
    let mut stable = false;
    for g in list.groups().iter().filter(|g| g.name() == group) {
        stable = g.state() == "Stable";
        for m in g.members() {
            let mut partitions = m
                .assignment()
                .map(assignment)
                .transpose()?
                .unwrap_or_default();
            partitions.sort();
            members.push(Peer {
                member_id: m.id().to_owned(),
                client_id: m.client_id().to_owned(),
                host: m.client_host().to_owned(),
            });
            out.push(Owner {
                http: http_of(m.client_id()).map(str::to_owned),
                mode: mode_of(m.client_id()).map(str::to_owned),
                client_id: m.client_id().to_owned(),
                host: m.client_host().to_owned(),
                partitions,
            });
        }
    }
    out.sort_by(|a, b| a.client_id.cmp(&b.client_id));
    Ok(Group {
        stable,
        owners: out,
        members,
    })
}

/// The partitions of a consumer protocol assignment: a version (int16), then an array (int32
/// count) of topic (int16 length, bytes) and its partitions (int32 count, int32 each), then
/// user data, which is ignored.
fn assignment(bytes: &[u8]) -> Result<Vec<(String, i32)>, GroupError> {
    let bad = || GroupError::Assignment { bytes: bytes.len() };
    let mut r = Reader(bytes);
    r.take(2).ok_or_else(bad)?;
    let mut out = Vec::new();
    for _ in 0..r.i32().ok_or_else(bad)?.max(0) {
        let len = usize::try_from(r.i16().ok_or_else(bad)?).map_err(|_| bad())?;
        let topic = String::from_utf8(r.take(len).ok_or_else(bad)?.to_vec()).map_err(|_| bad())?;
        for _ in 0..r.i32().ok_or_else(bad)?.max(0) {
            out.push((topic.clone(), r.i32().ok_or_else(bad)?));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_members_client_id_names_its_mode_and_address() {
        let id = client_id("exactly-once", "10.0.0.1:8080");
        assert_eq!(id, "kafka-delay/exactly-once@10.0.0.1:8080");
        assert_eq!(mode_of(&id), Some("exactly-once"));
        assert_eq!(http_of(&id), Some("10.0.0.1:8080"));
        assert_eq!(mode_of("kafka-delay@10.0.0.1:8080"), None);
        assert_eq!(http_of("kafka-delay@10.0.0.1:8080"), Some("10.0.0.1:8080"));
        assert_eq!((mode_of("rdkafka"), http_of("rdkafka")), (None, None));
    }

    #[test]
    fn an_assignment_reads_as_its_topics_and_partitions() {
        // Version 1; two topics: "a" with partitions 0 and 3, "bc" with 7; user data 0xff.
        let mut b = vec![0, 1, 0, 0, 0, 2];
        b.extend([0, 1, b'a', 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 3]);
        b.extend([0, 2, b'b', b'c', 0, 0, 0, 1, 0, 0, 0, 7]);
        b.extend([0, 0, 0, 1, 0xff]);
        assert_eq!(
            assignment(&b).unwrap(),
            vec![("a".into(), 0), ("a".into(), 3), ("bc".into(), 7)]
        );
        assert!(matches!(
            assignment(&b[..9]),
            Err(GroupError::Assignment { bytes: 9 })
        ));
        assert_eq!(assignment(&[0, 1, 0, 0, 0, 0]).unwrap(), vec![]);
    }
}
