"""Test certificates, made fresh for each test session: certificate authorities, server and
client certificates (good, from another CA, expired), written as PEM files. No private key is
ever committed."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass
class Issued:
    key: object
    cert: x509.Certificate
    cert_path: Path
    key_path: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write(directory: Path, stem: str, key, cert: x509.Certificate, key_format) -> Issued:
    cert_path = directory / f"{stem}.pem"
    key_path = directory / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, key_format, serialization.NoEncryption()
        )
    )
    return Issued(key, cert, cert_path, key_path)


def make_ca(directory: Path, stem: str, cn: str) -> Issued:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return _write(directory, stem, key, cert, serialization.PrivateFormat.PKCS8)


def issue(
    directory: Path,
    stem: str,
    ca: Issued,
    cn: str,
    *,
    server: bool,
    sans: tuple[str, ...] = (),
    expired: bool = False,
    rsa_key: bool = False,
    valid_days: int = 30,
) -> Issued:
    """A certificate for `cn` signed by `ca`: a server certificate (with `sans`: DNS names or
    IP addresses) or a client one. RSA keys are written as PKCS#1, EC keys as SEC1, so both
    key formats besides PKCS#8 are exercised."""
    if rsa_key:
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        key_format = serialization.PrivateFormat.TraditionalOpenSSL
    else:
        key = ec.generate_private_key(ec.SECP256R1())
        key_format = serialization.PrivateFormat.TraditionalOpenSSL
    now = datetime.datetime.now(datetime.timezone.utc)
    if expired:
        not_before, not_after = now - datetime.timedelta(days=10), now - datetime.timedelta(days=1)
    else:
        not_before = now - datetime.timedelta(days=1)
        not_after = now + datetime.timedelta(days=valid_days)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
    )
    names = []
    for san in sans:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(san)))
        except ValueError:
            names.append(x509.DNSName(san))
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    cert = builder.sign(ca.key, hashes.SHA256())
    return _write(directory, stem, key, cert, key_format)


@dataclass
class Pki:
    """Everything the transport tests use."""

    directory: Path
    ca: Issued
    server: Issued
    client: Issued
    other_ca: Issued
    other_server: Issued
    stranger: Issued
    expired: Issued


def make_pki(directory: Path) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca = make_ca(directory, "ca", "mqkv test CA")
    other_ca = make_ca(directory, "other-ca", "another CA")
    sans = ("localhost", "127.0.0.1")
    return Pki(
        directory=directory,
        ca=ca,
        server=issue(directory, "server", ca, "localhost", server=True, sans=sans, rsa_key=True),
        client=issue(directory, "client", ca, "device-1", server=False),
        other_ca=other_ca,
        other_server=issue(directory, "other-server", other_ca, "localhost", server=True, sans=sans),
        stranger=issue(directory, "stranger", other_ca, "device-1", server=False),
        expired=issue(directory, "expired", ca, "device-1", server=False, expired=True),
    )


def write_crl(path: Path, ca: Issued, revoked: list[Issued]) -> Path:
    """A certificate revocation list from `ca` that lists `revoked`, as PEM."""
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(ca.cert.subject)
        .last_update(now - datetime.timedelta(days=1))
        .next_update(now + datetime.timedelta(days=7))
        .add_extension(x509.CRLNumber(int(now.timestamp())), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
            critical=False,
        )
    )
    for r in revoked:
        builder = builder.add_revoked_certificate(
            x509.RevokedCertificateBuilder()
            .serial_number(r.cert.serial_number)
            .revocation_date(now - datetime.timedelta(hours=1))
            .build()
        )
    path.write_bytes(builder.sign(ca.key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM))
    return path
