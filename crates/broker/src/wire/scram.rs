//! The client side of SCRAM (RFC 5802), as Kafka's SCRAM-SHA-256 and SCRAM-SHA-512 use it:
//! no channel binding, no extensions. Pure but for the hash functions.

use openssl::hash::{hash, MessageDigest};
use openssl::pkey::PKey;
use openssl::sign::Signer;

/// A SCRAM hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hash {
    /// SCRAM-SHA-256.
    Sha256,
    /// SCRAM-SHA-512.
    Sha512,
}

impl Hash {
    fn digest(self) -> MessageDigest {
        match self {
            Hash::Sha256 => MessageDigest::sha256(),
            Hash::Sha512 => MessageDigest::sha512(),
        }
    }
}

/// A SCRAM exchange under way: what the client sent first.
#[derive(Debug)]
pub struct Client {
    hash: Hash,
    password: String,
    nonce: String,
    first_bare: String,
}

/// What the client sends last, and the server signature it must then receive.
#[derive(Debug)]
pub struct Final {
    /// The client-final-message.
    pub message: String,
    /// The `v=` the server-final-message must carry.
    pub server_signature: String,
}

impl Client {
    /// An exchange for `user` with the client nonce `nonce` (printable, no commas).
    pub fn new(hash: Hash, user: &str, password: &str, nonce: &str) -> Self {
        let name = user.replace('=', "=3D").replace(',', "=2C");
        Self {
            hash,
            password: password.to_owned(),
            nonce: nonce.to_owned(),
            first_bare: format!("n={name},r={nonce}"),
        }
    }

    /// The client-first-message.
    pub fn first(&self) -> String {
        format!("n,,{}", self.first_bare)
    }

    /// The client-final-message answering `server_first`.
    ///
    /// # Errors
    /// A server-first-message that is malformed, an error, or a nonce that does not extend the
    /// client's.
    pub fn finish(&self, server_first: &str) -> Result<Final, String> {
        let field = |k: &str| {
            server_first
                .split(',')
                .find_map(|f| f.strip_prefix(k).and_then(|v| v.strip_prefix('=')))
        };
        if let Some(e) = field("e") {
            return Err(format!("the server refused: {e}"));
        }
        let bad = || format!("a malformed server-first-message: {server_first}");
        let nonce = field("r").ok_or_else(bad)?;
        if !nonce.starts_with(&self.nonce) || nonce.len() == self.nonce.len() {
            return Err("the server's nonce does not extend the client's".to_owned());
        }
        let salt = openssl::base64::decode_block(field("s").ok_or_else(bad)?).map_err(|_| bad())?;
        let rounds: usize = field("i").and_then(|i| i.parse().ok()).ok_or_else(bad)?;
        let d = self.hash.digest();
        let crypto = |e: openssl::error::ErrorStack| e.to_string();
        let mut salted = vec![0u8; d.size()];
        openssl::pkcs5::pbkdf2_hmac(self.password.as_bytes(), &salt, rounds, d, &mut salted)
            .map_err(crypto)?;
        let client_key = hmac(d, &salted, b"Client Key").map_err(crypto)?;
        let stored_key = hash(d, &client_key).map_err(crypto)?;
        let without_proof = format!("c=biws,r={nonce}");
        let auth = format!("{},{server_first},{without_proof}", self.first_bare);
        let signature = hmac(d, &stored_key, auth.as_bytes()).map_err(crypto)?;
        let proof: Vec<u8> = client_key
            .iter()
            .zip(&signature)
            .map(|(a, b)| a ^ b)
            .collect();
        let server_key = hmac(d, &salted, b"Server Key").map_err(crypto)?;
        let server_signature = hmac(d, &server_key, auth.as_bytes()).map_err(crypto)?;
        Ok(Final {
            message: format!(
                "{without_proof},p={}",
                openssl::base64::encode_block(&proof)
            ),
            server_signature: openssl::base64::encode_block(&server_signature),
        })
    }
}

impl Final {
    /// Whether `server_final` proves the server knew the password.
    ///
    /// # Errors
    /// An error from the server, or a signature that is not the one expected.
    pub fn verify(&self, server_final: &str) -> Result<(), String> {
        if let Some(e) = server_final.strip_prefix("e=") {
            return Err(format!("the server refused: {e}"));
        }
        match server_final.strip_prefix("v=") {
            Some(v) if v == self.server_signature => Ok(()),
            _ => Err("the server's signature is not the expected one".to_owned()),
        }
    }
}

fn hmac(d: MessageDigest, key: &[u8], data: &[u8]) -> Result<Vec<u8>, openssl::error::ErrorStack> {
    let key = PKey::hmac(key)?;
    let mut s = Signer::new(d, &key)?;
    s.update(data)?;
    s.sign_to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7677's example exchange (SCRAM-SHA-256).
    #[test]
    fn the_rfc_7677_exchange_comes_out_byte_for_byte() {
        let c = Client::new(Hash::Sha256, "user", "pencil", "rOprNGfwEbeRWgbNEkqO");
        assert_eq!(c.first(), "n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
        let server_first = "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
                            s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
        let f = c.finish(server_first).unwrap();
        assert_eq!(
            f.message,
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
             p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        );
        assert!(f
            .verify("v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
            .is_ok());
        assert!(f.verify("v=AAAA").is_err());
        assert!(f.verify("e=invalid-proof").is_err());
    }

    #[test]
    fn a_server_first_message_that_does_not_extend_the_nonce_or_says_no_is_refused() {
        let c = Client::new(Hash::Sha512, "a,b=c", "p", "abc");
        assert_eq!(c.first(), "n,,n=a=2Cb=3Dc,r=abc");
        assert!(c.finish("r=xyz123,s=QUJD,i=4096").is_err());
        assert!(c.finish("r=abc,s=QUJD,i=4096").is_err());
        assert!(c.finish("e=unknown-user").is_err());
        assert!(c.finish("r=abc1,i=4096").is_err());
        assert!(c.finish("r=abc1,s=QUJD,i=4096").is_ok());
    }
}
