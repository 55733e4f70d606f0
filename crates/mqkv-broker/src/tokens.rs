//! Token authentication: JSON Web Tokens such as Kubernetes service account tokens (what the
//! AIO SDKs send with the authentication method `K8S-SAT`), checked offline.
//!
//! A token is accepted when its signature verifies against one of the configured public keys
//! (PEM files or a JWKS file; RSA, EC or Ed25519, never a shared secret), it has not expired
//! (`exp` is required) and is already valid (`nbf`), and its issuer and audience are among the
//! configured ones. Its subject (or another claim) becomes the user name; configured claims
//! become attributes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use jsonwebtoken::{jwk::JwkSet, Algorithm, DecodingKey, Validation};
use parking_lot::RwLock;
use serde_json::Value;

use crate::access::Principal;

/// The authentication method whose data is a token.
pub const K8S_SAT: &str = "K8S-SAT";

/// How tokens are checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenSettings {
    /// PEM files, each holding a public key (RSA, EC or Ed25519).
    pub keys: Vec<PathBuf>,
    /// A JWKS file (a Kubernetes API server's `/openid/v1/jwks`, say).
    pub jwks: Option<PathBuf>,
    /// Issuers accepted (`iss`); empty: any.
    pub issuers: Vec<String>,
    /// Audiences accepted (`aud`); empty: any.
    pub audiences: Vec<String>,
    /// The claim that becomes the user name (default `sub`).
    pub username_claim: Option<String>,
    /// Attributes taken from claims: attribute name to claim path (`kubernetes.io.namespace`
    /// is the `namespace` member of the `kubernetes.io` object). Empty: `namespace` and
    /// `serviceaccount` from a Kubernetes token.
    pub attribute_claims: BTreeMap<String, String>,
    /// Clock skew allowed on `exp` and `nbf`, in seconds.
    pub leeway_secs: u64,
}

/// A token settings file or key that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TokenSetupError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Key { path: PathBuf, reason: String },
    #[error("token authentication needs at least one key or a JWKS file")]
    NoKeys,
}

/// Why a token was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("not a token: {0}")]
    Malformed(String),
    #[error("algorithm {0:?} is not accepted")]
    Algorithm(Algorithm),
    #[error("no key verifies it")]
    Signature,
    #[error("{0}")]
    Claims(String),
    #[error("no user name claim '{0}'")]
    NoUsername(String),
}

/// One verification key.
struct Key {
    kid: Option<String>,
    key: DecodingKey,
    /// The algorithms the key may verify.
    algorithms: &'static [Algorithm],
}

const RSA: &[Algorithm] = &[
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
];
const EC: &[Algorithm] = &[Algorithm::ES256, Algorithm::ES384];
const ED: &[Algorithm] = &[Algorithm::EdDSA];

/// Checks tokens against the keys and rules of one [`TokenSettings`].
pub struct TokenVerifier {
    keys: Vec<Key>,
    settings: TokenSettings,
}

impl std::fmt::Debug for TokenVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenVerifier")
            .field("keys", &self.keys.len())
            .field("settings", &self.settings)
            .finish()
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TokenSetupError> {
    std::fs::read(path).map_err(|source| TokenSetupError::Read {
        path: path.to_owned(),
        source,
    })
}

/// Reads a PEM public key of one kind.
type PemParser = fn(&[u8]) -> jsonwebtoken::errors::Result<DecodingKey>;

/// A public key from PEM: RSA, EC or Ed25519, whichever it is.
fn pem_key(path: &Path, pem: &[u8]) -> Result<Key, TokenSetupError> {
    let attempts: [(PemParser, &[Algorithm]); 3] = [
        (DecodingKey::from_rsa_pem, RSA),
        (DecodingKey::from_ec_pem, EC),
        (DecodingKey::from_ed_pem, ED),
    ];
    for (parse, algorithms) in attempts {
        if let Ok(key) = parse(pem) {
            return Ok(Key {
                kid: None,
                key,
                algorithms,
            });
        }
    }
    Err(TokenSetupError::Key {
        path: path.to_owned(),
        reason: "not a PEM public key (RSA, EC or Ed25519)".into(),
    })
}

