//! Whether this instance may join its consumer group, from the members the coordinator names
//! when it starts: an instance without the changelog keeps the only copy of its records and
//! must be alone in its group (a second member would take partitions whose records stay, and
//! keep firing, on the first), and the instances of a group all run one mode.
//!
//! Each instance says its mode in its ingest consumer's `client.id`
//! ([`crate::changelog::owners::client_id`]), so the check needs nothing but the group's
//! description. The decision is pure ([`verdict`]); [`check`] asks the coordinator, and waits
//! for a member that may be a dead one (its session running out) before it refuses.
//!
//! The coordinator is asked directly ([`Coordinator`]), as the probe for gone members asks it:
//! librdkafka's group listing waits for every broker's answer, so one broker cut off from this
//! instance would fail its start, although the coordinator alone holds the group. The listing
//! answers where the direct connection cannot (a security setting it does not speak, a cluster
//! without DescribeGroups v5, such as librdkafka's mock).

use std::time::{Duration, Instant};

use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;
use rdkafka::types::RDKafkaErrorCode;
use thiserror::Error;
use tracing::{info, warn};

use crate::changelog::coordinator::Coordinator;
use crate::changelog::leave::code;
use crate::changelog::owners::{self, Peer, LEGACY_CLIENT_ID_PREFIX};
use crate::changelog::GroupError;
use crate::config::Config;
use crate::kafka::{base_config, KafkaSetupError};
use crate::wire::{Security, WireError};

/// Why this instance may not join its group.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("group '{group}' has another member this instance cannot run beside: {member} (client.id '{client_id}', from {host}); {why}")]
pub struct Refusal {
    /// The group.
    pub group: String,
    /// The other member's id.
    pub member: String,
    /// Its `client.id`.
    pub client_id: String,
    /// Its host.
    pub host: String,
    /// What is wrong and what to do.
    pub why: String,
}

/// What `mode` (this instance's, [`crate::durability::Prepared::name`]) makes of the other
/// members of `group`. `instance_id` is this instance's `group.instance.id`: a member with it
/// is this instance's own earlier life (killed or restarted within its session), not another.
///
/// # Errors
/// The first member this instance cannot run beside.
pub(super) fn verdict(
    group: &str,
    mode: &str,
    instance_id: Option<&str>,
    peers: &[Peer],
) -> Result<(), Refusal> {
    // A static member's id is its instance id, a dash and a UUID: this instance's earlier life.
    let own = |p: &Peer| instance_id.is_some_and(|id| p.id_prefix() == Some(id));
    for p in peers.iter().filter(|p| !own(p)) {
        let theirs = owners::mode_of(&p.client_id);
        let why = match (mode, theirs) {
            ("local", _) => Some(
                "without the changelog (--no-changelog) an instance keeps the only copy of its \
                 records and must be alone in its group: stop the other member, or run every \
                 instance with the changelog (leave out --no-changelog)"
                    .to_owned(),
            ),
            (_, Some(m)) if m == mode => None,
            (_, Some(m)) => Some(format!(
                "it runs the {m} mode and this instance the {mode} mode: run every instance \
                 of a group in one mode (the same --no-changelog and --exactly-once flags)"
            )),
            // An instance of an earlier version (it named no mode) runs a changelog mode: a
            // rolling upgrade meets it.
            (_, None) if p.client_id.starts_with(LEGACY_CLIENT_ID_PREFIX) => None,
            (_, None) => Some(
                "it is not a kafka-delay instance of this version, or runs without the \
                 changelog: give this group to kafka-delay alone (another --group-id), or stop it"
                    .to_owned(),
            ),
        };
        if let Some(why) = why {
            return Err(Refusal {
                group: group.to_owned(),
                member: p.member_id.clone(),
                client_id: p.client_id.clone(),
                host: p.host.clone(),
                why,
            });
        }
    }
    Ok(())
}

