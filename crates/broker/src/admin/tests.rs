use axum::http::HeaderMap;
use serde_json::json;

use super::guard::*;
use super::records::*;
use super::*;

#[test]
fn pages_of_other_origins_and_rebound_host_names_are_refused() {
    let h = |pairs: &[(&'static str, &str)]| {
        let mut m = HeaderMap::new();
        for (k, v) in pairs {
            m.insert(*k, v.parse().unwrap());
        }
        m
    };
    // curl: no Origin, no Sec-Fetch-Site.
    assert!(same_origin(&h(&[("host", "127.0.0.1:9464")]), true).is_ok());
    assert!(same_origin(&h(&[("host", "localhost")]), true).is_ok());
    assert!(same_origin(&h(&[("host", "[::1]:9464")]), true).is_ok());
    // The console's own page.
    let own = [
        ("host", "127.0.0.1:9464"),
        ("origin", "http://127.0.0.1:9464"),
        ("sec-fetch-site", "same-origin"),
    ];
    assert!(same_origin(&h(&own), true).is_ok());
    // Another site's page posting to the loopback API.
    for bad in [
        vec![
            ("host", "127.0.0.1:9464"),
            ("origin", "https://evil.example"),
        ],
        vec![("host", "127.0.0.1:9464"), ("origin", "null")],
        vec![("host", "127.0.0.1:9464"), ("sec-fetch-site", "cross-site")],
        vec![
            ("host", "127.0.0.1:9464"),
            ("origin", "http://127.0.0.1:8080"),
        ],
    ] {
        assert_eq!(
            same_origin(&h(&bad), true).unwrap_err().0,
            StatusCode::FORBIDDEN,
            "{bad:?}"
        );
    }
    // DNS rebinding: another name for 127.0.0.1 is refused without a token, allowed with.
    let rebound = [
        ("host", "evil.example:9464"),
        ("origin", "http://evil.example:9464"),
    ];
    assert!(same_origin(&h(&rebound), true).is_err());
    assert!(same_origin(&h(&rebound), false).is_ok());
    assert!(!is_loopback_host("127.0.0.1.evil.example"));
    assert!(is_loopback_host("127.0.0.2:80"));
}

#[test]
fn the_openapi_document_lists_exactly_the_routes() {
    let doc: Value =
        serde_json::from_str(include_str!("../../../../schemas/admin.openapi.json")).unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let mut documented: Vec<(String, String)> = Vec::new();
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for method in ops.as_object().unwrap().keys() {
            if ["get", "post", "delete", "put", "patch"].contains(&method.as_str()) {
                documented.push((method.clone(), path.clone()));
            }
        }
    }
    documented.sort();
    let mut routes: Vec<(String, String)> = ROUTES
        .iter()
        .chain(&crate::admin::console::ROUTES)
        .map(|(m, p)| ((*m).into(), (*p).into()))
        .collect();
    routes.sort();
    assert_eq!(documented, routes);
}

#[test]
fn without_a_token_only_a_loopback_listener_answers() {
    let dir = tempfile::TempDir::new().unwrap();
    let store = Arc::new(Store::open(dir.path(), crate::store::StoreOptions::default()).unwrap());
    let (tx, _rx) = tokio::sync::mpsc::channel(1);
    let admin = |token: Option<&str>, loopback| Admin {
        store: store.clone(),
        scheduler: tx.clone(),
        clock: Arc::new(kafka_delay_core::clock::SystemClock),
        metrics: Metrics::new(&prometheus::Registry::new(), &Default::default()).unwrap(),
        token: token.map(str::to_owned),
        loopback,
        max_delay_ms: 1,
        console: crate::admin::console::Console::default(),
        cluster: Arc::new(crate::durability::Local::new(store.clone(), 512)),
    };
    let none = HeaderMap::new();
    let mut good = HeaderMap::new();
    good.insert("authorization", "Bearer t0ken-t0ken-t0ken".parse().unwrap());
    assert!(admin(None, true).authorize(&none).is_ok());
    assert_eq!(
        admin(None, false).authorize(&good).unwrap_err().0,
        StatusCode::FORBIDDEN
    );
    let with = admin(Some("t0ken-t0ken-t0ken"), false);
    assert!(with.authorize(&good).is_ok());
    assert_eq!(
        with.authorize(&none).unwrap_err().0,
        StatusCode::UNAUTHORIZED
    );
    assert!(
        !format!("{with:?}").contains("t0ken"),
        "the token is never printed"
    );
}

#[test]
fn ids_and_times() {
    assert_eq!(
        parse_id("0001000000000007").unwrap(),
        RecordId::new(1, 7).unwrap()
    );
    assert!(parse_id("7").is_err());
    assert!(parse_id("zz01000000000007").is_err());
    let w = When {
        due: None,
        delay: Some("30s".into()),
    };
    assert_eq!(w.resolve(1_000, 60_000).unwrap(), 31_000);
    let w = When {
        due: Some(json!(5_000)),
        delay: None,
    };
    assert_eq!(w.resolve(1_000, 60_000).unwrap(), 5_000);
    let w = When {
        due: Some(json!("2025-11-21T04:40:00Z")),
        delay: None,
    };
    assert_eq!(
        w.resolve(1_763_700_000_000, 60_000).unwrap(),
        1_763_700_000_000
    );
    let far = When {
        due: None,
        delay: Some("2m".into()),
    };
    assert!(far
        .resolve(0, 60_000)
        .unwrap_err()
        .1
        .contains("maximum delay"));
    assert!(When::default().resolve(0, 1).is_err());
    assert!(constant_time_eq(b"abc", b"abc") && !constant_time_eq(b"abc", b"abd"));
}
