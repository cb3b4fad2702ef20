//! The most recently fired records, kept in memory for the web console: a bounded ring, so
//! that what an operator can look back on costs a fixed amount of memory (about 1,000 records
//! of a few hundred bytes) and nothing is read back from the targets.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use serde::Serialize;

/// Records kept.
pub const CAPACITY: usize = 1_000;
/// Longest key or delay-id kept, bytes (longer ones are cut).
const MAX_TEXT: usize = 256;

/// One fired record as the console shows it.
#[derive(Debug, Clone, Serialize)]
pub struct Fired {
    /// The record's id while it was pending (shown as 16 hex digits, formatted only when read).
    #[serde(serialize_with = "hex_id")]
    pub id: u64,
    /// Target topic.
    pub target: String,
    /// Its key as text (lossy, cut at 256 bytes), if any.
    pub key: Option<String>,
    /// Its delay-id, if any.
    pub delay_id: Option<String>,
    /// Due time, epoch ms.
    pub due_ms: u64,
    /// Handed to the producer, epoch ms.
    pub fired_ms: u64,
    /// Acknowledged by the target, epoch ms.
    pub acked_ms: u64,
}

/// The ring, shared by the publisher (which adds) and the admin API (which reads).
#[derive(Debug, Clone, Default)]
pub struct History(Arc<Mutex<VecDeque<Fired>>>);

impl History {
    /// Adds fired records, dropping the oldest beyond [`CAPACITY`].
    pub fn extend(&self, fired: impl IntoIterator<Item = Fired>) {
        let mut ring = self.0.lock().unwrap_or_else(|e| e.into_inner());
        for f in fired {
            if ring.len() == CAPACITY {
                ring.pop_front();
            }
            ring.push_back(f);
        }
    }

    /// The newest first, at most `limit`, those for which `keep` holds.
    pub fn newest(&self, limit: usize, keep: impl Fn(&Fired) -> bool) -> Vec<Fired> {
        let ring = self.0.lock().unwrap_or_else(|e| e.into_inner());
        ring.iter()
            .rev()
            .filter(|f| keep(f))
            .take(limit)
            .cloned()
            .collect()
    }
}

fn hex_id<S: serde::Serializer>(id: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&format_args!("{id:016x}"))
}

/// `bytes` as text for display: lossy UTF-8, cut at a character boundary near [`MAX_TEXT`].
pub fn text(bytes: Option<&[u8]>) -> Option<String> {
    let b = bytes?;
    let s = String::from_utf8_lossy(&b[..b.len().min(MAX_TEXT)]);
    Some(s.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fired(n: u64) -> Fired {
        Fired {
            id: n,
            target: if n % 2 == 0 { "even" } else { "odd" }.into(),
            key: None,
            delay_id: None,
            due_ms: n,
            fired_ms: n,
            acked_ms: n,
        }
    }

    #[test]
    fn keeps_the_newest_up_to_its_capacity() {
        let h = History::default();
        h.extend((0..CAPACITY as u64 + 10).map(fired));
        let all = h.newest(usize::MAX, |_| true);
        assert_eq!(all.len(), CAPACITY);
        assert_eq!(all[0].due_ms, CAPACITY as u64 + 9);
        assert_eq!(all.last().unwrap().due_ms, 10);
        let odd = h.newest(3, |f| f.target == "odd");
        let dues: Vec<u64> = odd.iter().map(|f| f.due_ms).collect();
        assert_eq!(dues, vec![1_009, 1_007, 1_005]);
    }

    #[test]
    fn ids_are_shown_as_the_admin_api_shows_them() {
        let v = serde_json::to_value(fired(0x2a)).unwrap();
        assert_eq!(v["id"], "000000000000002a");
    }

    #[test]
    fn text_is_cut_and_lossy() {
        assert_eq!(text(None), None);
        assert_eq!(text(Some(b"a\xffb")).unwrap(), "a\u{fffd}b");
        assert_eq!(text(Some(&[b'x'; 1_000])).unwrap().len(), MAX_TEXT);
    }
}
