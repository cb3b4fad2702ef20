//! Members that are gone: an instance killed with `kill -9` stays in the group until its
//! session runs out (`session.timeout.ms`, 6 s here, often longer), and its partitions fire
//! nowhere until then. Four times a second each instance tries to connect to the other
//! members' HTTP servers; a member whose server refuses the connection twice in a row, at
//! the address the coordinator sees it connect from, has no process listening there any more,
//! and the instance removes it from the group ([`super::leave`], KIP-345's admin LeaveGroup):
//! the group rebalances at once and its partitions move to the survivors.
//!
//! **What counts as evidence.** Only a refused connection (nothing listens at that address)
//! on the host the member connects to Kafka from; a timeout, an unreachable host or any other
//! error is no evidence (a partitioned or overloaded member looks like that), and the group
//! waits for the session as before. A member whose advertised HTTP address is not on the
//! host it connects from (a loopback address while this instance runs elsewhere, a NAT) is
//! never probed. A member removed while alive (its HTTP server failed alone) is fenced by the
//! coordinator like one whose session ran out, rejoins and loses nothing: a removal is never
//! less safe than the session running out, only sooner.
//!
//! The group is described by its coordinator alone ([`super::coordinator`]), not by asking
//! every broker: with a broker cut off from this instance, a describe that waits for every
//! broker never answers in time.
//!
//! The decisions are pure ([`watched`], [`Suspects::observe`]); [`Departed::run`] does the
//! describing, probing and removing.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tracing::{error, info, warn};

use super::coordinator::Coordinator;
use super::leave::code;
use super::moving::Moving;
use super::owners::{self, Peer};
use crate::wire::{Security, WireError};

/// How often the other members are probed.
const EVERY: Duration = Duration::from_millis(250);
/// Longest a probe waits to connect (no answer within it is no evidence).
const PROBE_TIMEOUT: Duration = Duration::from_millis(250);
/// Refused probes in a row that make a member gone.
const REFUSALS: u32 = 2;
/// Longest each step of a request to the coordinator (connecting, TLS, SASL, its answer) is
/// waited for.
const ASK_TIMEOUT: Duration = Duration::from_secs(3);

/// A member whose HTTP server can be probed.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Watched {
    /// Its member id.
    pub member_id: String,
    /// Its `group.instance.id` (`None` for a dynamic member).
    pub instance_id: Option<String>,
    /// Its HTTP server, on the host it connects to Kafka from.
    pub http: SocketAddr,
}

/// The members of `members` this instance (`client.id` `me`) can probe, and where: a
/// kafka-delay member other than this one, whose advertised HTTP address resolves
/// (`resolve`) to the address the coordinator sees it connect from. A loopback address counts
/// only when this instance connects from loopback too (both run beside the coordinator).
pub fn watched(
    members: &[Peer],
    me: &str,
    mut resolve: impl FnMut(&str) -> Vec<SocketAddr>,
) -> Vec<Watched> {
    let Some(mine) = members.iter().find(|p| p.client_id == me) else {
        return Vec::new(); // not in the group (yet): nothing to compare hosts with
    };
    let my_host = host_ip(&mine.host);
    let mut out = Vec::new();
    for p in members.iter().filter(|p| p.client_id != me) {
        let (Some(http), Some(ip)) = (owners::http_of(&p.client_id), host_ip(&p.host)) else {
            continue;
        };
        if ip.is_loopback() && !my_host.is_some_and(|h| h.is_loopback()) {
            continue;
        }
        if let Some(at) = resolve(http).into_iter().find(|a| a.ip() == ip) {
            out.push(Watched {
                member_id: p.member_id.clone(),
                instance_id: instance_id_of(p),
                http: at,
            });
        }
    }
    out
}

/// The address in a member's host as the coordinator names it (`/10.0.0.1`).
fn host_ip(host: &str) -> Option<IpAddr> {
    host.trim_start_matches('/').parse().ok()
}

/// The `group.instance.id` of a member: its id's prefix, unless that is its `client.id` (a
/// dynamic member).
fn instance_id_of(p: &Peer) -> Option<String> {
    p.id_prefix()
        .filter(|prefix| *prefix != p.client_id)
        .map(str::to_owned)
}

/// What the probes have shown so far.
#[derive(Debug, Default)]
pub struct Suspects {
    /// Refusals in a row, by member id.
    refusals: HashMap<String, u32>,
    /// Members removed (or found gone already), not to be removed again.
    removed: HashSet<String>,
}

