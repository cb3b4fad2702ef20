//! Asking the brokers of a cluster in turn, for what any of them can answer (a topic's
//! configuration, the cluster's defaults).
//!
//! librdkafka sends an admin request to the controller it knows, which in KRaft is a broker the
//! metadata names at random, and waits for that broker alone. A broker cut off from this
//! instance (its packets dropped) answers nothing, so a start that met it failed after the
//! request's timeout, although every other broker would have answered. [`in_turn`] asks the
//! next broker when one times out; the order is pure, the asking is the caller's.

use std::time::Duration;

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

/// `ask` of each target in turn (`None`: the broker librdkafka picks) while the one asked
/// times out; the first answer that is not a timeout, whatever it says.
///
/// # Errors
/// The first error that is not a timeout, or the last timeout.
pub fn in_turn<T>(
    targets: impl IntoIterator<Item = Option<i32>>,
    mut ask: impl FnMut(Option<i32>) -> KafkaResult<T>,
) -> KafkaResult<T> {
    let mut last = None;
    for target in targets {
        match ask(target) {
            Err(e) if timed_out(&e) => last = Some(e),
            answered => return answered,
        }
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
        let got = in_turn([None, Some(1), Some(2), Some(3)], |b| {
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
        let got: KafkaResult<()> = in_turn([Some(1), Some(2)], |b| {
            asked.push(b);
            Err(refused.clone())
        });
        assert_eq!(got.unwrap_err(), refused);
        assert_eq!(asked, [Some(1)]);
    }

    #[test]
    fn when_every_broker_times_out_the_last_timeout_is_the_error() {
        let got: KafkaResult<()> = in_turn([None, Some(1)], |_| Err(TIMED_OUT));
        assert_eq!(got.unwrap_err(), TIMED_OUT);
        let none: KafkaResult<()> = in_turn([], |_| Ok(()));
        assert!(none.is_err());
    }
}
