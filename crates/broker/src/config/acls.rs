//! `kafka-delay acls`: the access rules a cluster with an authorizer must give kafka-delay's
//! principal for a given configuration, and nothing more: its group, its source topics, its
//! changelog topics, the dead-letter topic, the targets its routes allow and, with exactly-once,
//! its transactional ids.
//!
//! Kafka's ACLs name a topic literally or by prefix, so each regex of the configuration must be
//! one that a prefix (or a name) states exactly or more broadly: `^team-a\.` becomes the prefix
//! `team-a.`, `^orders$` the name `orders`. A regex no prefix can state (`orders|payments`, or
//! one not anchored with `^`) is refused with a message saying how to write it. The derivation
//! is pure ([`acls`]); the command prints it as `kafka-acls` lines or JSON.

use std::fmt::Write as _;

use clap::{Args, ValueEnum};
use serde::Serialize;

use crate::config::{Changelog, Config, RunArgs, ValueCopy};

/// Flags of `kafka-delay acls`: the flags `kafka-delay run` will be given, and how to print.
#[derive(Debug, Args)]
pub struct AclsArgs {
    /// The principal kafka-delay authenticates as.
    #[arg(long, default_value = "User:kafka-delay")]
    pub principal: String,
    /// How to print the rules.
    #[arg(long, value_enum, default_value_t = Format::KafkaAcls)]
    pub format: Format,
    /// The admin client configuration the printed `kafka-acls` lines pass as --command-config.
    #[arg(long, default_value = "admin.properties")]
    pub command_config: String,
    /// The flags of `kafka-delay run`.
    #[command(flatten)]
    pub run: Box<RunArgs>,
}

/// How `kafka-delay acls` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// One `kafka-acls --add` line per resource, each after a comment saying why.
    KafkaAcls,
    /// A JSON array of the rules.
    Json,
}

/// What kind of resource a rule is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// Topics.
    Topic,
    /// A consumer group.
    Group,
    /// Transactional ids.
    TransactionalId,
    /// The cluster itself (its name is always `kafka-cluster`).
    Cluster,
}

/// Whether a rule names one resource or every resource whose name starts with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Pattern {
    /// Exactly this name.
    Literal,
    /// Every name starting with it.
    Prefixed,
}

/// An operation Kafka's authorizer checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum Op {
    /// Fetch, join and commit.
    Read,
    /// Produce.
    Write,
    /// Create topics.
    Create,
    /// Metadata and descriptions.
    Describe,
    /// Read a topic's configuration.
    DescribeConfigs,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Read => "Read",
            Op::Write => "Write",
            Op::Create => "Create",
            Op::Describe => "Describe",
            Op::DescribeConfigs => "DescribeConfigs",
        }
    }
}

/// One rule: operations allowed on a resource, and why kafka-delay needs them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Acl {
    /// The resource's kind.
    pub kind: Kind,
    /// Its name or prefix.
    pub name: String,
    /// Literal or prefixed.
    pub pattern: Pattern,
    /// The operations allowed.
    pub operations: Vec<Op>,
    /// Why kafka-delay needs them.
    pub why: String,
}

/// A regex of the configuration that no ACL can state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{flag} '{regex}' cannot be written as a Kafka ACL, which names a topic or a prefix: {why}"
)]
pub struct AclError {
    /// The flag that gave it.
    pub flag: &'static str,
    /// The regex.
    pub regex: String,
    /// What to do instead.
    pub why: &'static str,
}

/// The name or prefix that a regex matches, if an ACL can state it: `^` then literal
/// characters (`\.` and `\-` for `.` and `-`), then nothing (a prefix), `.*` or `.+` (a
/// prefix: the ACL also allows the prefix itself), or `$` (a name).
///
/// # Errors
/// Why it cannot, for [`AclError`].
pub fn prefix_of(regex: &str) -> Result<(String, Pattern), &'static str> {
    let Some(rest) = regex.strip_prefix('^') else {
        return Err("anchor it at the start with ^ (a regex that is not matches names anywhere)");
    };
    let mut name = String::new();
    let mut chars = rest.chars().peekable();
    while let Some(&c) = chars.peek() {
        match c {
            'a'..='z' | 'A'..='Z' | '0'..='9' | '_' | '-' => name.push(c),
            '\\' => {
                chars.next();
                match chars.peek() {
                    Some(&e @ ('.' | '-' | '_')) => name.push(e),
                    _ => break,
                }
            }
            _ => break,
        }
        chars.next();
    }
    let tail: String = chars.collect();
    let pattern =
        match tail.as_str() {
            "" | ".*" | ".+" => Pattern::Prefixed,
            "$" => Pattern::Literal,
            _ => return Err(
                "write it as ^PREFIX (optionally followed by .* or .+) or ^NAME$, one per route",
            ),
        };
    if name.is_empty() {
        return Err("it names no prefix: every topic would need the access");
    }
    Ok((name, pattern))
}

