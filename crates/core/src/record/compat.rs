//! The etf1 kafka-message-scheduler form of the contract, accepted as is: the key is the
//! schedule id, `scheduler-epoch` the due time in seconds, `scheduler-target-topic` the target.

use super::{
    control, names, user_headers, Command, Contract, Incoming, Reason, Reject, StoredRecord,
};

impl Contract {
    /// The etf1 kafka-message-scheduler form: key = id, `scheduler-epoch` in seconds.
    pub(super) fn interpret_compat(
        &self,
        rec: &Incoming<'_>,
        target: Option<&str>,
        now_ms: u64,
    ) -> Result<Command, Reject> {
        let id = match rec.key {
            Some(k) if !k.is_empty() => k,
            _ => {
                return Err(Reject::new(
                    Reason::MissingId,
                    "scheduler-* record without a key: the key is the schedule id",
                ))
            }
        };
        if rec.value.is_none() {
            return Ok(Command::Cancel { id: id.to_vec() });
        }
        let Some(target) = target else {
            return Err(Reject::new(
                Reason::MissingTarget,
                "no delay-target or scheduler-target-topic header",
            ));
        };
        self.check_target(target)?;
        super::route::check(&self.routes, rec.topic, target)?;
        let due_ms = self.due_time(rec, now_ms)?;
        let key = match control(rec.headers, names::SCHEDULER_TARGET_KEY)? {
            Some(k) => Some(k.as_bytes()),
            None => rec.key,
        };
        Ok(Command::Schedule(StoredRecord::new(
            due_ms,
            target,
            Some(id),
            key,
            rec.value,
            user_headers(rec.headers),
        )))
    }
}
