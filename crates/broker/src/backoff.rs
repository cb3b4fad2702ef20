//! The one backoff of every "try again until it works" loop: a first pause, doubling up to a
//! cap.

use std::time::Duration;

/// Pauses that start at `first` and double up to `max`.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    /// Starts at `first`, doubling up to `max`.
    pub const fn new(first: Duration, max: Duration) -> Self {
        Self { next: first, max }
    }

    /// From 100 ms up to 10 s: a write to RocksDB or Kafka that must eventually succeed.
    pub const fn standard() -> Self {
        Self::new(Duration::from_millis(100), Duration::from_secs(10))
    }

    /// The pause to take now; the next one is twice as long (at most the cap).
    pub fn next_pause(&mut self) -> Duration {
        let now = self.next;
        self.next = (self.next * 2).min(self.max);
        now
    }

    /// Sleeps the pause [`Backoff::next_pause`] gives.
    pub async fn wait(&mut self) {
        tokio::time::sleep(self.next_pause()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_double_up_to_the_cap() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(350));
        let got: Vec<u128> = (0..4).map(|_| b.next_pause().as_millis()).collect();
        assert_eq!(got, [100, 200, 350, 350]);
    }
}
