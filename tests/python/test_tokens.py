"""Token authentication (MQTT 5 enhanced authentication with the method `K8S-SAT`, as the AIO
SDKs send it): tokens checked against the configured keys, issuer and audience; attributes
from claims in the policy; re-authentication with AUTH 0x19; a token that expires without one
ends the connection with 0xA0."""

from __future__ import annotations

import json
import time

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

import mqttraw
from helpers import raw, wait_for

NOT_AUTHORIZED = 0x87
BAD_METHOD = 0x8C
MAXIMUM_CONNECT_TIME = 0xA0
METHOD = "K8S-SAT"


class Signer:
    def __init__(self):
        self.key = ec.generate_private_key(ec.SECP256R1())

    def public_pem(self) -> bytes:
        return self.key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)

    def token(self, sub="system:serviceaccount:factory:fan", *, lifetime=600, aud="aio-internal",
              iss="https://kubernetes.default.svc", namespace="factory") -> bytes:
        now = int(time.time())
        claims = {"iss": iss, "aud": [aud], "sub": sub, "iat": now, "exp": now + lifetime,
                  "kubernetes.io": {"namespace": namespace,
                                    "serviceaccount": {"name": sub.rsplit(":", 1)[-1]}}}
        return jwt.encode(claims, self.key, algorithm="ES256").encode()


@pytest.fixture
def signer():
    return Signer()


@pytest.fixture
def token_server(mqkv, tmp_path, signer):
    (tmp_path / "signer.pub").write_bytes(signer.public_pem())
    policy = tmp_path / "policy.yaml"
    policy.write_text("""
- principals:
    attributes: [{ namespace: factory }]
  brokerResources:
    - method: Connect
    - method: Publish
      topics: ["factory/{principal.attributes.serviceaccount}/#"]
""")
    return mqkv("--allow-anonymous", "false", "--policy", policy, config=f"""
[tokens]
keys = ["{tmp_path / 'signer.pub'}"]
issuers = ["https://kubernetes.default.svc"]
audiences = ["aio-internal"]
""")


def connect_with(server, token: bytes, method=METHOD, client_id="sat-client", keep_alive=60):
    c = raw(server)
    ack = c.connect(client_id, keep_alive=keep_alive, props=[
        (mqttraw.AUTHENTICATION_METHOD, method), (mqttraw.AUTHENTICATION_DATA, token)])
    return c, ack


def test_a_valid_token_connects_and_its_claims_are_attributes(token_server, signer):
    c, ack = connect_with(token_server, signer.token())
    assert ack.reason == 0
    assert ack.prop(mqttraw.AUTHENTICATION_METHOD) == METHOD
    # The policy allows the service account's own subtree, named by a claim.
    c.publish("factory/fan/temp", b"1", qos=1, packet_id=1)
    assert c.expect(mqttraw.PUBACK).reason in (0, 0x10)
    c.publish("factory/pump/temp", b"1", qos=1, packet_id=2)
    assert c.expect(mqttraw.PUBACK).reason == NOT_AUTHORIZED


@pytest.mark.parametrize("why", ["wrong key", "expired", "audience", "issuer", "garbage",
                                 "other namespace"])
def test_bad_tokens_are_refused(token_server, signer, why):
    if why == "wrong key":
        token = Signer().token()
    elif why == "expired":
        token = signer.token(lifetime=-120)
    elif why == "audience":
        token = signer.token(aud="someone-else")
    elif why == "issuer":
        token = signer.token(iss="https://evil.example")
    elif why == "garbage":
        token = b"\xff" * 300
    else:
        # Valid, but the policy lets no one from that namespace connect.
        token = signer.token(namespace="elsewhere")
    c, ack = connect_with(token_server, token)
    assert ack.reason == NOT_AUTHORIZED, why
    c.wait_closed()
    # The server carries on.
    good, ack = connect_with(token_server, signer.token(), client_id="after")
    assert ack.reason == 0


def test_an_unknown_method_is_refused(token_server, signer):
    c, ack = connect_with(token_server, signer.token(), method="SCRAM-SHA-256")
    assert ack.reason == BAD_METHOD


def test_without_token_settings_tokens_are_refused(mqkv, signer):
    server = mqkv()
    c, ack = connect_with(server, signer.token())
    assert ack.reason == BAD_METHOD


