//! Asking the brokers of a cluster in turn, for what any of them can answer (a topic's
//! configuration, the cluster's defaults).
//!
//! librdkafka sends an admin request to the controller it knows, which in KRaft is a broker the
//! metadata names at random, and waits for that broker alone. A broker cut off from this
//! instance (its packets dropped) answers nothing, so a start that met it failed after the
//! request's timeout, although every other broker would have answered. [`in_turn`] asks the
//! next broker when one times out; the order is pure, the asking is the caller's. A broker that
//! timed out is asked last for a while after ([`SILENT_FOR`]), and so is librdkafka's pick,
//! which may be that broker: a start that meets a cut-off broker waits for it once, not once
//! per request.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::client::Client;
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::ClientContext;

/// How long each broker is given to answer before the next is asked.
pub const EACH: Duration = Duration::from_secs(5);

/// The ids of the brokers `client`'s metadata names, in its order. Blocking.
///
/// # Errors
/// The metadata request failed.
pub fn ids<C: ClientContext>(client: &Client<C>) -> KafkaResult<Vec<i32>> {
    let md = client.fetch_metadata(None, Duration::from_secs(10))?;
    Ok(md
        .brokers()
        .iter()
        .map(rdkafka::metadata::MetadataBroker::id)
        .collect())
}

/// How long a broker that did not answer in time is asked after the others.
const SILENT_FOR: Duration = Duration::from_secs(60);

/// The brokers that did not answer in time, and when.
#[derive(Debug, Default)]
struct Silent(Mutex<HashMap<i32, Instant>>);

impl Silent {
    fn note(&self, broker: i32) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(broker, Instant::now());
    }

    /// Whether any broker was silent within [`SILENT_FOR`], and which.
    fn recent(&self) -> Vec<i32> {
        let mut silent = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        silent.retain(|_, at| at.elapsed() < SILENT_FOR);
        silent.keys().copied().collect()
    }
}

/// This process's memory of silent brokers, shared by every request [`in_turn`] makes.
static SILENT: std::sync::LazyLock<Silent> = std::sync::LazyLock::new(Silent::default);

/// `ask` of each target in turn (`None`: the broker librdkafka picks) while the one asked
/// times out; the first answer that is not a timeout, whatever it says. A broker that timed
/// out lately, and librdkafka's pick while one did, are asked after the others.
///
/// # Errors
/// The first error that is not a timeout, or the last timeout.
pub fn in_turn<T>(
    targets: impl IntoIterator<Item = Option<i32>>,
    ask: impl FnMut(Option<i32>) -> KafkaResult<T>,
) -> KafkaResult<T> {
    in_turn_noting(&SILENT, targets, ask)
}

fn in_turn_noting<T>(
    silent: &Silent,
    targets: impl IntoIterator<Item = Option<i32>>,
    mut ask: impl FnMut(Option<i32>) -> KafkaResult<T>,
) -> KafkaResult<T> {
    let recent = silent.recent();
    let mut last = None;
    let mut asking = |target: Option<i32>| match ask(target) {
        Err(e) if timed_out(&e) => {
            if let Some(broker) = target {
                silent.note(broker);
            }
            last = Some(e);
            None
        }
        answered => Some(answered),
    };
    // Lazily: a caller's later targets may cost a request to list.
    let mut later = Vec::new();
    for target in targets {
        if !recent.is_empty() && target.is_none_or(|b| recent.contains(&b)) {
            later.push(target);
        } else if let Some(answer) = asking(target) {
            return answer;
        }
    }
    if let Some(answer) = later.into_iter().find_map(&mut asking) {
        return answer;
    }
    Err(last.unwrap_or(KafkaError::AdminOp(RDKafkaErrorCode::BrokerNotAvailable)))
}

/// Whether the broker asked did not answer in time (an admin request's error carries its code
/// apart: rdkafka's `rdkafka_error_code` does not give it).
fn timed_out(e: &KafkaError) -> bool {
    let code = match e {
        KafkaError::AdminOp(code) => Some(*code),
        other => other.rdkafka_error_code(),
    };
    matches!(
        code,
        Some(RDKafkaErrorCode::OperationTimedOut | RDKafkaErrorCode::RequestTimedOut)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMED_OUT: KafkaError = KafkaError::AdminOp(RDKafkaErrorCode::OperationTimedOut);

    #[test]
    fn the_next_broker_is_asked_only_while_one_times_out() {
        let mut asked = Vec::new();
        let got = in_turn_noting(&Silent::default(), [None, Some(1), Some(2), Some(3)], |b| {
            asked.push(b);
            match b {
                None | Some(1) => Err(TIMED_OUT),
                Some(n) => Ok(n),
            }
        });
        assert_eq!(got.unwrap(), 2);
        assert_eq!(asked, [None, Some(1), Some(2)]);

        // A refusal is an answer: the others would say the same.
        let mut asked = Vec::new();
        let refused = KafkaError::AdminOp(RDKafkaErrorCode::ClusterAuthorizationFailed);
        let got: KafkaResult<()> = in_turn_noting(&Silent::default(), [Some(1), Some(2)], |b| {
            asked.push(b);
            Err(refused.clone())
        });
        assert_eq!(got.unwrap_err(), refused);
        assert_eq!(asked, [Some(1)]);
    }

    #[test]
    fn when_every_broker_times_out_the_last_timeout_is_the_error() {
        let got: KafkaResult<()> =
            in_turn_noting(&Silent::default(), [None, Some(1)], |_| Err(TIMED_OUT));
        assert_eq!(got.unwrap_err(), TIMED_OUT);
        let none: KafkaResult<()> = in_turn_noting(&Silent::default(), [], |_| Ok(()));
        assert!(none.is_err());
    }

    #[test]
    fn a_broker_that_timed_out_is_asked_last_and_so_is_librdkafkas_pick() {
        let silent = Silent::default();
        let answering = |asked: &mut Vec<Option<i32>>, b: Option<i32>| {
            asked.push(b);
            match b {
                None | Some(1) => Err(TIMED_OUT),
                Some(n) => Ok(n),
            }
        };
        let mut asked = Vec::new();
        let got = in_turn_noting(&silent, [None, Some(1), Some(2)], |b| {
            answering(&mut asked, b)
        });
        assert_eq!(got.unwrap(), 2);
        assert_eq!(asked, [None, Some(1), Some(2)]);

        // Broker 1 timed out: the next request asks it, and librdkafka's pick, after the rest.
        let mut asked = Vec::new();
        let got = in_turn_noting(&silent, [None, Some(1), Some(2), Some(3)], |b| {
            answering(&mut asked, b)
        });
        assert_eq!(got.unwrap(), 2);
        assert_eq!(asked, [Some(2)]);

        let mut asked = Vec::new();
        let got: KafkaResult<()> = in_turn_noting(&silent, [None, Some(1), Some(3)], |b| {
            asked.push(b);
            Err(TIMED_OUT)
        });
        assert_eq!(got.unwrap_err(), TIMED_OUT);
        assert_eq!(asked, [Some(3), None, Some(1)]);
    }
}