impl Suspects {
    /// Takes one round of probes, each member with whether its server refused, and returns the
    /// members to remove now: refused [`REFUSALS`] times in a row and not removed before.
    /// Members absent from the round are forgotten.
    pub fn observe(&mut self, round: &[(Watched, bool)]) -> Vec<Watched> {
        let present: HashSet<&str> = round.iter().map(|(w, _)| w.member_id.as_str()).collect();
        self.refusals.retain(|m, _| present.contains(m.as_str()));
        self.removed.retain(|m| present.contains(m.as_str()));
        let mut out = Vec::new();
        for (w, refused) in round {
            if !refused {
                self.refusals.remove(&w.member_id);
                continue;
            }
            let n = self.refusals.entry(w.member_id.clone()).or_default();
            *n += 1;
            if *n >= REFUSALS && !self.removed.contains(&w.member_id) {
                out.push(w.clone());
            }
        }
        out
    }

    /// `member_id` is gone from the group (removed, or found gone by the coordinator).
    pub fn removed(&mut self, member_id: &str) {
        self.removed.insert(member_id.to_owned());
    }
}

/// The probing ends for good (its blocking task panicked, or the runtime is shutting down):
/// said, since killed members then wait for their session.
fn stopped(e: &tokio::task::JoinError) {
    if e.is_panic() {
        error!(error = %e, "the probe of gone members failed and stopped: killed members now leave the group when their session runs out");
    }
}

/// The coordinator, whoever held its lock last having panicked or not.
fn lock(c: &Mutex<Coordinator>) -> std::sync::MutexGuard<'_, Coordinator> {
    c.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whether nothing listens at `at`: its host refuses the connection.
fn refuses(at: SocketAddr) -> bool {
    matches!(
        TcpStream::connect_timeout(&at, PROBE_TIMEOUT),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused
    )
}

/// How this instance reaches the coordinator to remove gone members, or why it does not
/// remove them: `--no-fast-takeover`, or a `--kafka-config` whose security the removal's own
/// connection cannot speak.
///
/// # Errors
/// Why the removal is off.
pub fn security(config: &crate::config::Config) -> Result<Security, String> {
    if !config.cluster.fast_takeover {
        return Err("--no-fast-takeover".to_owned());
    }
    Security::from_properties(&config.kafka.properties)
}

/// The task that removes gone members from the group.
#[derive(Debug)]
pub struct Departed {
    moving: Arc<Moving>,
    /// This instance's consumer `client.id`, as the group shows it.
    me: String,
    /// The members' advertised addresses, resolved (a name is looked up once in [`RESOLVED_FOR`],
    /// not four times a second).
    resolved: Mutex<HashMap<String, (Instant, Vec<SocketAddr>)>>,
    /// Members said to be beyond probing.
    unprobed: Mutex<HashSet<String>>,
}

/// How long a resolved advertised address is used before it is looked up again (an address
/// that did not resolve: a second).
const RESOLVED_FOR: Duration = Duration::from_secs(30);

impl Departed {
    /// Removal of gone members for the instance whose ingest consumer's `client.id` is `me`.
    pub fn new(moving: Arc<Moving>, me: String) -> Self {
        Self {
            moving,
            me,
            resolved: Mutex::default(),
            unprobed: Mutex::default(),
        }
    }