/// The keys of a JWKS document.
fn jwks_keys(path: &Path, text: &[u8]) -> Result<Vec<Key>, TokenSetupError> {
    let bad = |reason: String| TokenSetupError::Key {
        path: path.to_owned(),
        reason,
    };
    let set: JwkSet = serde_json::from_slice(text).map_err(|e| bad(e.to_string()))?;
    let mut keys = Vec::new();
    for jwk in &set.keys {
        use jsonwebtoken::jwk::AlgorithmParameters as P;
        let algorithms = match &jwk.algorithm {
            P::RSA(_) => RSA,
            P::EllipticCurve(_) => EC,
            P::OctetKeyPair(_) => ED,
            // A shared secret is never a verification key here.
            P::OctetKey(_) => continue,
        };
        let key = DecodingKey::from_jwk(jwk).map_err(|e| bad(e.to_string()))?;
        keys.push(Key {
            kid: jwk.common.key_id.clone(),
            key,
            algorithms,
        });
    }
    Ok(keys)
}

/// The value at a dotted claim path (`kubernetes.io.namespace`): members are matched longest
/// first, so a member whose name holds dots (`kubernetes.io`) is found.
fn claim<'a>(claims: &'a Value, path: &str) -> Option<&'a Value> {
    if path.is_empty() {
        return Some(claims);
    }
    let object = claims.as_object()?;
    if let Some(v) = object.get(path) {
        return Some(v);
    }
    let mut split = path.len();
    while let Some(dot) = path[..split].rfind('.') {
        if let Some(v) = object.get(&path[..dot]) {
            if let Some(found) = claim(v, &path[dot + 1..]) {
                return Some(found);
            }
        }
        split = dot;
    }
    None
}

/// A claim as attribute text: strings as they are, numbers and booleans written out.
fn claim_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

impl TokenVerifier {
    /// Reads the keys `settings` names.
    pub fn load(settings: &TokenSettings) -> Result<TokenVerifier, TokenSetupError> {
        let pems = settings
            .keys
            .iter()
            .map(|path| Ok((path.clone(), read(path)?)))
            .collect::<Result<Vec<_>, TokenSetupError>>()?;
        let jwks = match &settings.jwks {
            Some(path) => Some((path.clone(), read(path)?)),
            None => None,
        };
        TokenVerifier::from_keys(&pems, jwks.as_ref(), settings)
    }

    /// A verifier of the PEM keys and JWKS document given as text (each with the name its
    /// errors use); `settings`' own file names are not read.
    pub fn from_keys(
        pems: &[(PathBuf, Vec<u8>)],
        jwks: Option<&(PathBuf, Vec<u8>)>,
        settings: &TokenSettings,
    ) -> Result<TokenVerifier, TokenSetupError> {
        let mut keys = Vec::new();
        for (path, pem) in pems {
            keys.push(pem_key(path, pem)?);
        }
        if let Some((path, text)) = jwks {
            keys.extend(jwks_keys(path, text)?);
        }
        if keys.is_empty() {
            return Err(TokenSetupError::NoKeys);
        }
        Ok(TokenVerifier {
            keys,
            settings: settings.clone(),
        })
    }

