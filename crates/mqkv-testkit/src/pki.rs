//! A test certificate authority: certificates for 127.0.0.1 made at run time, written as PEM
//! files, so that no private key is ever committed.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

/// A CA whose certificate is a PEM file in a test's directory.
pub struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    /// The CA's certificate (PEM).
    pub cert: PathBuf,
}

impl TestCa {
    /// A new CA named `name`, its certificate written to `dir/<name>.pem`.
    pub fn new(dir: &Path, name: &str) -> TestCa {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().expect("CA key");
        let cert = params.self_signed(&key).expect("CA certificate");
        let path = dir.join(format!("{name}.pem"));
        std::fs::write(&path, cert.pem()).expect("write the CA certificate");
        TestCa {
            issuer: Issuer::new(params, key),
            cert: path,
        }
    }

    /// A certificate for 127.0.0.1, without extended key usage (so it serves a server and a
    /// client alike), written with its key to `dir/<name>.pem` and `dir/<name>.key`; returns
    /// their paths.
    pub fn issue(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let mut params = CertificateParams::new(vec!["127.0.0.1".to_owned()]).expect("parameters");
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.issuer).expect("certificate");
        let paths = (
            dir.join(format!("{name}.pem")),
            dir.join(format!("{name}.key")),
        );
        std::fs::write(&paths.0, cert.pem()).expect("write the certificate");
        std::fs::write(&paths.1, key.serialize_pem()).expect("write the key");
        paths
    }
}