    /// Probes and removes until `stop` (returns at once when the removal is off: [`security`]).
    pub async fn run(self, mut stop: tokio::sync::watch::Receiver<bool>) {
        let security = match security(&self.moving.config) {
            Ok(s) => s,
            Err(why) => {
                warn!(why, "killed members are not removed from the group: their partitions move when their session runs out");
                return;
            }
        };
        let c = &self.moving.config;
        let coordinator =
            Coordinator::new(security, &c.kafka.brokers, &c.kafka.group_id, ASK_TIMEOUT);
        let coordinator = Arc::new(Mutex::new(coordinator));
        let this = Arc::new(self);
        let mut suspects = Suspects::default();
        let mut failures = 0u32;
        loop {
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                () = tokio::time::sleep(EVERY) => {}
            }
            let (d, c) = (this.clone(), coordinator.clone());
            let round = tokio::task::spawn_blocking(move || d.probe(&mut lock(&c)));
            let round = match round.await {
                Ok(Ok(round)) => round,
                Ok(Err(e)) => {
                    if failures % 240 == 0 {
                        warn!(error = %e, "cannot describe the group to probe its members; trying again");
                    }
                    failures += 1;
                    continue;
                }
                Err(e) => return stopped(&e),
            };
            failures = 0;
            for gone in suspects.observe(&round) {
                let (d, c) = (this.clone(), coordinator.clone());
                let w = gone.clone();
                match tokio::task::spawn_blocking(move || d.remove(&mut lock(&c), &w)).await {
                    Ok(Ok(())) => suspects.removed(&gone.member_id),
                    Ok(Err(WireError::Kafka { code, .. }))
                        if code == code::UNKNOWN_MEMBER_ID || code == code::FENCED_INSTANCE_ID =>
                    {
                        info!(member = gone.member_id, code,
                              "a gone member had left the group already (its session ran out, or its instance started again)");
                        suspects.removed(&gone.member_id);
                    }
                    Ok(Err(e)) => {
                        warn!(member = gone.member_id, error = %e, "cannot remove a gone member from the group; trying again");
                    }
                    Err(e) => return stopped(&e),
                }
            }
        }
    }

    /// The group's members this instance can probe, each with whether it refused. Blocking.
    fn probe(&self, coordinator: &mut Coordinator) -> Result<Vec<(Watched, bool)>, WireError> {
        let members = coordinator.members()?;
        let mut cache = self.resolved.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        cache.retain(|_, (at, addrs)| {
            let kept = if addrs.is_empty() {
                Duration::from_secs(1)
            } else {
                RESOLVED_FOR
            };
            now.duration_since(*at) < kept
        });
        let resolve = |a: &str| {
            let (_, addrs) = cache.entry(a.to_owned()).or_insert_with(|| {
                let addrs = a.to_socket_addrs().map(Iterator::collect);
                (now, addrs.unwrap_or_default())
            });
            addrs.clone()
        };
        let probed = watched(&members, &self.me, resolve);
        drop(cache);
        self.say_unprobed(&members, &probed);
        Ok(probed
            .into_iter()
            .map(|w| {
                let refused = refuses(w.http);
                (w, refused)
            })
            .collect())
    }

    /// Says once per member which other kafka-delay members cannot be probed (their advertised
    /// address is not on the host they connect from), so that an operator knows their takeover
    /// waits for their session.
    fn say_unprobed(&self, members: &[Peer], probed: &[Watched]) {
        if !members.iter().any(|p| p.client_id == self.me) {
            return; // not in the group yet: nothing was probed
        }
        let mut said = self.unprobed.lock().unwrap_or_else(PoisonError::into_inner);
        said.retain(|m| members.iter().any(|p| p.member_id == *m));
        let unprobed = members.iter().filter(|p| {
            p.client_id != self.me
                && owners::http_of(&p.client_id).is_some()
                && !probed.iter().any(|w| w.member_id == p.member_id)
        });
        for p in unprobed {
            if said.insert(p.member_id.clone()) {
                warn!(
                    member = p.member_id,
                    client_id = p.client_id,
                    host = p.host,
                    "a member whose advertised HTTP address is not on the host it connects to \
                       Kafka from cannot be probed: if it is killed, its partitions move when its \
                       session runs out"
                );
            }
        }
    }

    /// Removes `w` from the group. Blocking.
    fn remove(&self, coordinator: &mut Coordinator, w: &Watched) -> Result<(), WireError> {
        let c = &self.moving.config;
        let group = c.kafka.group_id.as_str();
        coordinator.remove(&w.member_id, w.instance_id.as_deref())?;
        self.moving.metrics.broker.members_removed.inc();
        warn!(
            group,
            member = w.member_id,
            http = %w.http,
            "removed a gone member from the group (its HTTP address refused connections on the \
             host it connects from): its partitions move now, not when its session runs out"
        );
        if let (Some(_), Some(instance)) = (&c.cluster.transactional_id, &w.instance_id) {
            fence(c, instance);
        }
        Ok(())
    }
}