def test_an_expiring_token_ends_the_connection_unless_renewed(token_server, signer):
    # Renewed before it expires: the connection outlives the first token.
    renewed, ack = connect_with(token_server, signer.token(lifetime=3), client_id="renewed")
    assert ack.reason == 0
    # Not renewed: ended with 0xA0 once it expires.
    lapsed, ack = connect_with(token_server, signer.token(lifetime=3), client_id="lapsed")
    assert ack.reason == 0
    renewed.send(mqttraw.auth(0x19, [(mqttraw.AUTHENTICATION_METHOD, METHOD),
                                     (mqttraw.AUTHENTICATION_DATA, signer.token(lifetime=600))]))
    answer = renewed.expect(mqttraw.AUTH)
    assert answer.reason == 0
    assert answer.prop(mqttraw.AUTHENTICATION_METHOD) == METHOD
    d = lapsed.expect_disconnect_and_close(timeout=10)
    assert d.reason == MAXIMUM_CONNECT_TIME
    # By now the renewed connection's first token has expired too.
    time.sleep(0.5)
    renewed.send(mqttraw.pingreq())
    renewed.expect(mqttraw.PINGRESP)
    renewed.publish("factory/fan/x", b"still here", qos=1, packet_id=5)
    assert renewed.expect(mqttraw.PUBACK).reason in (0, 0x10)


@pytest.mark.parametrize("case", ["bad token", "someone else", "other method", "no method"])
def test_failed_re_authentication_ends_the_connection(token_server, signer, case):
    c, ack = connect_with(token_server, signer.token())
    assert ack.reason == 0
    if case == "bad token":
        props, code = [(mqttraw.AUTHENTICATION_METHOD, METHOD),
                       (mqttraw.AUTHENTICATION_DATA, Signer().token())], NOT_AUTHORIZED
    elif case == "someone else":
        other = signer.token(sub="system:serviceaccount:factory:pump")
        props, code = [(mqttraw.AUTHENTICATION_METHOD, METHOD),
                       (mqttraw.AUTHENTICATION_DATA, other)], NOT_AUTHORIZED
    elif case == "other method":
        props, code = [(mqttraw.AUTHENTICATION_METHOD, "OTHER"),
                       (mqttraw.AUTHENTICATION_DATA, signer.token())], 0x82
    else:
        props, code = [], 0x82
    c.send(mqttraw.auth(0x19, props))
    assert c.expect_disconnect_and_close().reason == code


def test_auth_without_a_method_at_connect_is_a_protocol_error(mqkv):
    server = mqkv()
    c = raw(server)
    assert c.connect("plain").reason == 0
    c.send(mqttraw.auth(0x19, [(mqttraw.AUTHENTICATION_METHOD, METHOD)]))
    assert c.expect_disconnect_and_close().reason == 0x82


def jwks(*signers: Signer) -> str:
    """A JWKS document of the signers' public keys, as a Kubernetes API server serves it."""
    keys = []
    for i, s in enumerate(signers):
        jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(s.key.public_key()))
        keys.append({**jwk, "use": "sig", "alg": "ES256", "kid": f"key-{i}"})
    return json.dumps({"keys": keys})


def test_a_rotated_key_set_is_read_again_without_a_signal(mqkv, tmp_path, signer):
    """The API server's signing key rotates: the new key set is written over the old file, and
    tokens signed with the new key connect once the server has read it, while the old key
    stops working."""
    new = Signer()
    keyset = tmp_path / "jwks.json"
    keyset.write_text(jwks(signer))
    server = mqkv("--watch-interval-ms", "200", config=f"""
[tokens]
jwks = "{keyset}"
""")
    _, ack = connect_with(server, signer.token(), client_id="old-key")
    assert ack.reason == 0
    _, ack = connect_with(server, new.token(), client_id="new-key-early")
    assert ack.reason == NOT_AUTHORIZED
    keyset.write_text(jwks(new))
    wait_for(lambda: "token keys reloaded" in server.stderr_text(), what="the reload")
    _, ack = connect_with(server, new.token(), client_id="new-key")
    assert ack.reason == 0
    _, ack = connect_with(server, signer.token(), client_id="old-key-late")
    assert ack.reason == NOT_AUTHORIZED
