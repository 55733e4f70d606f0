"""Authorization with a policy file: every path (CONNECT, PUBLISH at each QoS, SUBSCRIBE,
retained messages, wills, shared subscriptions, the state store), the server's own
notification namespace, certificate attributes, and reloading the policy while clients stay
connected. Real clients: paho-mqtt, mosquitto_pub/mosquitto_sub."""

from __future__ import annotations

import shutil
import signal
import subprocess

import pytest

from certs import issue, make_pki
import mqttraw
from helpers import HOST, MQKV_BIN, Paho, raw_connected, run, wait_for
from statestore import REQUEST_TOPIC, StoreClient, notify_filter, notify_topic

NOT_AUTHORIZED = 0x87
NOTIFY_NAMESPACE = "clients/statestore/v1/FA9AE35F-2F64-47CD-9BFF-08E2B32A0FE8/#"

POLICY = f"""
apiVersion: mqttbroker.iotoperations.azure.com/v1
kind: BrokerAuthorization
metadata:
  name: test-policy
spec:
  authorizationPolicies:
    cache: Enabled
    rules:
      # Every known user: connect, its own telemetry, the state store, its own keys.
      - principals:
          usernames: [alice, bob]
        brokerResources:
          - method: Connect
          - method: Publish
            topics:
              - "telemetry/{{principal.username}}/#"
              - "{REQUEST_TOPIC}"
          - method: Subscribe
            topics:
              - "telemetry/#"
              - "clients/{{principal.clientId}}/#"
              - "{NOTIFY_NAMESPACE}"
        stateStoreResources:
          - method: ReadWrite
            keyType: Pattern
            keys: ["users:{{principal.username}}:*"]
          - method: Read
            keyType: String
            keys: ["shared-config"]
      # alice alone may write the shared configuration, and publish alerts with a will.
      - principals:
          usernames: [alice]
        brokerResources:
          - method: Publish
            topics: ["alerts/+"]
          - method: Subscribe
            topics: ["$share/workers/jobs/#"]
        stateStoreResources:
          - method: Write
            keyType: String
            keys: ["shared-config"]
"""


@pytest.fixture
def users(tmp_path):
    path = tmp_path / "passwords"
    for user in ("alice", "bob", "carol"):
        res = subprocess.run([MQKV_BIN, "passwd", str(path), user, "--password-stdin"],
                             input=f"{user}-pw\n".encode(), capture_output=True, timeout=30)
        assert res.returncode == 0, res.stderr
    return path


@pytest.fixture
def secured(mqkv, tmp_path, users):
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    # Only SIGHUP and `mqkv reload` read the policy again.
    server = mqkv("--password-file", users, "--policy", policy, "--watch-interval-ms", "0",
                  config="[state_store]\nscan_page_size = 3\n")
    server.policy_path = policy
    return server


def login(server, user, client_id=None, **kw):
    return Paho(server, client_id or f"{user}-1", username=user, password=f"{user}-pw", **kw)


def test_connect_needs_a_rule(secured):
    # carol has a password but no rule lets her connect; anonymous clients neither.
    login(secured, "carol", expect_rc=NOT_AUTHORIZED)
    Paho(secured, "anon", expect_rc=NOT_AUTHORIZED)
    login(secured, "alice")


def test_publish_denied_at_every_qos_and_nothing_delivered(secured):
    watcher = login(secured, "bob", "watcher")
    assert watcher.subscribe("telemetry/#", 2) == [2]
    # A raw client, to see each acknowledgement as it is sent.
    alice = raw_connected(secured, "alice-1", username="alice", password="alice-pw")
    for qos in (0, 1, 2):
        # Her own subtree: delivered; bob's: refused (QoS 0 silently dropped).
        for owner, packet_id in (("alice", 10 + qos), ("bob", 20 + qos)):
            alice.publish(f"telemetry/{owner}/q{qos}", b"x", qos=qos, packet_id=packet_id)
            if qos == 0:
                continue
            ack = alice.expect(mqttraw.PUBACK if qos == 1 else mqttraw.PUBREC)
            assert ack.packet_id == packet_id
            assert ack.reason == (NOT_AUTHORIZED if owner == "bob" else 0), ack
            if qos == 2 and owner == "alice":
                alice.send(mqttraw.ack(mqttraw.PUBREL, packet_id))
                assert alice.expect(mqttraw.PUBCOMP).reason == 0
    got = sorted(m.topic for m in watcher.collect(3))
    assert got == [f"telemetry/alice/q{q}" for q in (0, 1, 2)]
    watcher.expect_nothing(0.5)
    # The connection carries on.
    alice.publish("telemetry/alice/after", b"x", qos=1, packet_id=30)
    assert alice.expect(mqttraw.PUBACK).reason == 0
    assert watcher.get().topic == "telemetry/alice/after"


