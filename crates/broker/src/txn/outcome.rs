//! What one transaction came to, for the loop to answer its pieces and keep or renew its
//! producer.

use super::TxnError;

/// What one transaction came to.
#[derive(Debug)]
pub(super) struct Outcome {
    /// One answer per piece of work.
    pub(super) answers: Vec<Result<Vec<i64>, TxnError>>,
    /// The topics the authorizer refused.
    pub(super) refused: Vec<String>,
    /// Why its producer cannot begin another transaction, when it cannot: fenced, or an
    /// abort that failed, even when every piece was answered for its own refused records (a
    /// lone record to a refused topic: the next transaction, its dead letter, would fail on
    /// that producer, and the record go back to its target).
    pub(super) spent: Option<String>,
}

impl Outcome {
    /// The answers and refused topics of a transaction, and whether its abort failed.
    pub(super) fn new(
        answers: Vec<Result<Vec<i64>, TxnError>>,
        refused: Vec<String>,
        abort_failed: Option<&TxnError>,
    ) -> Self {
        let fenced = answers.iter().find_map(|r| match r {
            Err(TxnError::Fenced(why)) => Some(why.clone()),
            _ => None,
        });
        let spent = fenced.or_else(|| abort_failed.map(|e| format!("the abort failed: {e}")));
        Self {
            answers,
            refused,
            spent,
        }
    }
}
