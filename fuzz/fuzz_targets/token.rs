//! The token checker and the JWKS reader: any bytes as a token are refused with a reason (no
//! key here signs anything), and any bytes as a JWKS document are read or refused, never a
//! crash.

#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use mqkv_broker::tokens::{TokenSettings, TokenVerifier};

/// A public key whose private half nobody has.
const KEY: &[u8] = b"-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEuEC3Jg3pJAo+2vKqi5Fo4ZSdYSES
gveqduz34YGNGfu8PclrdntyvEMiSyw/qyWG2jufJmB3NXtT1FDwPmHqzw==
-----END PUBLIC KEY-----
";

fn verifier() -> &'static TokenVerifier {
    static V: OnceLock<TokenVerifier> = OnceLock::new();
    V.get_or_init(|| {
        let settings = TokenSettings {
            audiences: vec!["aio-internal".into()],
            ..Default::default()
        };
        TokenVerifier::from_keys(&[(PathBuf::from("key.pem"), KEY.to_vec())], None, &settings)
            .expect("the key reads")
    })
}

fuzz_target!(|data: &[u8]| {
    assert!(verifier().verify(data).is_err());
    let jwks = (PathBuf::from("jwks.json"), data.to_vec());
    let _ = TokenVerifier::from_keys(&[], Some(&jwks), &TokenSettings::default());
});