def test_subscribe_per_filter_and_wildcards_that_reach_too_far(secured):
    bob = login(secured, "bob")
    codes = bob.subscribe([
        ("telemetry/+/temp", 1),       # inside telemetry/#
        ("jobs/#", 1),                 # alice only
        ("clients/bob-1/inbox", 1),    # his own client id
        ("clients/alice-1/inbox", 1),  # someone else's
        ("$share/workers/jobs/#", 1),  # shared: alice only
        ("#", 1),                      # wider than allowed: made, and filtered
    ])
    assert codes == [1, NOT_AUTHORIZED, 1, NOT_AUTHORIZED, NOT_AUTHORIZED, 1]
    alice = login(secured, "alice")
    assert alice.subscribe("$share/workers/jobs/#", 1) == [1]
    assert alice.subscribe("$share/other/jobs/#", 1) == [NOT_AUTHORIZED]
    assert alice.subscribe("jobs/#", 1) == [NOT_AUTHORIZED]


def test_retained_messages_follow_the_policy(secured):
    alice = login(secured, "alice")
    # Accepted (0x10: nobody subscribes yet).
    assert alice.publish("telemetry/alice/state", b"kept", qos=1, retain=True) == 0x10
    # A denied publish is not retained either.
    assert alice.publish("telemetry/bob/state", b"forged", qos=1, retain=True) == NOT_AUTHORIZED
    bob = login(secured, "bob")
    assert bob.subscribe("telemetry/#", 1) == [1]
    m = bob.get()
    assert (m.topic, m.payload, m.retain) == ("telemetry/alice/state", b"kept", True)
    bob.expect_nothing(0.5)
    # A denied subscription gets no retained message; one wider than allowed gets only the
    # allowed ones.
    assert bob.subscribe("jobs/#", 1) == [NOT_AUTHORIZED]
    bob.expect_nothing(0.5)
    assert alice.publish("alerts/kept", b"not for bob", qos=1, retain=True) == 0x10
    assert bob.subscribe("#", 1) == [1]
    m = bob.get()
    assert (m.topic, m.retain) == ("telemetry/alice/state", True)
    bob.expect_nothing(0.5)


def test_a_wildcard_wider_than_the_grants_receives_only_what_is_allowed(secured):
    bob = login(secured, "bob")
    assert bob.subscribe("#", 1) == [1]
    alice = login(secured, "alice")
    # alice may publish these; bob may receive only the first.
    assert alice.publish("telemetry/alice/t", b"for bob", qos=1) == 0
    assert alice.publish("alerts/fire", b"not for bob", qos=1) == 0x10
    m = bob.get()
    assert (m.topic, m.payload) == ("telemetry/alice/t", b"for bob")
    bob.expect_nothing(0.5)


def test_a_will_to_a_denied_topic_is_refused_at_connect(secured):
    login(secured, "bob", will={"topic": "alerts/bob", "payload": b"gone", "qos": 1},
          expect_rc=NOT_AUTHORIZED)
    watcher = login(secured, "bob", "watcher")
    watcher.subscribe("telemetry/#", 1)
    alice = login(secured, "alice", will={"topic": "telemetry/alice/gone", "payload": b"bye",
                                          "qos": 1})
    alice.client.socket().close()
    m = watcher.get(10)
    assert (m.topic, m.payload) == ("telemetry/alice/gone", b"bye")


