//! Routes (`--route SOURCES=TARGETS`): which targets the records of which source topics may
//! name, so that a tenant allowed to write only its own delay topics cannot reach another
//! tenant's topics through kafka-delay (a confused deputy otherwise: kafka-delay may write
//! every target). With no route every target passes; with routes, the first route whose
//! source regex matches a record's topic decides, and a topic no route names may name none.

use regex::Regex;

use super::{Reason, Reject};

/// One `--route`: source topics (a regex) and the targets their records may name (a regex).
#[derive(Debug, Clone)]
pub struct Route {
    sources: Regex,
    targets: Regex,
}

impl Route {
    /// Reads `SOURCES=TARGETS`, two regexes (a topic name cannot hold `=`, so the first one
    /// splits them).
    ///
    /// # Errors
    /// What is wrong with the text, in a sentence.
    pub fn parse(spec: &str) -> Result<Self, String> {
        let Some((sources, targets)) = spec.split_once('=') else {
            return Err(format!(
                "'{spec}' is not SOURCES=TARGETS (two regexes, e.g. 'delay\\.team-a\\..*=^team-a\\.')"
            ));
        };
        let regex = |what: &str, r: &str| {
            if r.is_empty() {
                return Err(format!("'{spec}': the {what} regex is empty"));
            }
            Regex::new(r).map_err(|e| format!("'{spec}': the {what} regex: {e}"))
        };
        Ok(Self {
            sources: regex("source", sources)?,
            targets: regex("target", targets)?,
        })
    }
}

impl Route {
    /// The targets its records may name.
    pub fn targets(&self) -> &Regex {
        &self.targets
    }
}

impl std::fmt::Display for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}={}", self.sources, self.targets)
    }
}

/// Checks that a record of source topic `source` may name `target` under `routes`.
///
/// # Errors
/// A [`Reason::TargetNotAllowed`] naming the route that refuses it, or saying that no route
/// names the source topic.
pub(super) fn check(routes: &[Route], source: &str, target: &str) -> Result<(), Reject> {
    if routes.is_empty() {
        return Ok(());
    }
    match routes.iter().find(|r| r.sources.is_match(source)) {
        Some(r) if r.targets.is_match(target) => Ok(()),
        Some(r) => Err(Reject::new(
            Reason::TargetNotAllowed,
            format!("target topic '{target}' is not one records of '{source}' may name (route '{r}')"),
        )),
        None => Err(Reject::new(
            Reason::TargetNotAllowed,
            format!("no route names source topic '{source}': with --route, every source topic needs one"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sources_records_name_only_the_targets_of_its_first_route() {
        let routes = [
            Route::parse(r"^delay\.team-a\..*=^team-a\.").unwrap(),
            Route::parse(r"^delay\.retry$=^team-(a|b)\.").unwrap(),
            Route::parse(r"^delay\.=^shared$").unwrap(),
        ];
        assert!(check(&routes, "delay.team-a.orders", "team-a.orders").is_ok());
        let refused = check(&routes, "delay.team-a.orders", "team-b.payments").unwrap_err();
        assert_eq!(refused.reason, Reason::TargetNotAllowed);
        assert!(
            refused
                .detail
                .contains(r"route '^delay\.team-a\..*=^team-a\.'"),
            "{}",
            refused.detail
        );
        assert!(check(&routes, "delay.retry", "team-b.payments").is_ok());
        // The first match decides: team-a's topic may not name "shared".
        assert!(check(&routes, "delay.team-a.x", "shared").is_err());
        assert!(check(&routes, "delay.team-c.x", "shared").is_ok());
        let unnamed = check(&routes, "other.topic", "shared").unwrap_err();
        assert!(unnamed
            .detail
            .contains("no route names source topic 'other.topic'"));
        assert!(check(&[], "anything", "anywhere").is_ok());
    }

    #[test]
    fn a_route_is_two_regexes() {
        for bad in ["no-equals", "=^x$", "^x$=", "([=^x"] {
            assert!(Route::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(Route::parse("^a=^b").unwrap().to_string(), "^a=^b");
    }
}
