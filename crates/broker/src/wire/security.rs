//! A connection to a Kafka broker that authenticates as the broker's librdkafka clients do,
//! from the same `--kafka-config` properties: `security.protocol` PLAINTEXT, SSL,
//! SASL_PLAINTEXT or SASL_SSL; TLS with `ssl.ca.location`, `ssl.certificate.location`,
//! `ssl.key.location` (and `ssl.key.password`), `ssl.endpoint.identification.algorithm` and
//! `enable.ssl.certificate.verification`; SASL PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 with
//! `sasl.username` and `sasl.password`. What else librdkafka can do (GSSAPI, OAUTHBEARER, keys
//! in PEM strings or keystores) is refused by [`Security::from_properties`], saying which
//! property.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::Path;
use std::time::Duration;

use openssl::pkey::PKey;
use openssl::ssl::{SslConnector, SslFiletype, SslMethod, SslStream, SslVerifyMode};

use super::scram::{self, Hash};
use super::{compact_bytes, exchange, framed, header, string, Reader, WireError};
use crate::config::KafkaProp;

/// SaslHandshake's API key.
const SASL_HANDSHAKE: i16 = 17;
/// SaslAuthenticate's API key.
const SASL_AUTHENTICATE: i16 = 36;

/// How to reach and authenticate to the brokers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Security {
    tls: Option<Tls>,
    sasl: Option<Sasl>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Tls {
    ca: Option<String>,
    certificate: Option<String>,
    key: Option<String>,
    key_password: Option<String>,
    verify_peer: bool,
    verify_host: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Sasl {
    Plain {
        user: String,
        password: String,
    },
    Scram {
        hash: Hash,
        user: String,
        password: String,
    },
}

/// Properties that name keys or certificates in a way these connections do not read.
const UNREAD: &[&str] = &[
    "ssl.ca.pem",
    "ssl.certificate.pem",
    "ssl.key.pem",
    "ssl.keystore.location",
    "ssl.engine.location",
    "ssl.providers",
    "ssl.ca.certificate.stores",
];

impl Security {
    /// From librdkafka's properties (the last of a key wins, as in librdkafka).
    ///
    /// # Errors
    /// What these connections cannot do, naming the property.
    pub fn from_properties(props: &[KafkaProp]) -> Result<Self, String> {
        let get = |k: &str| {
            props
                .iter()
                .rev()
                .find(|p| p.key == k)
                .map(|p| p.value.clone())
        };
        let protocol = get("security.protocol")
            .unwrap_or_else(|| "plaintext".to_owned())
            .to_ascii_lowercase();
        let (tls, sasl) = match protocol.as_str() {
            "plaintext" => (false, false),
            "ssl" => (true, false),
            "sasl_plaintext" => (false, true),
            "sasl_ssl" => (true, true),
            other => return Err(format!("security.protocol={other} is not known here")),
        };
        let tls = tls
            .then(|| -> Result<Tls, String> {
                if let Some(k) = UNREAD.iter().find(|k| get(k).is_some()) {
                    return Err(format!("{k} is not read here (give files: ssl.ca.location, ssl.certificate.location, ssl.key.location)"));
                }
                let on = |k: &str, default: bool| {
                    get(k).map_or(default, |v| !matches!(v.to_ascii_lowercase().as_str(), "false" | "none" | "0"))
                };
                Ok(Tls {
                    ca: get("ssl.ca.location").filter(|c| c != "probe"),
                    certificate: get("ssl.certificate.location"),
                    key: get("ssl.key.location"),
                    key_password: get("ssl.key.password"),
                    verify_peer: on("enable.ssl.certificate.verification", true),
                    verify_host: on("ssl.endpoint.identification.algorithm", true),
                })
            })
            .transpose()?;
        let sasl = sasl
            .then(|| -> Result<Sasl, String> {
                let mechanism = get("sasl.mechanisms")
                    .or_else(|| get("sasl.mechanism"))
                    .unwrap_or_else(|| "GSSAPI".to_owned())
                    .to_ascii_uppercase();
                let user = get("sasl.username").unwrap_or_default();
                let password = get("sasl.password").unwrap_or_default();
                match mechanism.as_str() {
                    "PLAIN" => Ok(Sasl::Plain { user, password }),
                    "SCRAM-SHA-256" => Ok(Sasl::Scram { hash: Hash::Sha256, user, password }),
                    "SCRAM-SHA-512" => Ok(Sasl::Scram { hash: Hash::Sha512, user, password }),
                    other => Err(format!(
                        "sasl.mechanism={other} is not spoken here (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 are)"
                    )),
                }
            })
            .transpose()?;
        Ok(Self { tls, sasl })
    }

    /// A connection to `address` (`host:port`), authenticated. Blocking; each step waits at
    /// most `timeout`.
    ///
    /// # Errors
    /// The broker cannot be reached, TLS fails, or SASL refuses.
    pub fn connect(&self, address: &str, timeout: Duration) -> Result<Conn, WireError> {
        let io = |e: &dyn std::fmt::Display| WireError::Io {
            what: address.to_owned(),
            detail: e.to_string(),
        };
        let to = address
            .to_socket_addrs()
            .map_err(|e| io(&e))?
            .next()
            .ok_or_else(|| io(&"no address"))?;
        let tcp = TcpStream::connect_timeout(&to, timeout).map_err(|e| io(&e))?;
        tcp.set_read_timeout(Some(timeout)).map_err(|e| io(&e))?;
        tcp.set_write_timeout(Some(timeout)).map_err(|e| io(&e))?;
        tcp.set_nodelay(true).map_err(|e| io(&e))?;
        let stream = match &self.tls {
            None => Stream::Plain(tcp),
            Some(tls) => {
                let host = address.rsplit_once(':').map_or(address, |(h, _)| h);
                let host = host.trim_start_matches('[').trim_end_matches(']');
                Stream::Tls(Box::new(tls.connect(host, tcp).map_err(|e| io(&e))?))
            }
        };
        let mut conn = Conn {
            stream,
            correlation: 0,
        };
        if let Some(sasl) = &self.sasl {
            conn.authenticate(sasl)?;
        }
        Ok(conn)
    }
}

impl Tls {
    fn connect(&self, host: &str, tcp: TcpStream) -> Result<SslStream<TcpStream>, String> {
        let e = |e: &dyn std::fmt::Display| e.to_string();
        let mut b = SslConnector::builder(SslMethod::tls_client()).map_err(|x| e(&x))?;
        if let Some(ca) = &self.ca {
            if Path::new(ca).is_dir() {
                b.load_verify_locations(None, Some(Path::new(ca)))
            } else {
                b.set_ca_file(ca)
            }
            .map_err(|x| format!("ssl.ca.location {ca}: {x}"))?;
        }
        if let Some(cert) = &self.certificate {
            b.set_certificate_chain_file(cert)
                .map_err(|x| format!("ssl.certificate.location {cert}: {x}"))?;
        }
        if let Some(key) = &self.key {
            match &self.key_password {
                None => b.set_private_key_file(key, SslFiletype::PEM),
                Some(pass) => {
                    let pem =
                        std::fs::read(key).map_err(|x| format!("ssl.key.location {key}: {x}"))?;
                    let k = PKey::private_key_from_pem_passphrase(&pem, pass.as_bytes())
                        .map_err(|x| format!("ssl.key.location {key}: {x}"))?;
                    b.set_private_key(&k)
                }
            }
            .map_err(|x| format!("ssl.key.location {key}: {x}"))?;
        }
        if !self.verify_peer {
            b.set_verify(SslVerifyMode::NONE);
        }
        let mut c = b.build().configure().map_err(|x| e(&x))?;
        c.set_verify_hostname(self.verify_peer && self.verify_host);
        c.connect(host, tcp).map_err(|x| e(&x))
    }
}

enum Stream {
    Plain(TcpStream),
    Tls(Box<SslStream<TcpStream>>),
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

/// An authenticated connection to one broker.
pub struct Conn {
    stream: Stream,
    correlation: i32,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("correlation", &self.correlation)
            .finish_non_exhaustive()
    }
}

impl Conn {
    /// Sends the request `build` makes for the next correlation id and returns its answer
    /// (without its size).
    ///
    /// # Errors
    /// The connection failed.
    pub fn exchange(&mut self, build: impl FnOnce(i32) -> Vec<u8>) -> Result<Vec<u8>, WireError> {
        self.correlation += 1;
        exchange(&mut self.stream, &build(self.correlation)).map_err(|e| WireError::Io {
            what: "the broker".to_owned(),
            detail: e.to_string(),
        })
    }

    fn authenticate(&mut self, sasl: &Sasl) -> Result<(), WireError> {
        let mechanism = match sasl {
            Sasl::Plain { .. } => "PLAIN",
            Sasl::Scram {
                hash: Hash::Sha256, ..
            } => "SCRAM-SHA-256",
            Sasl::Scram {
                hash: Hash::Sha512, ..
            } => "SCRAM-SHA-512",
        };
        let answer = self.exchange(|c| handshake(c, mechanism))?;
        handshake_answer(&answer, mechanism)?;
        match sasl {
            Sasl::Plain { user, password } => {
                self.authenticate_step(format!("\0{user}\0{password}").as_bytes())?;
            }
            Sasl::Scram {
                hash,
                user,
                password,
            } => {
                let mut nonce = [0u8; 24];
                openssl::rand::rand_bytes(&mut nonce)
                    .map_err(|e| WireError::Auth(e.to_string()))?;
                let client = scram::Client::new(
                    *hash,
                    user,
                    password,
                    &openssl::base64::encode_block(&nonce),
                );
                let server_first = self.authenticate_step(client.first().as_bytes())?;
                let last = client
                    .finish(&String::from_utf8_lossy(&server_first))
                    .map_err(WireError::Auth)?;
                let server_final = self.authenticate_step(last.message.as_bytes())?;
                last.verify(&String::from_utf8_lossy(&server_final))
                    .map_err(WireError::Auth)?;
            }
        }
        Ok(())
    }

    fn authenticate_step(&mut self, bytes: &[u8]) -> Result<Vec<u8>, WireError> {
        let answer = self.exchange(|c| authenticate(c, bytes))?;
        authenticate_answer(&answer)
    }
}

/// A SaslHandshake (v1) request for `mechanism`, framed.
fn handshake(correlation: i32, mechanism: &str) -> Vec<u8> {
    let mut b = header(SASL_HANDSHAKE, 1, correlation, false);
    string(&mut b, mechanism);
    framed(b)
}

/// Whether a SaslHandshake (v1) answer takes `mechanism`.
fn handshake_answer(answer: &[u8], mechanism: &str) -> Result<(), WireError> {
    let bad = || WireError::Malformed("SaslHandshake");
    let mut r = Reader(answer);
    r.response_header(false).ok_or_else(bad)?;
    let code = r.i16().ok_or_else(bad)?;
    if code == 0 {
        return Ok(());
    }
    let n = r.i32().ok_or_else(bad)?.max(0);
    let offered: Vec<String> = (0..n).filter_map(|_| r.string()).collect();
    Err(WireError::Auth(format!(
        "the broker does not take SASL {mechanism} here (it takes {})",
        offered.join(", ")
    )))
}

/// A SaslAuthenticate (v2) request carrying `bytes`, framed.
fn authenticate(correlation: i32, bytes: &[u8]) -> Vec<u8> {
    let mut b = header(SASL_AUTHENTICATE, 2, correlation, true);
    compact_bytes(&mut b, Some(bytes));
    b.push(0);
    framed(b)
}

/// The server's bytes from a SaslAuthenticate (v2) answer.
fn authenticate_answer(answer: &[u8]) -> Result<Vec<u8>, WireError> {
    let bad = || WireError::Malformed("SaslAuthenticate");
    let mut r = Reader(answer);
    r.response_header(true).ok_or_else(bad)?;
    let code = r.i16().ok_or_else(bad)?;
    let message = r.compact_str().ok_or_else(bad)?;
    if code != 0 {
        return Err(WireError::Auth(format!(
            "SASL authentication failed (error code {code}){}",
            message.map(|m| format!(": {m}")).unwrap_or_default()
        )));
    }
    Ok(r.compact_bytes()
        .ok_or_else(bad)?
        .unwrap_or_default()
        .to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(kv: &[(&str, &str)]) -> Vec<KafkaProp> {
        kv.iter()
            .map(|(k, v)| KafkaProp {
                key: (*k).to_owned(),
                value: (*v).to_owned(),
            })
            .collect()
    }

    #[test]
    fn the_properties_say_how_to_connect_or_what_is_not_spoken() {
        assert_eq!(Security::from_properties(&[]), Ok(Security::default()));
        let s = Security::from_properties(&props(&[
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanisms", "SCRAM-SHA-512"),
            ("sasl.username", "u"),
            ("sasl.password", "p"),
            ("ssl.ca.location", "/ca.pem"),
        ]))
        .unwrap();
        assert_eq!(
            s.sasl,
            Some(Sasl::Scram {
                hash: Hash::Sha512,
                user: "u".into(),
                password: "p".into()
            })
        );
        let tls = s.tls.unwrap();
        assert_eq!(
            (tls.ca.as_deref(), tls.verify_peer, tls.verify_host),
            (Some("/ca.pem"), true, true)
        );
        let s = Security::from_properties(&props(&[
            ("security.protocol", "ssl"),
            ("ssl.endpoint.identification.algorithm", "none"),
        ]))
        .unwrap();
        assert_eq!((s.sasl, s.tls.map(|t| t.verify_host)), (None, Some(false)));
        let refused = |kv: &[(&str, &str)]| Security::from_properties(&props(kv)).unwrap_err();
        assert!(refused(&[("security.protocol", "SASL_PLAINTEXT")]).contains("GSSAPI"));
        assert!(refused(&[
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanism", "OAUTHBEARER")
        ])
        .contains("OAUTHBEARER"));
        assert!(
            refused(&[("security.protocol", "SSL"), ("ssl.key.pem", "x")]).contains("ssl.key.pem")
        );
        assert!(refused(&[("security.protocol", "quic")]).contains("quic"));
    }

    #[test]
    fn the_sasl_requests_and_answers_read_as_kafka_writes_them() {
        let b = handshake(3, "PLAIN");
        assert_eq!(&b[4..12], &[0, 17, 0, 1, 0, 0, 0, 3]);
        assert_eq!(&b[b.len() - 7..], &[0, 5, b'P', b'L', b'A', b'I', b'N']);
        // Refused: the mechanisms offered are named.
        let mut a = vec![0, 0, 0, 3, 0, 33, 0, 0, 0, 1];
        a.extend([0, 5, b'P', b'L', b'A', b'I', b'N']);
        let e = handshake_answer(&a, "SCRAM-SHA-512").unwrap_err();
        assert!(e.to_string().contains("PLAIN"), "{e}");
        assert!(handshake_answer(&[0, 0, 0, 3, 0, 0, 0, 0, 0, 0], "PLAIN").is_ok());
        let b = authenticate(4, b"hi");
        assert_eq!(&b[b.len() - 4..], &[3, b'h', b'i', 0]);
        // Correlation, tagged; code 0, no message, bytes "ok", lifetime, tagged.
        let mut a = vec![0, 0, 0, 4, 0, 0, 0, 0, 3, b'o', b'k'];
        a.extend(0i64.to_be_bytes());
        a.push(0);
        assert_eq!(authenticate_answer(&a).unwrap(), b"ok");
        let a = [0, 0, 0, 4, 0, 0, 58, 4, b'b', b'a', b'd', 0];
        let e = authenticate_answer(&a).unwrap_err();
        assert!(
            e.to_string().contains("58") && e.to_string().contains("bad"),
            "{e}"
        );
    }
}
