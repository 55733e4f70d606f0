//! The password file: one `user:hash` line per user, as `mosquitto_passwd` writes it.
//!
//! New hashes are Argon2id PHC strings (`$argon2id$v=19$...`). Lines written by
//! `mosquitto_passwd` are accepted as they are: `$7$ITERATIONS$SALT$HASH` (PBKDF2-HMAC-SHA512)
//! and `$6$SALT$HASH` (SHA-512 of the password and salt), salts and hashes in base64. Blank
//! lines and lines starting with `#` are ignored.

use std::collections::BTreeMap;
use std::path::Path;

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;
use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use sha2::{Digest, Sha512};

/// Why a password file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PasswordFileError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} line {line}: {reason}")]
    Line {
        path: String,
        line: usize,
        reason: String,
    },
}

/// A stored password hash.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Hash {
    /// An Argon2 (or other PHC) string.
    Phc(String),
    /// Mosquitto's `$7$`: PBKDF2-HMAC-SHA512.
    Pbkdf2 {
        iterations: u32,
        salt: Vec<u8>,
        hash: Vec<u8>,
    },
    /// Mosquitto's `$6$`: SHA-512 of the password followed by the salt.
    Sha512 { salt: Vec<u8>, hash: Vec<u8> },
}

impl Hash {
    fn parse(text: &str) -> Result<Hash, String> {
        let b64 = |s: &str| STANDARD.decode(s).map_err(|e| format!("bad base64: {e}"));
        if let Some(rest) = text.strip_prefix("$7$") {
            let mut parts = rest.split('$');
            let (Some(iterations), Some(salt), Some(hash), None) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                return Err("a $7$ hash is $7$ITERATIONS$SALT$HASH".into());
            };
            let iterations: u32 = iterations
                .parse()
                .map_err(|_| "the iteration count is not a number".to_owned())?;
            if iterations == 0 {
                return Err("the iteration count is 0".into());
            }
            return Ok(Hash::Pbkdf2 {
                iterations,
                salt: b64(salt)?,
                hash: b64(hash)?,
            });
        }
        if let Some(rest) = text.strip_prefix("$6$") {
            let mut parts = rest.split('$');
            let (Some(salt), Some(hash), None) = (parts.next(), parts.next(), parts.next()) else {
                return Err("a $6$ hash is $6$SALT$HASH".into());
            };
            return Ok(Hash::Sha512 {
                salt: b64(salt)?,
                hash: b64(hash)?,
            });
        }
        PasswordHash::new(text).map_err(|e| format!("not a password hash ({e})"))?;
        Ok(Hash::Phc(text.to_owned()))
    }

    fn verify(&self, password: &[u8]) -> bool {
        match self {
            Hash::Phc(text) => PasswordHash::new(text)
                .is_ok_and(|h| Argon2::default().verify_password(password, &h).is_ok()),
            Hash::Pbkdf2 {
                iterations,
                salt,
                hash,
            } => {
                let mut out = vec![0u8; hash.len()];
                pbkdf2::pbkdf2_hmac::<Sha512>(password, salt, *iterations, &mut out);
                constant_time_eq(&out, hash)
            }
            Hash::Sha512 { salt, hash } => {
                let mut d = Sha512::new();
                d.update(password);
                d.update(salt);
                constant_time_eq(&d.finalize(), hash)
            }
        }
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Users and their password hashes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Passwords {
    users: BTreeMap<String, Hash>,
}

impl Passwords {
    /// Parses the text of a password file; `path` names it in errors.
    pub fn parse(text: &str, path: &str) -> Result<Passwords, PasswordFileError> {
        let mut users = BTreeMap::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim_end_matches('\r');
            if line.trim().is_empty() || line.starts_with('#') {
                continue;
            }
            let err = |reason: String| PasswordFileError::Line {
                path: path.to_owned(),
                line: i + 1,
                reason,
            };
            let Some((user, hash)) = line.split_once(':') else {
                return Err(err("expected USER:HASH".into()));
            };
            if user.is_empty() {
                return Err(err("empty user name".into()));
            }
            let hash = Hash::parse(hash).map_err(err)?;
            if users.insert(user.to_owned(), hash).is_some() {
                return Err(err(format!("user {user} appears twice")));
            }
        }
        Ok(Passwords { users })
    }

    /// Reads a password file.
    pub fn load(path: &Path) -> Result<Passwords, PasswordFileError> {
        let text = std::fs::read_to_string(path).map_err(|source| PasswordFileError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Passwords::parse(&text, &path.display().to_string())
    }

    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }

    pub fn contains(&self, user: &str) -> bool {
        self.users.contains_key(user)
    }

    /// Whether `user` is in the file with `password`. Slow on purpose (Argon2id, PBKDF2).
    pub fn verify(&self, user: &str, password: &[u8]) -> bool {
        self.users.get(user).is_some_and(|h| h.verify(password))
    }

    /// Sets `user`'s password, hashed with Argon2id and a fresh salt.
    pub fn set(&mut self, user: &str, password: &[u8]) -> Result<(), String> {
        if user.is_empty() || user.contains(':') || user.contains('\n') {
            return Err("a user name is not empty and holds no ':' or line break".into());
        }
        let salt = SaltString::encode_b64(&rand::random::<[u8; 16]>())
            .map_err(|e| format!("salt: {e}"))?;
        let hash = Argon2::default()
            .hash_password(password, &salt)
            .map_err(|e| format!("hashing: {e}"))?
            .to_string();
        self.users.insert(user.to_owned(), Hash::Phc(hash));
        Ok(())
    }

    /// Removes `user`; whether it was there.
    pub fn remove(&mut self, user: &str) -> bool {
        self.users.remove(user).is_some()
    }

    /// The file's text.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        for (user, hash) in &self.users {
            let hash = match hash {
                Hash::Phc(s) => s.clone(),
                Hash::Pbkdf2 {
                    iterations,
                    salt,
                    hash,
                } => format!(
                    "$7${iterations}${}${}",
                    STANDARD.encode(salt),
                    STANDARD.encode(hash)
                ),
                Hash::Sha512 { salt, hash } => {
                    format!("$6${}${}", STANDARD.encode(salt), STANDARD.encode(hash))
                }
            };
            out.push_str(&format!("{user}:{hash}\n"));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A line as `mosquitto_passwd` 2.0 writes it for user `alice`, password `secret`.
    fn mosquitto_line(password: &[u8]) -> String {
        let salt = b"0123456789ab";
        let mut out = [0u8; 64];
        pbkdf2::pbkdf2_hmac::<Sha512>(password, salt, 101, &mut out);
        format!(
            "alice:$7$101${}${}",
            STANDARD.encode(salt),
            STANDARD.encode(out)
        )
    }

    #[test]
    fn argon2id_hashes_are_made_and_checked() {
        let mut p = Passwords::default();
        p.set("bob", b"hunter2").expect("set");
        let text = p.to_text();
        assert!(text.starts_with("bob:$argon2id$"), "{text}");
        let back = Passwords::parse(&text, "f").expect("parses");
        assert!(back.verify("bob", b"hunter2"));
        assert!(!back.verify("bob", b"hunter3"));
        assert!(!back.verify("nobody", b"hunter2"));
        assert!(p.remove("bob") && !p.remove("bob"));
    }

    #[test]
    fn mosquitto_passwd_lines_are_accepted_as_they_are() {
        let p = Passwords::parse(&mosquitto_line(b"secret"), "f").expect("parses");
        assert!(p.verify("alice", b"secret"));
        assert!(!p.verify("alice", b"Secret"));
        // Written back unchanged.
        assert_eq!(p.to_text(), format!("{}\n", mosquitto_line(b"secret")));
        let salt = b"salt";
        let mut d = Sha512::new();
        d.update(b"old");
        d.update(salt);
        let line = format!(
            "carol:$6${}${}",
            STANDARD.encode(salt),
            STANDARD.encode(d.finalize())
        );
        let p = Passwords::parse(&line, "f").expect("parses");
        assert!(p.verify("carol", b"old") && !p.verify("carol", b"new"));
    }

    #[test]
    fn bad_lines_are_named_with_their_number() {
        for (text, want) in [
            ("# comment\n\nnocolon\n", "line 3: expected USER:HASH"),
            (":$6$YQ==$YQ==\n", "line 1: empty user name"),
            ("a:plaintext\n", "line 1: not a password hash"),
            (
                "a:$7$x$YQ==$YQ==\n",
                "line 1: the iteration count is not a number",
            ),
            ("a:$7$0$YQ==$YQ==\n", "line 1: the iteration count is 0"),
            ("a:$6$!!$YQ==\n", "line 1: bad base64"),
            (
                "a:$6$YQ==$YQ==\na:$6$YQ==$YQ==\n",
                "line 2: user a appears twice",
            ),
        ] {
            let err = Passwords::parse(text, "pw").expect_err(text).to_string();
            assert!(err.contains(want), "{text:?}: {err}");
            assert!(err.starts_with("pw "), "{err}");
        }
    }

    #[test]
    fn user_names_that_would_break_the_file_are_refused() {
        let mut p = Passwords::default();
        assert!(p.set("a:b", b"x").is_err());
        assert!(p.set("", b"x").is_err());
        assert!(p.set("a\nb", b"x").is_err());
    }
}