fn from_regex(flag: &'static str, regex: &str) -> Result<(String, Pattern), AclError> {
    prefix_of(regex).map_err(|why| AclError {
        flag,
        regex: regex.to_owned(),
        why,
    })
}

/// The rules kafka-delay needs under `config`.
///
/// # Errors
/// An [`AclError`] for a source pattern, route or target allow-list no ACL can state.
pub fn acls(config: &Config) -> Result<Vec<Acl>, AclError> {
    use Op::{Create, Describe, DescribeConfigs, Read, Write};
    let group = config.kafka.group_id.clone();
    let source = from_regex("--source-pattern", config.contract.source_pattern.as_str())?;
    let mut out = vec![
        rule(
            Kind::Group,
            (group.clone(), Pattern::Literal),
            &[Read, Describe],
            "its consumer group: join, commit offsets, and see the other members",
        ),
        rule(
            Kind::Group,
            (super::CONSOLE_GROUP.to_owned(), Pattern::Literal),
            &[Read, Describe],
            "the console's dead-letter pages read with this group (nothing committed)",
        ),
        if points_at_sources(config) {
            rule(
                Kind::Topic,
                source.clone(),
                &[Read, Describe, DescribeConfigs],
                "the delay topics it consumes, and their retention (the changelog points at \
                 the values they keep)",
            )
        } else {
            rule(
                Kind::Topic,
                source.clone(),
                &[Read, Describe],
                "the delay topics it consumes",
            )
        },
        rule(
            Kind::Topic,
            (config.topics.dead_letter.clone(), Pattern::Literal),
            &[Read, Write, Create, Describe],
            "the dead-letter topic: created when missing, written, read by the console and replay",
        ),
    ];
    if let Some(retry) = &config.topics.retry {
        out.push(rule(
            Kind::Topic,
            (retry.clone(), Pattern::Literal),
            &[Create, Describe],
            "the retry topic, created when missing (consumers write it; it is a delay topic)",
        ));
    }
    out.extend(durability_rules(config, &source.0));
    for (name, pattern) in targets(config)? {
        out.push(rule(
            Kind::Topic,
            (name, pattern),
            &[Write, Create, Describe],
            "the targets records may name, and their retry dead-letter topics (created when missing)",
        ));
    }
    for template in retry_dead_letters(config) {
        out.push(rule(
            Kind::Topic,
            template,
            &[Write, Create, Describe],
            "a retry policy's dead-letter topics (created when missing)",
        ));
    }
    Ok(out)
}

/// Whether the changelog may point at values in the source topics, whose retention it then
/// reads.
fn points_at_sources(config: &Config) -> bool {
    config.cluster.changelog != Changelog::Off && config.cluster.changelog_copy != ValueCopy::All
}

/// One rule.
fn rule(kind: Kind, (name, pattern): (String, Pattern), operations: &[Op], why: &str) -> Acl {
    Acl {
        kind,
        name,
        pattern,
        operations: operations.to_vec(),
        why: why.to_owned(),
    }
}