    /// Checks a token; returns who it names and when it expires (Unix seconds).
    pub fn verify(&self, token: &[u8]) -> Result<(Principal, u64), TokenError> {
        let token = std::str::from_utf8(token)
            .map_err(|_| TokenError::Malformed("not UTF-8".into()))?
            .trim();
        let header =
            jsonwebtoken::decode_header(token).map_err(|e| TokenError::Malformed(e.to_string()))?;
        let alg = header.alg;
        let candidates: Vec<&Key> = self
            .keys
            .iter()
            .filter(|k| k.algorithms.contains(&alg))
            .filter(|k| match (&k.kid, &header.kid) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            })
            .collect();
        if candidates.is_empty() {
            return Err(if [RSA, EC, ED].iter().any(|f| f.contains(&alg)) {
                TokenError::Signature
            } else {
                TokenError::Algorithm(alg)
            });
        }
        let mut validation = Validation::new(alg);
        validation.leeway = self.settings.leeway_secs;
        validation.validate_nbf = true;
        validation.set_required_spec_claims(&["exp"]);
        if self.settings.audiences.is_empty() {
            validation.validate_aud = false;
        } else {
            validation.set_audience(&self.settings.audiences);
        }
        if !self.settings.issuers.is_empty() {
            validation.set_issuer(&self.settings.issuers);
        }
        let mut last = TokenError::Signature;
        for key in candidates {
            match jsonwebtoken::decode::<Value>(token, &key.key, &validation) {
                Ok(data) => return self.principal(&data.claims),
                Err(e) => {
                    use jsonwebtoken::errors::ErrorKind as K;
                    last = match e.kind() {
                        K::InvalidSignature => TokenError::Signature,
                        K::ExpiredSignature => TokenError::Claims("expired".into()),
                        K::ImmatureSignature => TokenError::Claims("not valid yet".into()),
                        K::InvalidAudience => TokenError::Claims("audience not accepted".into()),
                        K::InvalidIssuer => TokenError::Claims("issuer not accepted".into()),
                        K::MissingRequiredClaim(c) => TokenError::Claims(format!("no '{c}' claim")),
                        _ => TokenError::Malformed(e.to_string()),
                    };
                    // Only a wrong signature can come out differently with another key.
                    if last != TokenError::Signature {
                        return Err(last);
                    }
                }
            }
        }
        Err(last)
    }

    /// The principal a verified token's claims name.
    fn principal(&self, claims: &Value) -> Result<(Principal, u64), TokenError> {
        let name_claim = self.settings.username_claim.as_deref().unwrap_or("sub");
        let username = claim(claims, name_claim)
            .and_then(claim_text)
            .filter(|n| !n.is_empty())
            .ok_or_else(|| TokenError::NoUsername(name_claim.to_owned()))?;
        let mut principal = Principal::user(username);
        let defaults: BTreeMap<String, String> = [
            ("namespace", "kubernetes.io.namespace"),
            ("serviceaccount", "kubernetes.io.serviceaccount.name"),
        ]
        .into_iter()
        .map(|(a, c)| (a.to_owned(), c.to_owned()))
        .collect();
        let mapping = match self.settings.attribute_claims.is_empty() {
            true => &defaults,
            false => &self.settings.attribute_claims,
        };
        for (attribute, path) in mapping {
            if let Some(text) = claim(claims, path).and_then(claim_text) {
                principal.set_attribute(attribute, &text);
            }
        }
        let exp = claims
            .get("exp")
            .and_then(Value::as_u64)
            .ok_or_else(|| TokenError::Claims("no 'exp' claim".into()))?;
        Ok((principal, exp))
    }
}

/// The token verifier in force, replaceable while the broker runs (new keys after a
/// rotation).
#[derive(Debug, Default)]
pub struct TokenStore(RwLock<Option<Arc<TokenVerifier>>>);

impl TokenStore {
    pub fn new(verifier: TokenVerifier) -> TokenStore {
        TokenStore(RwLock::new(Some(Arc::new(verifier))))
    }

    /// The verifier in force; `None` when tokens are not accepted.
    pub fn current(&self) -> Option<Arc<TokenVerifier>> {
        self.0.read().clone()
    }

