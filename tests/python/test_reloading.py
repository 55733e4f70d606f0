"""Files read again without a signal: a certificate renewed the way Kubernetes updates a
mounted secret (a symbolic link swapped), an edited policy and password file, a broken file
that keeps what is in force, the state of each part in /metrics, and warnings of server
certificates about to expire."""

from __future__ import annotations

import os
import re
import signal
import socket
import ssl
import time

import pytest
from cryptography.hazmat.primitives.serialization import Encoding

from certs import issue, make_pki
from helpers import HOST, Paho, wait_for
from test_metrics import scrape, value
from test_security import NOT_AUTHORIZED, POLICY, login, users  # noqa: F401 (fixture)

WATCH = ("--watch-interval-ms", "200")
# A rule that lets carol connect, and one that is not valid.
CAROL = "      - principals:\n          usernames: [carol]\n        brokerResources:\n" \
        "          - method: Connect\n"
BROKEN = "      - principals:\n          usernames: [carol]\n        brokerResources: [{}]\n"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"))


def presented(server) -> bytes:
    """The DER of the certificate the TLS listener presents to a new client."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with socket.create_connection((HOST, server.endpoints["tls"]), timeout=5) as raw:
        with ctx.wrap_socket(raw) as tls:
            return tls.getpeercert(binary_form=True)


def der(issued) -> bytes:
    return issued.cert.public_bytes(Encoding.DER)


class MountedSecret:
    """A directory laid out as the kubelet lays out a mounted secret: the files are links
    through `..data` to a timestamped directory, and an update writes a new directory and
    swaps `..data` to it in one rename."""

    def __init__(self, directory):
        self.dir = directory
        self.dir.mkdir()
        self.version = 0

    def write(self, files: dict[str, bytes]):
        self.version += 1
        target = self.dir / f"..2026_11_30_{self.version:02d}"
        target.mkdir()
        for name, content in files.items():
            (target / name).write_bytes(content)
        tmp = self.dir / "..data_tmp"
        os.symlink(target.name, tmp)
        os.replace(tmp, self.dir / "..data")
        for name in files:
            link = self.dir / name
            if not link.is_symlink():
                os.symlink(f"..data/{name}", link)

    def path(self, name):
        return self.dir / name


def secret_files(issued) -> dict[str, bytes]:
    return {"tls.crt": issued.cert_path.read_bytes(), "tls.key": issued.key_path.read_bytes()}


def test_a_renewed_certificate_is_served_without_a_signal(mqkv, pki, tmp_path):
    secret = MountedSecret(tmp_path / "secret")
    secret.write(secret_files(pki.server))
    server = mqkv("--listen-tls", f"{HOST}:0", "--tls-cert", secret.path("tls.crt"),
                  "--tls-key", secret.path("tls.key"), *WATCH)
    assert presented(server) == der(pki.server)
    before = Paho(server, "before", listener="tls", tls={"ca_certs": str(pki.ca.cert_path)})
    before.subscribe("renewed/t", 1)

    secret.write(secret_files(pki.other_server))
    wait_for(lambda: "TLS certificate and key reloaded" in server.stderr_text(),
             what="the reload")
    assert "files changed: reading them again" in server.stderr_text()
    assert presented(server) == der(pki.other_server)
    after = Paho(server, "after", listener="tls", tls={"ca_certs": str(pki.other_ca.cert_path)})
    # The client connected before the renewal is still there.
    after.publish("renewed/t", b"still here", qos=1)
    assert before.get(5).payload == b"still here"
    # Read once: nothing more changed, so nothing more is read.
    time.sleep(1)
    assert server.stderr_text().count("TLS certificate and key reloaded") == 1


def test_a_broken_file_keeps_the_certificate_in_use_and_shows_in_metrics(mqkv, pki, tmp_path):
    cert, key = tmp_path / "live.pem", tmp_path / "live.key"
    cert.write_bytes(pki.server.cert_path.read_bytes())
    key.write_bytes(pki.server.key_path.read_bytes())
    server = mqkv("--listen-tls", f"{HOST}:0", "--tls-cert", cert, "--tls-key", key,
                  "--http", f"{HOST}:0", *WATCH)
    m = scrape(server)
    labels = {"part": "tls", "file": str(cert)}
    assert value(m, "mqkv_reload_successful", **labels) == 1
    assert value(m, "mqkv_reload_failures", **labels) == 0
    not_after = pki.server.cert.not_valid_after_utc.timestamp()
    assert value(m, "mqkv_tls_certificate_not_after_seconds", file=str(cert)) == not_after

    # A certificate that does not fit the key: refused, and the one in use stays.
    cert.write_bytes(pki.other_server.cert_path.read_bytes())
    wait_for(lambda: "TLS reload failed" in server.stderr_text(), what="the failed reload")
    assert "do not fit" in server.stderr_text()
    assert presented(server) == der(pki.server)
    m = scrape(server)
    assert value(m, "mqkv_reload_successful", **labels) == 0
    assert value(m, "mqkv_reload_failures", **labels) == 1
    assert value(m, "mqkv_tls_certificate_not_after_seconds", file=str(cert)) == not_after
    # Not tried again until the files change again.
    time.sleep(1)
    assert server.stderr_text().count("TLS reload failed") == 1

    # The matching key arrives: the new pair is served.
    key.write_bytes(pki.other_server.key_path.read_bytes())
    wait_for(lambda: "TLS certificate and key reloaded" in server.stderr_text(),
             what="the reload")
    assert presented(server) == der(pki.other_server)
    m = scrape(server)
    assert value(m, "mqkv_reload_successful", **labels) == 1
    assert value(m, "mqkv_reload_failures", **labels) == 1
    assert value(m, "mqkv_tls_certificate_not_after_seconds", file=str(cert)) == \
        pki.other_server.cert.not_valid_after_utc.timestamp()


def test_an_edited_policy_and_password_file_apply_without_a_signal(mqkv, tmp_path, users):
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    server = mqkv("--password-file", users, "--policy", policy, "--http", f"{HOST}:0", *WATCH)
    login(server, "carol", expect_rc=NOT_AUTHORIZED)
    policy.write_text(POLICY + CAROL)
    wait_for(lambda: "policy reloaded" in server.stderr_text(), what="the policy reload")
    login(server, "carol")

    # A broken policy: the one in force stays, and /metrics says the part failed.
    policy.write_text(POLICY + BROKEN)
    wait_for(lambda: "policy reload failed" in server.stderr_text(), what="the failed reload")
    login(server, "carol", "carol-2")
    m = scrape(server)
    assert value(m, "mqkv_reload_successful", part="policy", file=str(policy)) == 0
    assert value(m, "mqkv_reload_successful", part="passwords", file=str(users)) == 1

    # A password file replaced by another one.
    replacement = tmp_path / "replacement"
    replacement.write_bytes(users.read_bytes().replace(b"carol:", b"carl:"))
    os.replace(replacement, users)
    wait_for(lambda: "password file reloaded" in server.stderr_text(), what="the reload")
    gone = Paho(server, "carol-3", username="carol", password="carol-pw", expect_rc=None)
    assert gone.connack is not None and gone.connack[0] == 0x86
    renamed = Paho(server, "carl-1", username="carl", password="carol-pw", expect_rc=None)
    assert renamed.connack is not None and renamed.connack[0] == NOT_AUTHORIZED
    assert "reading them again" in server.stderr_text()


def test_with_watching_off_only_a_signal_reads_files(mqkv, tmp_path, users):
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    server = mqkv("--password-file", users, "--policy", policy, "--watch-interval-ms", "0")
    # A server that watches the same file, to show the change is one a watcher reads.
    watching = mqkv("--password-file", users, "--policy", policy, *WATCH)
    policy.write_text(POLICY + CAROL)
    wait_for(lambda: "policy reloaded" in watching.stderr_text(), what="the watcher's reload")
    time.sleep(1)
    assert "policy reloaded" not in server.stderr_text()
    login(server, "carol", expect_rc=NOT_AUTHORIZED)
    server.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "policy reloaded" in server.stderr_text(), what="the reload")
    login(server, "carol")


def test_server_certificates_about_to_expire_are_warned_of(mqkv, pki, tmp_path):
    sans = ("localhost", "127.0.0.1")
    soon = issue(tmp_path, "soon", pki.ca, "localhost", server=True, sans=sans, valid_days=5)
    server = mqkv("--listen-tls", f"{HOST}:0", "--tls-cert", soon.cert_path,
                  "--tls-key", soon.key_path)
    wait_for(lambda: "the server certificate expires soon" in server.stderr_text(),
             what="the warning")
    line = next(line for line in server.stderr_text().splitlines() if "expires soon" in line)
    # Five days less the moments since it was issued.
    assert "WARN" in line and re.search(r"days=[45]\b", line), line
    assert str(soon.cert_path) in line
    # A certificate valid for longer is not warned of.
    fine = mqkv("--listen-tls", f"{HOST}:0", *("--tls-cert", pki.server.cert_path),
                "--tls-key", pki.server.key_path)
    Paho(fine, "c", listener="tls", tls={"ca_certs": str(pki.ca.cert_path)}).disconnect()
    assert "expires soon" not in fine.stderr_text()
    assert "has expired" not in fine.stderr_text()
    # An expired one still starts (clients decide), with an error in the log.
    gone = issue(tmp_path, "gone", pki.ca, "localhost", server=True, sans=sans, expired=True)
    late = mqkv("--listen-tls", f"{HOST}:0", "--tls-cert", gone.cert_path,
                "--tls-key", gone.key_path)
    wait_for(lambda: "has expired" in late.stderr_text(), what="the error")
    line = next(line for line in late.stderr_text().splitlines() if "has expired" in line)
    assert "ERROR" in line and "days_ago=1" in line, line
    with pytest.raises((ssl.SSLError, OSError)):
        Paho(late, "c", listener="tls", tls={"ca_certs": str(pki.ca.cert_path)}, timeout=3)


def test_a_certificate_file_replaced_by_a_directory_is_a_failed_load(mqkv, pki, tmp_path):
    """A path that stops being a readable file fails to load, and the watching goes on."""
    cert, key = tmp_path / "live.pem", tmp_path / "live.key"
    cert.write_bytes(pki.server.cert_path.read_bytes())
    key.write_bytes(pki.server.key_path.read_bytes())
    server = mqkv("--listen-tls", f"{HOST}:0", "--tls-cert", cert, "--tls-key", key, *WATCH)
    cert.unlink()
    cert.mkdir()
    wait_for(lambda: "TLS reload failed" in server.stderr_text(), what="the failed reload")
    assert presented(server) == der(pki.server)
    # A new pair where the directory was: served once both files are in place.
    key.write_bytes(pki.other_server.key_path.read_bytes())
    cert.rmdir()
    cert.write_bytes(pki.other_server.cert_path.read_bytes())
    wait_for(lambda: "TLS certificate and key reloaded" in server.stderr_text(),
             what="the reload")
    assert presented(server) == der(pki.other_server)