/// The rules of the durability mode: the changelog's topics and readers, the question the
/// default asks the cluster, and exactly-once's transactional ids (`source` is the source
/// topics' prefix).
fn durability_rules(config: &Config, source: &str) -> Vec<Acl> {
    use Op::{Create, Describe, DescribeConfigs, Read, Write};
    let group = &config.kafka.group_id;
    let mut out = Vec::new();
    if config.cluster.changelog == Changelog::Default {
        out.push(rule(
            Kind::Cluster,
            ("kafka-cluster".to_owned(), Pattern::Literal),
            &[DescribeConfigs],
            "the default mode asks the brokers' configuration whether they compact topics \
             (not needed with --changelog or --no-changelog)",
        ));
    }
    if config.cluster.changelog != Changelog::Off {
        out.push(rule(
            Kind::Group,
            (config.kafka.restore_group(), Pattern::Literal),
            &[Read, Describe],
            "restores and standby copies read the changelog with this group (nothing committed)",
        ));
        // Each source topic's changelog is GROUP-SOURCE-changelog (`changelog::topic_name`).
        let prefix = format!("{group}-{source}");
        out.push(rule(
            Kind::Topic,
            (prefix, Pattern::Prefixed),
            &[Read, Write, Create, Describe, DescribeConfigs],
            "the changelog topics (GROUP-SOURCE-changelog): created, checked, written and restored",
        ));
    }
    if let Some(id) = &config.cluster.transactional_id {
        let prefix = id
            .strip_suffix(config.kafka.instance_id.as_deref().unwrap_or_default())
            .filter(|p| !p.is_empty())
            .unwrap_or(id);
        out.push(rule(
            Kind::TransactionalId,
            (prefix.to_owned(), Pattern::Prefixed),
            &[Write, Describe],
            "exactly-once: each instance's transactional id (GROUP-INSTANCE)",
        ));
    }
    out
}

/// The targets as names or prefixes: each route's targets, else the allow-list, else every
/// topic (said as the prefix-less wildcard the caller prints).
fn targets(config: &Config) -> Result<Vec<(String, Pattern)>, AclError> {
    let c = &config.contract;
    if !c.routes.is_empty() {
        let mut out = Vec::new();
        for route in &c.routes {
            let t = from_regex("--route", route.targets().as_str())?;
            if !out.contains(&t) {
                out.push(t);
            }
        }
        return Ok(out);
    }
    match &c.target_allow {
        Some(allow) => Ok(vec![from_regex("--target-allow", allow.as_str())?]),
        None => Ok(vec![("*".to_owned(), Pattern::Literal)]),
    }
}

/// The retry policies' dead-letter topics that the targets' rules do not cover: a template
/// that does not start with `{target}` (`{target}.dlt`, the default, is a target's prefix).
fn retry_dead_letters(config: &Config) -> Vec<(String, Pattern)> {
    let retry = &config.contract.retry;
    let mut out = Vec::new();
    for policy in std::iter::once(&retry.default).chain(retry.by_target.iter().map(|(_, p)| p)) {
        let t = &policy.dead_letter;
        if t.starts_with("{target}") {
            continue;
        }
        let rule = match t.split_once("{target}") {
            Some((before, _)) => (before.to_owned(), Pattern::Prefixed),
            None => (t.clone(), Pattern::Literal),
        };
        if !out.contains(&rule) {
            out.push(rule);
        }
    }
    out
}

/// The rules as `kafka-acls` lines for `principal`, each after a comment.
pub fn kafka_acls_lines(
    rules: &[Acl],
    principal: &str,
    brokers: &str,
    command_config: &str,
) -> String {
    let mut out = String::new();
    for r in rules {
        let _ = writeln!(out, "# {}", r.why);
        if r.name == "*" {
            let _ = writeln!(
                out,
                "# (no --route or --target-allow: records may name any topic, so kafka-delay may write all of them)"
            );
        }
        let _ = write!(
            out,
            "kafka-acls --bootstrap-server {} --command-config {} --add --allow-principal {}",
            quote(brokers),
            quote(command_config),
            quote(principal)
        );
        for op in &r.operations {
            let _ = write!(out, " --operation {}", op.name());
        }
        let flag = match r.kind {
            Kind::Topic => "--topic",
            Kind::Group => "--group",
            Kind::TransactionalId => "--transactional-id",
            Kind::Cluster => "--cluster",
        };
        match r.kind {
            Kind::Cluster => out.push_str(" --cluster"),
            _ => {
                let _ = write!(out, " {flag} {}", quote(&r.name));
            }
        }
        if r.pattern == Pattern::Prefixed {
            out.push_str(" --resource-pattern-type prefixed");
        }
        out.push('\n');
    }
    out
}

/// `s` as one shell word.
fn quote(s: &str) -> String {
    if !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-:/,=@".contains(c))
    {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests;