/// With exactly-once: fences the transactional id of the removed `instance`, which aborts the
/// transaction it left open. The new owners' restores read its changelog partitions only up
/// to the last stable offset, which that transaction holds back until it ends: without this,
/// until the instance restarts or the coordinator times the transaction out
/// (`transaction.timeout.ms`, checked every 10 s). A live instance fenced by mistake renews its
/// producer, as after any fencing. Blocking.
fn fence(config: &crate::config::Config, instance: &str) {
    let id = format!("{}-{instance}", config.kafka.group_id);
    let producer = crate::kafka::transactional_producer_config(config, &id)
        .create::<rdkafka::producer::BaseProducer>();
    let fenced = producer
        .and_then(|p| rdkafka::producer::Producer::init_transactions(&p, Duration::from_secs(10)));
    match fenced {
        Ok(()) => info!(
            transactional_id = id,
            "fenced the removed member's transactional id: its open transaction is aborted"
        ),
        Err(e) => warn!(transactional_id = id, error = %e,
                        "cannot fence the removed member's transactional id: its partitions wait for its open transaction to time out"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUID: &str = "0b7a3c1e-2f4d-4e5a-9b6c-7d8e9f0a1b2c";

    fn peer(member: &str, client: &str, host: &str) -> Peer {
        Peer {
            member_id: format!("{member}-{UUID}"),
            client_id: client.to_owned(),
            host: host.to_owned(),
        }
    }

    fn resolve(a: &str) -> Vec<SocketAddr> {
        a.to_socket_addrs()
            .map(Iterator::collect)
            .unwrap_or_default()
    }

    #[test]
    fn only_other_members_on_the_host_they_connect_from_are_probed() {
        let me = owners::client_id("changelog", "10.0.0.1:9464");
        let members = vec![
            peer("a", &me, "/10.0.0.1"),
            peer(
                "b",
                &owners::client_id("changelog", "10.0.0.2:9464"),
                "/10.0.0.2",
            ),
            // Advertises an address that is not where it connects from (NAT, a wrong flag).
            peer(
                "c",
                &owners::client_id("changelog", "10.0.0.9:9464"),
                "/10.0.0.3",
            ),
            // Advertises loopback while this instance is on another host.
            peer(
                "d",
                &owners::client_id("changelog", "127.0.0.1:9464"),
                "/127.0.0.1",
            ),
            // Not a kafka-delay instance.
            peer("e", "rdkafka", "/10.0.0.5"),
        ];
        let w = watched(&members, &me, resolve);
        assert_eq!(
            w,
            vec![Watched {
                member_id: format!("b-{UUID}"),
                instance_id: Some("b".to_owned()),
                http: "10.0.0.2:9464".parse().unwrap(),
            }]
        );
        // Not in the group: nothing to compare with.
        assert!(watched(&members[1..], &me, resolve).is_empty());
        // Both beside the coordinator: loopback counts.
        let me = owners::client_id("changelog", "127.0.0.1:9000");
        let members = vec![peer("a", &me, "/127.0.0.1"), members[3].clone()];
        assert_eq!(watched(&members, &me, resolve).len(), 1);
    }

    #[test]
    fn a_members_instance_id_comes_from_its_member_id() {
        assert_eq!(instance_id_of(&peer("kd-1", "x", "")), Some("kd-1".into()));
        // A dynamic member's id begins with its client.id.
        assert_eq!(instance_id_of(&peer("x", "x", "")), None);
        let odd = Peer {
            member_id: "rdkafka-123".to_owned(),
            client_id: "rdkafka".to_owned(),
            host: String::new(),
        };
        assert_eq!(instance_id_of(&odd), None);
    }

    fn w(m: &str) -> Watched {
        Watched {
            member_id: m.to_owned(),
            instance_id: None,
            http: "10.0.0.2:1".parse().unwrap(),
        }
    }

    #[test]
    fn a_member_is_removed_after_refusals_in_a_row_and_once() {
        let mut s = Suspects::default();
        assert!(s.observe(&[(w("a"), true), (w("b"), false)]).is_empty());
        // An answer in between starts the count again.
        assert!(s.observe(&[(w("a"), false)]).is_empty());
        assert!(s.observe(&[(w("a"), true)]).is_empty());
        assert_eq!(s.observe(&[(w("a"), true), (w("b"), true)]), vec![w("a")]);
        // Not removed (the LeaveGroup failed): asked again.
        assert_eq!(
            s.observe(&[(w("a"), true), (w("b"), true)]),
            vec![w("a"), w("b")]
        );
        s.removed("a");
        assert_eq!(s.observe(&[(w("a"), true), (w("b"), true)]), vec![w("b")]);
        // Gone from the group, then back under the same id: a new count.
        assert!(s.observe(&[(w("b"), false)]).is_empty());
        assert!(s.observe(&[(w("a"), true)]).is_empty());
    }

    #[test]
    fn a_refused_connection_is_evidence_and_a_listener_is_not() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let at = l.local_addr().unwrap();
        assert!(!refuses(at));
        drop(l);
        assert!(refuses(at));
    }
}