    pub fn replace(&self, verifier: TokenVerifier) {
        *self.0.write() = Some(Arc::new(verifier));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{EncodingKey, Header};
    use serde_json::json;

    struct Issuer {
        encoding: EncodingKey,
        public_pem: String,
    }

    fn issuer() -> Issuer {
        let pair = rcgen::KeyPair::generate().expect("key");
        Issuer {
            encoding: EncodingKey::from_ec_pem(pair.serialize_pem().as_bytes()).expect("pem"),
            public_pem: pair.public_key_pem(),
        }
    }

    fn now() -> u64 {
        jsonwebtoken::get_current_timestamp()
    }

    fn sign(issuer: &Issuer, claims: &Value) -> String {
        jsonwebtoken::encode(&Header::new(Algorithm::ES256), claims, &issuer.encoding)
            .expect("sign")
    }

    fn verifier(dir: &Path, issuers: &[&Issuer], settings: TokenSettings) -> TokenVerifier {
        let mut settings = settings;
        for (i, issuer) in issuers.iter().enumerate() {
            let path = dir.join(format!("key{i}.pem"));
            std::fs::write(&path, &issuer.public_pem).expect("write");
            settings.keys.push(path);
        }
        TokenVerifier::load(&settings).expect("load")
    }

    fn k8s_claims(exp: u64) -> Value {
        json!({
            "iss": "https://kubernetes.default.svc",
            "aud": ["aio-internal"],
            "sub": "system:serviceaccount:factory:fan-controller",
            "exp": exp,
            "iat": now(),
            "kubernetes.io": {
                "namespace": "factory",
                "serviceaccount": { "name": "fan-controller", "uid": "1" }
            }
        })
    }

    /// A directory removed when the test ends.
    fn dir() -> tempfile::TempDir {
        tempfile::tempdir().expect("dir")
    }

    #[test]
    fn a_kubernetes_token_names_its_service_account() {
        let d = dir();
        let (a, b) = (issuer(), issuer());
        let v = verifier(
            d.path(),
            &[&a, &b],
            TokenSettings {
                issuers: vec!["https://kubernetes.default.svc".into()],
                audiences: vec!["aio-internal".into()],
                ..Default::default()
            },
        );
        let exp = now() + 600;
        // Signed by the second key: each key is tried.
        let token = sign(&b, &k8s_claims(exp));
        let (p, until) = v.verify(format!("{token}\n").as_bytes()).expect("valid");
        assert_eq!(
            p.username.as_deref(),
            Some("system:serviceaccount:factory:fan-controller")
        );
        assert_eq!(p.attribute("namespace"), Some("factory"));
        assert_eq!(p.attribute("serviceaccount"), Some("fan-controller"));
        assert_eq!(until, exp);
    }

    #[test]
    fn bad_tokens_are_refused_for_their_reason() {
        let d = dir();
        let (a, stranger) = (issuer(), issuer());
        let v = verifier(
            d.path(),
            &[&a],
            TokenSettings {
                audiences: vec!["aio-internal".into()],
                ..Default::default()
            },
        );
        let good = k8s_claims(now() + 600);
        assert_eq!(
            v.verify(sign(&stranger, &good).as_bytes()).map(|_| ()),
            Err(TokenError::Signature)
        );
        let expired = k8s_claims(now() - 600);
        assert_eq!(
            v.verify(sign(&a, &expired).as_bytes()).map(|_| ()),
            Err(TokenError::Claims("expired".into()))
        );
        let mut other_audience = good.clone();
        other_audience["aud"] = json!(["someone-else"]);
        assert_eq!(
            v.verify(sign(&a, &other_audience).as_bytes()).map(|_| ()),
            Err(TokenError::Claims("audience not accepted".into()))
        );
        let mut no_exp = good.clone();
        no_exp.as_object_mut().expect("object").remove("exp");
        assert!(v.verify(sign(&a, &no_exp).as_bytes()).is_err());
        let mut later = good.clone();
        later["nbf"] = json!(now() + 600);
        assert_eq!(
            v.verify(sign(&a, &later).as_bytes()).map(|_| ()),
            Err(TokenError::Claims("not valid yet".into()))
        );
        // A shared-secret token is never accepted.
        let hs = jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &good,
            &EncodingKey::from_secret(b"guess"),
        )
        .expect("sign");
        assert_eq!(
            v.verify(hs.as_bytes()).map(|_| ()),
            Err(TokenError::Algorithm(Algorithm::HS256))
        );
        for junk in [&b""[..], b"x.y.z", b"\xff\xfe", b"eyJhbGciOiJub25lIn0.e30."] {
            assert!(v.verify(junk).is_err(), "{junk:?}");
        }
    }

    #[test]
    fn a_jwks_file_and_claim_mapping() {
        let d = dir();
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).expect("key");
        let encoding = EncodingKey::from_ed_pem(pair.serialize_pem().as_bytes()).expect("pem");
        let raw = pair.public_key_raw();
        use base64::Engine;
        let x = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw);
        let jwks = json!({ "keys": [
            { "kty": "oct", "k": "c2VjcmV0" },
            { "kty": "OKP", "crv": "Ed25519", "x": x, "kid": "k1" }
        ]});
        let path = d.path().join("jwks.json");
        std::fs::write(&path, jwks.to_string()).expect("write");
        let mut attribute_claims = BTreeMap::new();
        attribute_claims.insert("site".to_string(), "ext.site".to_string());
        attribute_claims.insert("level".to_string(), "ext.level".to_string());
        let v = TokenVerifier::load(&TokenSettings {
            jwks: Some(path),
            username_claim: Some("name".into()),
            attribute_claims,
            ..Default::default()
        })
        .expect("load");
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some("k1".into());
        let claims =
            json!({ "name": "robot", "exp": now() + 60, "ext": { "site": "lyon", "level": 3 } });
        let token = jsonwebtoken::encode(&header, &claims, &encoding).expect("sign");
        let (p, _) = v.verify(token.as_bytes()).expect("valid");
        assert_eq!(p.username.as_deref(), Some("robot"));
        assert_eq!(p.attribute("site"), Some("lyon"));
        assert_eq!(p.attribute("level"), Some("3"));
        // A key id no key has.
        header.kid = Some("k2".into());
        let token = jsonwebtoken::encode(&header, &claims, &encoding).expect("sign");
        assert_eq!(
            v.verify(token.as_bytes()).map(|_| ()),
            Err(TokenError::Signature)
        );
    }

    #[test]
    fn settings_without_keys_are_refused() {
        assert!(matches!(
            TokenVerifier::load(&TokenSettings::default()),
            Err(TokenSetupError::NoKeys)
        ));
    }
}