def test_state_store_keys_need_grants(secured):
    alice_mqtt = login(secured, "alice")
    alice = StoreClient(alice_mqtt, "alice-1")
    assert alice.suback == [1]
    bob = StoreClient(login(secured, "bob"), "bob-1")
    denied = b"-ERR not authorized\r\n"
    assert alice.set("users:alice:name", "Alice") == b"+OK\r\n"
    assert alice.set("shared-config", "v1") == b"+OK\r\n"
    assert bob.get("shared-config") == b"$2\r\nv1\r\n"
    assert bob.set("shared-config", "mine") == denied
    assert bob.request("DEL", "shared-config") == denied
    assert bob.request("VDEL", "shared-config", "v1") == denied
    assert bob.get("users:alice:name") == denied
    assert bob.set("users:alice:name", "Mallory") == denied
    assert bob.request("KEYNOTIFY", "users:alice:name") == denied
    assert bob.set("users:bob:name", "Bob") == b"+OK\r\n"
    # Nothing denied was stored.
    assert alice.get("shared-config") == b"$2\r\nv1\r\n"
    assert alice.get("users:alice:name") == b"$5\r\nAlice\r\n"


def test_scan_lists_only_readable_keys_across_pages(secured):
    alice = StoreClient(login(secured, "alice"), "alice-1")
    bob = StoreClient(login(secured, "bob"), "bob-1")
    for i in range(7):
        assert alice.set(f"users:alice:{i}", "a") == b"+OK\r\n"
        assert bob.set(f"users:bob:{i}", "b") == b"+OK\r\n"
    assert alice.set("shared-config", "v") == b"+OK\r\n"
    # Pages of 3 keys: the walk goes on past keys bob may not read.
    assert sorted(bob.scan_all("*")) == sorted(
        [f"users:bob:{i}".encode() for i in range(7)] + [b"shared-config"]
    )
    assert bob.scan_all("users:alice:*") == []
    assert len(alice.scan_all("users:*")) == 7


def test_notifications_belong_to_their_client(secured):
    alice_mqtt = login(secured, "alice")
    alice = StoreClient(alice_mqtt, "alice-1")
    assert alice_mqtt.subscribe(notify_filter("alice-1"), 1) == [1]
    assert alice.request("KEYNOTIFY", "users:alice:k") == b"+OK\r\n"
    bob = login(secured, "bob")
    # Another client's notifications cannot be subscribed to by name...
    assert bob.subscribe(notify_filter("alice-1"), 1) == [NOT_AUTHORIZED]
    assert bob.subscribe(NOTIFY_NAMESPACE, 1) == [NOT_AUTHORIZED]
    # ...nor forged, whatever the policy: only the server publishes there.
    forged = notify_topic("alice-1", b"users:alice:k")
    assert bob.publish(forged, b"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n", qos=1) == NOT_AUTHORIZED
    assert alice_mqtt.publish(forged, b"x", qos=1) == NOT_AUTHORIZED
    alice_mqtt.expect_nothing(0.5)
    # The real one arrives.
    assert alice.set("users:alice:k", "v") == b"+OK\r\n"
    notes = [m for m in alice.others if m.topic == forged]
    if not notes:
        notes = [alice_mqtt.get()]
    assert notes[0].topic == forged
    assert notes[0].payload.startswith(b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET")


def test_without_a_policy_the_notification_namespace_is_still_the_server_s(mqkv):
    server = mqkv()
    a = Paho(server, "a")
    b = Paho(server, "b")
    assert b.subscribe(notify_filter("a"), 1) == [NOT_AUTHORIZED]
    assert b.subscribe(notify_filter("b"), 1) == [1]
    assert b.publish(notify_topic("a", b"k"), b"x", qos=1) == NOT_AUTHORIZED
    a.expect_nothing(0.3)


def test_reload_applies_to_connected_clients_without_disconnecting_them(secured, tmp_path):
    bob = login(secured, "bob")
    assert bob.subscribe("telemetry/#", 1) == [1]
    bob_store = StoreClient(bob, "bob-1")
    assert bob_store.request("KEYNOTIFY", "shared-config") == b"+OK\r\n"
    alice_mqtt = login(secured, "alice")
    alice = StoreClient(alice_mqtt, "alice-1")
    alice_mqtt.publish("telemetry/alice/1", b"before", qos=1)
    assert bob.get().payload == b"before"
    # bob loses telemetry and the shared configuration; alice keeps everything else.
    new_policy = POLICY.replace('- "telemetry/#"', '- "nothing/#"').replace(
        'keys: ["shared-config"]\n      # alice alone', 'keys: ["nothing"]\n      # alice alone')
    assert new_policy != POLICY
    secured.policy_path.write_text(new_policy)
    secured.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "policy reloaded" in secured.stderr_text(), what="policy reload")
    # Still connected; the subscription is gone, so nothing more arrives.
    alice_mqtt.publish("telemetry/alice/2", b"after", qos=1)
    bob.expect_nothing(0.5)
    assert not bob.disconnected.is_set()
    assert bob.subscribe("telemetry/#", 1) == [NOT_AUTHORIZED]
    assert bob.subscribe("nothing/x", 1) == [1]
    assert bob_store.get("shared-config") == b"-ERR not authorized\r\n"
    # The observation of a key bob may no longer read ended: no notification.
    alice.set("shared-config", "v2")
    bob.expect_nothing(0.5)
    # An invalid policy is refused whole, with its line, and the last good one stays.
    secured.policy_path.write_text(new_policy.replace("method: Connect", "method: Conect", 1))
    secured.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "policy reload failed" in secured.stderr_text(), what="reload failure")
    failure = next(line for line in secured.stderr_text().splitlines()
                   if "policy reload failed" in line)
    assert "unknown variant `Conect`" in failure and "line" in failure, failure
    assert bob.subscribe("nothing/y", 1) == [1]
    assert bob.subscribe("telemetry/#", 1) == [NOT_AUTHORIZED]


