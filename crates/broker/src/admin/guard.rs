//! Who may call the API: the same-origin guard against other sites' pages (CSRF, DNS
//! rebinding) and the token comparison.

use axum::http::{HeaderMap, StatusCode};

use super::ApiError;

/// Refuses what a page of another origin could send from an operator's browser (CSRF), and,
/// when no token is set, a request for a host name that is not a loopback one (DNS rebinding:
/// another site's name made to point at 127.0.0.1 would make its pages same-origin).
///
/// Browsers mark every request a page makes: `Origin` on every POST and DELETE (and on
/// cross-origin GETs), `Sec-Fetch-Site` on all of them. A request whose `Origin` is not this
/// host, or whose `Sec-Fetch-Site` says another site, is refused; curl and other clients send
/// neither and are let through. The API never answers a CORS preflight, so a cross-origin
/// page cannot send a request with a JSON body or a bearer token either.
pub(super) fn same_origin(headers: &HeaderMap, loopback_only: bool) -> Result<(), ApiError> {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let host = get("host").unwrap_or_default();
    let refuse = |why: String| Err(ApiError(StatusCode::FORBIDDEN, why));
    if let Some(origin) = get("origin") {
        let authority = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"));
        if authority != Some(host) {
            return refuse(format!(
                "cross-origin request refused: Origin {origin} is not this server ({host})"
            ));
        }
    }
    if matches!(get("sec-fetch-site"), Some("cross-site" | "same-site")) {
        return refuse("cross-site request refused".into());
    }
    if loopback_only && !host.is_empty() && !is_loopback_host(host) {
        return refuse(format!(
            "host '{host}' is not a loopback name: without --admin-token the API answers only \
             requests for 127.0.0.1, [::1] or localhost"
        ));
    }
    Ok(())
}

/// Whether a `Host` header names a loopback address (with or without a port).
pub(super) fn is_loopback_host(host: &str) -> bool {
    let name = match host.rsplit_once(':') {
        Some((name, port)) if port.chars().all(|c| c.is_ascii_digit()) && !name.ends_with(':') => {
            name
        }
        _ => host,
    };
    let name = name.trim_start_matches('[').trim_end_matches(']');
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

pub(super) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
