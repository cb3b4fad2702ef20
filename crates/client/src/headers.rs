//! The contract's headers to and from rdkafka's: the one place the two types meet, used by
//! applications through [`crate::DelayedRecord`] and by the broker itself.

use kafka_delay_core::record::{Header, HeaderRef};
use rdkafka::message::{Headers, OwnedHeaders};

/// Converts rdkafka headers to the contract's.
pub fn headers_from<H: Headers>(headers: Option<&H>) -> Vec<Header> {
    headers.map_or_else(Vec::new, |hs| {
        hs.iter().map(|h| header_ref(h).to_header()).collect()
    })
}

/// Reads rdkafka headers in place, as the contract reads a consumed record's: `into` is
/// cleared and refilled, so that one list serves a whole group of records.
pub fn header_refs<'a, H: Headers>(headers: Option<&'a H>, into: &mut Vec<HeaderRef<'a>>) {
    into.clear();
    if let Some(headers) = headers {
        into.extend(headers.iter().map(header_ref));
    }
}

fn header_ref<'a>(h: rdkafka::message::Header<'a, &'a [u8]>) -> HeaderRef<'a> {
    HeaderRef {
        key: h.key,
        value: h.value,
    }
}

/// Converts the contract's headers to rdkafka's.
pub fn headers_to(headers: &[Header]) -> OwnedHeaders {
    headers
        .iter()
        .fold(OwnedHeaders::new_with_capacity(headers.len()), |acc, h| {
            acc.insert(rdkafka::message::Header {
                key: &h.key,
                value: h.value.as_deref(),
            })
        })
}

#[cfg(test)]
mod tests {
    use rdkafka::message::Headers;

    use super::*;

    #[test]
    fn headers_convert_both_ways() {
        let hs = vec![
            Header::new("a", "1"),
            Header {
                key: "b".into(),
                value: None,
            },
        ];
        let owned = headers_to(&hs);
        let back: Vec<Header> = owned
            .iter()
            .map(|h| Header {
                key: h.key.to_owned(),
                value: h.value.map(<[u8]>::to_vec),
            })
            .collect();
        assert_eq!(back, hs);
    }
}