/// Why the group check did not pass.
#[derive(Debug, Error)]
pub enum CheckError {
    /// Another member this instance cannot run beside.
    #[error(transparent)]
    Refused(Box<Refusal>),
    /// The coordinator could not be asked.
    #[error(transparent)]
    Group(#[from] GroupError),
    /// The client to ask it could not be made.
    #[error(transparent)]
    Client(#[from] KafkaSetupError),
}

/// Asks the coordinator who is in the group and applies [`verdict`] for `mode`; a member it
/// refuses is asked about again until the group's session timeout and two seconds have passed
/// (a killed instance stays a member until its session runs out, then the group drops it).
/// Blocking.
///
/// # Errors
/// [`CheckError::Refused`] for a member still there then; the others when the coordinator
/// cannot be asked.
pub(super) fn check(config: &Config, mode: &str) -> Result<(), CheckError> {
    let group = config.kafka.group_id.as_str();
    let mut members = Members::new(config)?;
    let session = config
        .kafka
        .properties
        .iter()
        .find(|p| p.key == "session.timeout.ms")
        .and_then(|p| p.value.parse().ok())
        .unwrap_or(6_000u64);
    let wait = Duration::from_millis(session + 2_000);
    let started = Instant::now();
    let until = started + wait;
    let mut said = false;
    let mut busy_said = false;
    loop {
        let peers = match members.ask() {
            Err(GroupError::Describe { source, .. })
                if source.rdkafka_error_code() == Some(RDKafkaErrorCode::UnsupportedFeature) =>
            {
                warn!(
                    group,
                    mode,
                    "the cluster does not describe groups (librdkafka's mock \
                      cluster?): the group's other members are not checked"
                );
                return Ok(());
            }
            Err(e) if coordinator_busy(&e) && started.elapsed() < COORDINATOR_WAIT => {
                if !busy_said {
                    warn!(group, error = %e, "the group coordinator is not ready yet; asking again");
                    busy_said = true;
                }
                std::thread::sleep(Duration::from_millis(500));
                continue;
            }
            answer => answer?,
        };
        match verdict(group, mode, config.kafka.instance_id.as_deref(), &peers) {
            Ok(()) => {
                info!(group, mode, members = peers.len(), "group check passed");
                return Ok(());
            }
            Err(refusal) if Instant::now() >= until => {
                return Err(CheckError::Refused(Box::new(refusal)))
            }
            Err(refusal) => {
                if !said {
                    warn!(%refusal, wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                          "waiting to see whether the other member is a dead one whose session runs out");
                    said = true;
                }
                std::thread::sleep(Duration::from_millis(500));
            }
        }
    }
}

/// How long a coordinator that is still loading or moving is asked again before the start
/// fails (a broker that has just started loads its group metadata first, in seconds).
const COORDINATOR_WAIT: Duration = Duration::from_secs(20);

/// Whether the coordinator's answer means "not yet" rather than "no": it is loading the
/// group's metadata, or the group's coordinator is moving. (A request that timed out already
/// waited its timeout, and fails the start as before.)
fn coordinator_busy(e: &GroupError) -> bool {
    match e {
        GroupError::Describe { source, .. } => matches!(
            source.rdkafka_error_code(),
            Some(
                RDKafkaErrorCode::CoordinatorLoadInProgress
                    | RDKafkaErrorCode::CoordinatorNotAvailable
                    | RDKafkaErrorCode::NotCoordinator
            )
        ),
        GroupError::Coordinator {
            source: WireError::Kafka { code, .. },
            ..
        } => BUSY.contains(code),
        _ => false,
    }
}

/// The codes of a coordinator that is loading or moving.
const BUSY: [i16; 3] = [
    code::COORDINATOR_LOAD_IN_PROGRESS,
    code::COORDINATOR_NOT_AVAILABLE,
    code::NOT_COORDINATOR,
];

/// Longest each step of asking the coordinator directly (connecting, TLS, SASL, the answer)
/// is waited for, before the next bootstrap server or the listing is asked.
const DIRECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the group's members are asked: its coordinator directly, librdkafka's listing where
/// that cannot answer.
struct Members {
    group: String,
    /// `None` for a security setting the direct connection does not speak.
    direct: Option<Coordinator>,
    listing: AdminClient<DefaultClientContext>,
    /// Whether falling back to the listing was said.
    fell_back: bool,
}

impl Members {
    fn new(config: &Config) -> Result<Self, KafkaSetupError> {
        let group = config.kafka.group_id.clone();
        let direct = Security::from_properties(&config.kafka.properties)
            .map(|s| Coordinator::new(s, &config.kafka.brokers, &group, DIRECT_TIMEOUT))
            .map_err(|why| {
                info!(
                    why,
                    "the group's coordinator is asked through librdkafka's group listing"
                )
            })
            .ok();
        let listing = base_config(config)
            .create()
            .map_err(|source| KafkaSetupError::Client {
                client: "group check",
                source,
            })?;
        Ok(Self {
            group,
            direct,
            listing,
            fell_back: false,
        })
    }

    /// The group's members. Blocking.
    fn ask(&mut self) -> Result<Vec<Peer>, GroupError> {
        if let Some(direct) = self.direct.as_mut() {
            match direct.members() {
                Ok(peers) => return Ok(peers),
                Err(source @ WireError::Kafka { code, .. }) if BUSY.contains(&code) => {
                    return Err(GroupError::Coordinator {
                        group: self.group.clone(),
                        source,
                    })
                }
                Err(e) if !self.fell_back => {
                    info!(group = self.group, error = %e,
                          "the group's coordinator cannot be asked directly; asking librdkafka's group listing, which waits for every broker");
                    self.fell_back = true;
                }
                Err(_) => {}
            }
        }
        owners::members(self.listing.inner(), &self.group)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(member_id: &str, client_id: &str) -> Peer {
        Peer {
            member_id: member_id.into(),
            client_id: client_id.into(),
            host: "/10.0.0.7".into(),
        }
    }

    #[test]
    fn a_coordinator_that_is_loading_or_moving_is_asked_again_and_a_refusal_is_not() {
        let listed = |code| GroupError::Describe {
            group: "g".into(),
            source: rdkafka::error::KafkaError::GroupListFetch(code),
        };
        assert!(coordinator_busy(&listed(
            RDKafkaErrorCode::CoordinatorLoadInProgress
        )));
        assert!(coordinator_busy(&listed(RDKafkaErrorCode::NotCoordinator)));
        assert!(!coordinator_busy(&listed(
            RDKafkaErrorCode::GroupAuthorizationFailed
        )));
        let direct = |source| GroupError::Coordinator {
            group: "g".into(),
            source,
        };
        let answered = |code| WireError::Kafka {
            request: "DescribeGroups",
            code,
            message: None,
        };
        assert!(coordinator_busy(&direct(answered(14))));
        assert!(coordinator_busy(&direct(answered(16))));
        assert!(!coordinator_busy(&direct(answered(30))));
        assert!(!coordinator_busy(&direct(WireError::Malformed(
            "DescribeGroups"
        ))));
    }

    const UUID: &str = "0f8fad5b-d9cb-469f-a165-70867728950e";

    #[test]
    fn an_instance_without_the_changelog_must_be_alone_but_for_its_own_earlier_life() {
        let earlier = peer(&format!("a-{UUID}"), "kafka-delay/local@10.0.0.1:8080");
        assert_eq!(verdict("g", "local", Some("a"), &[]), Ok(()));
        assert_eq!(
            verdict("g", "local", Some("a"), std::slice::from_ref(&earlier)),
            Ok(())
        );
        let other = peer(&format!("b-{UUID}"), "kafka-delay/local@10.0.0.2:8080");
        let refusal = verdict("g", "local", Some("a"), &[earlier.clone(), other]).unwrap_err();
        assert_eq!(refusal.member, format!("b-{UUID}"));
        let said = refusal.to_string();
        assert!(
            said.contains("b-0f8f") && said.contains("10.0.0.7") && said.contains("--no-changelog"),
            "{said}"
        );
        // Without a static id every member is another one; so is an id that only begins alike.
        assert!(verdict("g", "local", None, &[earlier]).is_err());
        let longer = peer(&format!("a-b-{UUID}"), "kafka-delay/local@10.0.0.2:8080");
        assert!(verdict("g", "local", Some("a"), &[longer]).is_err());
    }

    #[test]
    fn instances_of_a_group_run_one_mode() {
        let changelog = peer("b-1", "kafka-delay/changelog@10.0.0.2:8080");
        let exactly = peer("c-1", "kafka-delay/exactly-once@10.0.0.3:8080");
        assert_eq!(
            verdict(
                "g",
                "changelog",
                Some("a"),
                std::slice::from_ref(&changelog)
            ),
            Ok(())
        );
        let refusal = verdict("g", "changelog", Some("a"), &[changelog, exactly]).unwrap_err();
        assert_eq!(refusal.member, "c-1");
        assert!(refusal.why.contains("exactly-once mode"), "{}", refusal.why);
        let local = peer("d-1", "kafka-delay/local@10.0.0.4:8080");
        assert!(verdict("g", "exactly-once", Some("a"), &[local]).is_err());
        let stranger = peer("rdkafka-5c1", "rdkafka");
        assert!(verdict("g", "changelog", Some("a"), &[stranger]).is_err());
        // An instance of the version before, which named no mode, during a rolling upgrade.
        let older = peer("e-1", "kafka-delay@10.0.0.5:8080");
        assert_eq!(verdict("g", "changelog", Some("a"), &[older]), Ok(()));
    }
}