def test_an_invalid_policy_stops_the_start_with_its_line(tmp_path):
    bad = tmp_path / "policy.yaml"
    bad.write_text("- principals: { usernames: [a] }\n  brokerResources:\n"
                   "    - method: Publish\n      topics: [\"a-{principal.clientId}/x\"]\n")
    res = subprocess.run([MQKV_BIN, "serve", "--listen", f"{HOST}:0", "--storage", "memory",
                          "--policy", str(bad)], capture_output=True, timeout=30, cwd=tmp_path)
    assert res.returncode != 0
    err = res.stderr.decode()
    assert "whole topic level" in err and "line 3" in err, err


@pytest.mark.skipif(shutil.which("mosquitto_pub") is None, reason="mosquitto-clients missing")
def test_mosquitto_clients_with_passwords_and_certificate_attributes(mqkv, tmp_path, users):
    pki = make_pki(tmp_path / "pki")
    device = issue(pki.directory, "device", pki.ca, "fan-7", server=False)
    policy = tmp_path / "policy.yaml"
    policy.write_text("""
- principals:
    attributes: [{ building: "17", organization: contoso }]
  brokerResources:
    - method: Connect
    - method: Publish
      topics: ["buildings/{principal.attributes.building}/#"]
- principals: { usernames: [bob] }
  brokerResources:
    - method: Connect
    - method: Subscribe
      topics: ["buildings/#"]
""")
    server = mqkv(
        "--listen-tls", f"{HOST}:0", "--tls-cert", pki.server.cert_path,
        "--tls-key", pki.server.key_path, "--tls-client-ca", pki.ca.cert_path,
        "--password-file", users, "--policy", policy,
        config=f"""
[[certificate_attributes]]
subject = "CN = {pki.ca.cert.subject.rfc4514_string().removeprefix('CN=')}"
attributes = {{ organization = "contoso" }}

[[certificate_attributes]]
subject = "CN=fan-7"
attributes = {{ building = "17" }}
""",
    )
    port = str(server.port)
    sub = subprocess.Popen(
        ["mosquitto_sub", "-h", HOST, "-p", port, "-V", "mqttv5", "-u", "bob", "-P", "bob-pw",
         "-t", "buildings/#", "-C", "1", "-W", "20", "-i", "bob-sub"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for(lambda: "bob-sub" in server.stderr_text(), what="mosquitto_sub connected")
    tls = ["-h", "localhost", "-p", str(server.endpoints["tls"]), "-V", "mqttv5",
           "--cafile", str(pki.ca.cert_path), "--cert", str(device.cert_path),
           "--key", str(device.key_path), "-q", "1"]
    # The certificate's attribute allows building 17, not 18.
    denied = run(["mosquitto_pub", *tls, "-t", "buildings/18/temp", "-m", "x", "-d"])
    assert "rc:135" in (denied.stdout + denied.stderr).decode().lower(), denied
    ok = run(["mosquitto_pub", *tls, "-t", "buildings/17/temp", "-m", "21.5"])
    assert ok.returncode == 0, ok.stderr
    out, _ = sub.communicate(timeout=20)
    assert out.decode().strip() == "21.5"
    # A wrong password: refused, with mosquitto's report of 0x86.
    bad = run(["mosquitto_sub", "-h", HOST, "-p", port, "-V", "mqttv5", "-u", "bob",
               "-P", "wrong", "-t", "x", "-C", "1", "-W", "5"])
    assert bad.returncode != 0
    # A password user without a rule for the topic: SUBACK 0x87, reported by mosquitto_sub.
    denied_sub = run(["mosquitto_sub", "-h", HOST, "-p", port, "-V", "mqttv5", "-u", "bob",
                      "-P", "bob-pw", "-t", "other/#", "-C", "1", "-W", "5"])
    assert "all subscription requests were denied" in (denied_sub.stdout + denied_sub.stderr).decode().lower(), denied_sub


def test_limits_per_client(mqkv):
    server = mqkv(config="""
[broker]
max_connections_per_address = 2

[state_store]
max_requests_per_second = 5
max_observed_keys = 2
""")
    # Connections per address: the third from 127.0.0.1 is refused with 0x97 (Quota exceeded).
    first = Paho(server, "first")
    second = Paho(server, "second")
    Paho(server, "third", expect_rc=0x97)
    second.disconnect()

    def connects(client_id):
        # A closed connection stops counting once the server has finished with it.
        c = Paho(server, client_id, expect_rc=None)
        return c if c.connack and c.connack[0] == 0 else None

    fourth = wait_for(lambda: connects("fourth"), what="room for a new connection")
    # Requests per second: a second's worth at once, then refusals.
    store = StoreClient(first, "first")
    answers = [store.set(f"k{i}", "v") for i in range(10)]
    quota = b"-ERR the quota has been exceeded\r\n"
    assert answers.count(b"+OK\r\n") >= 4, answers
    assert answers.count(quota) >= 4, answers
    assert set(answers) <= {b"+OK\r\n", quota}, answers
    # Observed keys per connection (a fresh connection: its own request budget).
    fourth.disconnect()
    watcher = StoreClient(wait_for(lambda: connects("watcher"), what="room"), "watcher")
    assert [watcher.request("KEYNOTIFY", k) for k in ("a", "b", "c")] == [
        b"+OK\r\n", b"+OK\r\n", quota]


def test_mqkv_reload_reads_the_policy_again(mqkv, tmp_path, users):
    policy = tmp_path / "policy.yaml"
    admin = """
- principals: { usernames: [alice] }
  brokerResources:
    - method: Connect
    - method: Publish
      topics: ["$mqkv/cluster/v1/invoke"]
    - method: Subscribe
      topics: ["mqkv-cli/#"]
"""
    policy.write_text(admin)
    server = mqkv("--password-file", users, "--policy", policy, "--watch-interval-ms", "0")
    login(server, "bob", expect_rc=NOT_AUTHORIZED)
    reload = [MQKV_BIN, "reload", "--port", str(server.port), "--username", "alice",
              "--password", "alice-pw"]
    policy.write_text(admin + "- principals: { usernames: [bob] }\n"
                              "  brokerResources: [{ method: Connect }]\n")
    res = run(reload)
    assert res.returncode == 0, res.stderr
    assert res.stdout.decode().strip() == "reloaded"
    login(server, "bob")
    # A broken file: refused, reported, and the last good policy stays.
    policy.write_text(admin + "- principals: { usernames: [bob] }\n  brokerResources: [{}]\n")
    res = run(reload)
    assert res.returncode != 0
    assert "1 file(s) failed" in res.stderr.decode(), res.stderr
    assert f"(policy {policy})" in res.stderr.decode(), res.stderr
    login(server, "bob", "bob-2")
