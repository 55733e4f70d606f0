"""mqkv's extensions of the state store protocol, on the wire: compare-and-set (SET and DEL
with IFVER), MGET, pattern watches and watches that resume (KEYNOTIFY ... SINCE). Byte-exact
answers as docs/extensions.md writes them; errors with the store's existing texts; the policy
applies; every node of a cluster answers alike."""

from __future__ import annotations

import time

from helpers import Paho
from statestore import StoreClient
from test_cluster import cluster  # noqa: F401  (fixture)
from test_security import login, secured, users  # noqa: F401  (fixtures)


def version(store: StoreClient) -> str | None:
    """The `__ts` of the latest answer."""
    return dict(store.last.properties.UserProperty or []).get("__ts")


def test_compare_and_set(server):
    s = StoreClient(Paho(server, "cas"), "cas")
    assert s.set("k", "a") == b"+OK\r\n"
    v1 = version(s)
    assert s.request("SET", "k", "b", "IFVER", v1) == b"+OK\r\n"
    v2 = version(s)
    assert v2 > v1
    # A writer that read v1 is refused and told the current version; nothing changes.
    assert s.request("SET", "k", "c", "IFVER", v1) == b":-1\r\n"
    assert version(s) == v2
    assert s.get("k") == b"$1\r\nb\r\n"
    # A key that does not exist has no version to match: refused without __ts.
    assert s.request("SET", "nope", "x", "IFVER", v2) == b":-1\r\n"
    assert version(s) is None
    # With PX, and in any case.
    assert s.request("set", "k", "d", "px", "60000", "ifver", v2) == b"+OK\r\n"
    # Malformed and conflicting options: the store's existing errors.
    assert s.request("SET", "k", "e", "IFVER", "yesterday") == b"-ERR syntax error\r\n"
    assert s.request("SET", "k", "e", "IFVER") == b"-ERR syntax error\r\n"
    assert s.request("SET", "k", "e", "NX", "IFVER", v2) == b"-ERR syntax error\r\n"


def test_compare_and_delete(server):
    s = StoreClient(Paho(server, "cad"), "cad")
    assert s.set("k", "a") == b"+OK\r\n"
    v1 = version(s)
    assert s.set("k", "b") == b"+OK\r\n"
    v2 = version(s)
    assert s.request("DEL", "k", "IFVER", v1) == b":-1\r\n"
    assert version(s) == v2
    assert s.request("DEL", "k", "IFVER", v2) == b":1\r\n"
    assert s.request("DEL", "k", "IFVER", v2) == b":0\r\n"
    # DEL forms that are not the extension answer as they always did.
    assert s.request("DEL", "k", "x") == b"-ERR wrong number of arguments\r\n"
    assert s.request("DEL", "k", "IFVER", "nonsense") == b"-ERR syntax error\r\n"


def test_mget_reads_many_keys_at_once(server):
    s = StoreClient(Paho(server, "mget"), "mget")
    assert s.set("a", "1") == b"+OK\r\n"
    va = version(s)
    assert s.set("c", "three") == b"+OK\r\n"
    vc = version(s)
    answer = s.request("MGET", "a", "b", "c")
    expected = (b"*3\r\n"
                + b"*2\r\n$1\r\n1\r\n$%d\r\n%s\r\n" % (len(va), va.encode())
                + b"$-1\r\n"
                + b"*2\r\n$5\r\nthree\r\n$%d\r\n%s\r\n" % (len(vc), vc.encode()))
    assert answer == expected
    assert version(s) is None
    assert s.request("MGET") == b"-ERR wrong number of arguments\r\n"
    assert s.request("MGET", *[f"k{i}" for i in range(129)]) == \
        b"-ERR wrong number of arguments\r\n"
    assert s.request("MGET", *[f"k{i}" for i in range(128)]).startswith(b"*128\r\n")
    assert s.request("MGET", "a", "") == b"-ERR the key length is zero\r\n"


def test_the_policy_applies_to_the_extensions(secured):  # noqa: F811
    bob = StoreClient(login(secured, "bob"), "bob-1")
    alice = StoreClient(login(secured, "alice"), "alice-1")
    assert alice.set("users:alice:x", "1") == b"+OK\r\n"
    v = version(alice)
    assert bob.set("users:bob:x", "1") == b"+OK\r\n"
    # bob may read his own keys but not alice's: one unreadable key refuses the whole MGET.
    assert bob.request("MGET", "users:bob:x", "users:alice:x") == b"-ERR not authorized\r\n"
    assert bob.request("MGET", "users:bob:x").startswith(b"*1\r\n*2\r\n")
    assert bob.request("SET", "users:alice:x", "2", "IFVER", v) == b"-ERR not authorized\r\n"
    assert bob.request("DEL", "users:alice:x", "IFVER", v) == b"-ERR not authorized\r\n"
    assert alice.get("users:alice:x") == b"$1\r\n1\r\n"


def test_every_node_of_a_cluster_answers_alike(cluster):  # noqa: F811
    stores = [StoreClient(Paho(node, f"ext-{i}"), f"ext-{i}") for i, node in enumerate(cluster)]
    assert stores[0].set("shared", "a") == b"+OK\r\n"
    v1 = version(stores[0])
    assert stores[1].request("SET", "shared", "b", "IFVER", v1) == b"+OK\r\n"
    v2 = version(stores[1])
    assert stores[2].request("SET", "shared", "c", "IFVER", v1) == b":-1\r\n"
    assert version(stores[2]) == v2
    for s in stores:
        answer = s.request("MGET", "shared", "none")
        assert answer == (b"*2\r\n*2\r\n$1\r\nb\r\n$%d\r\n%s\r\n$-1\r\n"
                          % (len(v2), v2.encode())), answer
    assert stores[0].request("DEL", "shared", "IFVER", v2) == b":1\r\n"


def notifications(store: StoreClient, within: float = 0.5) -> list[tuple[bytes, bytes]]:
    """(key, payload) of each notification that reached the store client's connection: those
    its requests read past while waiting for their answers, then those arriving within
    `within` seconds."""
    from statestore import NOTIFY_PREFIX
    out = []
    seen, store.others = store.others, []
    for m in seen + store.paho.drain(quiet=within):
        if m.topic.startswith(NOTIFY_PREFIX):
            out.append((bytes.fromhex(m.topic.rsplit("/", 1)[1]), m.payload))
    return out


SET_ONE = b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$1\r\n1\r\n"
DELETE = b"*2\r\n$6\r\nNOTIFY\r\n$6\r\nDELETE\r\n"


def test_pattern_watch(mqkv):
    server = mqkv(config="[state_store]\nmax_observed_patterns = 2\n")
    watcher = StoreClient(Paho(server, "watcher"), "watcher")
    writer = StoreClient(Paho(server, "writer"), "writer")
    assert watcher.request("KEYNOTIFY", "sensors/*", "PATTERN") == b"+OK\r\n"
    # Keys that do not exist yet are covered; others are not.
    assert writer.set("sensors/a", "1") == b"+OK\r\n"
    assert writer.set("other", "1") == b"+OK\r\n"
    assert notifications(watcher) == [(b"sensors/a", SET_ONE)]
    # Watched exactly and by pattern: one notification per change.
    assert watcher.request("KEYNOTIFY", "sensors/a") == b"+OK\r\n"
    assert watcher.request("KEYNOTIFY", "sensors/?", "PATTERN") == b"+OK\r\n"
    assert writer.request("DEL", "sensors/a") == b":1\r\n"
    assert notifications(watcher) == [(b"sensors/a", DELETE)]
    # The quota of pattern watches per connection.
    assert watcher.request("KEYNOTIFY", "x*", "PATTERN") == b"-ERR the quota has been exceeded\r\n"
    # STOP ends a pattern watch (and answers :0 when there is none).
    assert watcher.request("KEYNOTIFY", "sensors/*", "PATTERN", "STOP") == b"+OK\r\n"
    assert watcher.request("KEYNOTIFY", "sensors/*", "PATTERN", "STOP") == b":0\r\n"
    assert watcher.request("KEYNOTIFY", "sensors/?", "PATTERN", "STOP") == b"+OK\r\n"
    assert watcher.request("KEYNOTIFY", "sensors/a", "STOP") == b"+OK\r\n"
    assert writer.set("sensors/b", "1") == b"+OK\r\n"
    assert notifications(watcher) == []


def test_a_pattern_watch_notifies_only_readable_keys(secured):  # noqa: F811
    bob = StoreClient(login(secured, "bob"), "bob-1")
    alice = StoreClient(login(secured, "alice"), "alice-1")
    assert bob.request("KEYNOTIFY", "users:*", "PATTERN") == b"+OK\r\n"
    assert alice.set("users:alice:x", "1") == b"+OK\r\n"
    assert bob.set("users:bob:x", "1") == b"+OK\r\n"
    assert notifications(bob) == [(b"users:bob:x", SET_ONE)]


def test_a_watch_resumes_since_a_version(server):
    watcher = StoreClient(Paho(server, "resumer"), "resumer")
    writer = StoreClient(Paho(server, "w"), "w")
    assert writer.set("door", "open") == b"+OK\r\n"
    v1 = version(writer)
    assert writer.set("door", "shut") == b"+OK\r\n"
    v2 = version(writer)
    assert writer.set("other", "x") == b"+OK\r\n"
    assert writer.request("DEL", "door") == b":1\r\n"
    v3 = version(writer)
    # The changes after v1, in order, each with its version, before the answer.
    assert watcher.request("KEYNOTIFY", "door", "SINCE", v1) == b"+OK\r\n"
    replayed = [(m.payload, dict(m.properties.UserProperty)["__ts"]) for m in watcher.others]
    watcher.others = []
    assert replayed == [
        (b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$4\r\nshut\r\n", v2),
        (DELETE, v3),
    ]
    # Then live, as any observation.
    assert writer.set("door", "open") == b"+OK\r\n"
    live = notifications(watcher)
    assert [p for _, p in live] == [b"*4\r\n$6\r\nNOTIFY\r\n$3\r\nSET\r\n$5\r\nVALUE\r\n$4\r\nopen\r\n"]
    # Nothing after the newest version: nothing replayed.
    other = StoreClient(Paho(server, "resumer-2"), "resumer-2")
    assert other.request("KEYNOTIFY", "door", "SINCE", version(writer)) == b"+OK\r\n"
    assert notifications(other) == []
    assert other.request("KEYNOTIFY", "door", "SINCE", "then") == b"-ERR syntax error\r\n"


def test_a_version_older_than_the_history_is_refused(mqkv):
    server = mqkv(config="[state_store]\nhistory_changes = 3\n")
    watcher = StoreClient(Paho(server, "late"), "late")
    writer = StoreClient(Paho(server, "w"), "w")
    assert writer.set("k", "1") == b"+OK\r\n"
    v1 = version(writer)
    for i in range(5):
        assert writer.set(f"noise{i}", "x") == b"+OK\r\n"
    assert watcher.request("KEYNOTIFY", "k", "SINCE", v1) == \
        b"-ERR the changes since that version are no longer kept\r\n"
    # Nothing was registered: a change of k is not notified.
    assert writer.set("k", "2") == b"+OK\r\n"
    assert notifications(watcher) == []


def test_the_seam_between_replay_and_live_has_no_gap_and_no_duplicate(server):
    """A writer changes the key as fast as it can while the watcher resumes: every version
    after the one named arrives exactly once, in order."""
    import threading

    writer = StoreClient(Paho(server, "seam-w"), "seam-w")
    assert writer.set("hot", "0") == b"+OK\r\n"
    start = version(writer)
    versions = []
    done = threading.Event()

    def write():
        for i in range(1, 301):
            assert writer.set("hot", str(i)) == b"+OK\r\n"
            versions.append(version(writer))
        done.set()
    t = threading.Thread(target=write)
    t.start()
    while len(versions) < 50:
        time.sleep(0.005)
    watcher = StoreClient(Paho(server, "seam-r"), "seam-r")
    assert watcher.request("KEYNOTIFY", "hot", "SINCE", start) == b"+OK\r\n"
    t.join(30)
    assert done.is_set()
    got = []
    deadline = time.monotonic() + 10
    while len(got) < 300 and time.monotonic() < deadline:
        got += [dict(m.properties.UserProperty)["__ts"] for m in watcher.others]
        watcher.others = []
        got += [dict(m.properties.UserProperty)["__ts"] for m in watcher.paho.drain(quiet=0.3)]
    assert got == versions


def test_a_resumable_watch_survives_a_restart(mqkv, tmp_path):
    data = tmp_path / "data"
    server = mqkv("--storage", "disk", "--data-dir", data)
    writer = StoreClient(Paho(server, "w"), "w")
    assert writer.set("k", "1") == b"+OK\r\n"
    v1 = version(writer)
    assert writer.set("k", "2") == b"+OK\r\n"
    v2 = version(writer)
    writer.paho.close()
    assert server.terminate() == 0
    server = mqkv("--storage", "disk", "--data-dir", data)
    watcher = StoreClient(Paho(server, "r"), "r")
    assert watcher.request("KEYNOTIFY", "k", "SINCE", v1) == b"+OK\r\n"
    assert [dict(m.properties.UserProperty)["__ts"] for m in watcher.others] == [v2]


def test_a_pattern_watch_resumes_since_a_version(server):
    writer = StoreClient(Paho(server, "pw"), "pw")
    assert writer.set("sensors/a", "1") == b"+OK\r\n"
    since = version(writer)
    assert writer.set("sensors/b", "2") == b"+OK\r\n"
    vb = version(writer)
    assert writer.set("elsewhere", "x") == b"+OK\r\n"
    assert writer.request("DEL", "sensors/a") == b":1\r\n"
    va = version(writer)
    watcher = StoreClient(Paho(server, "pr"), "pr")
    assert watcher.request("KEYNOTIFY", "sensors/*", "PATTERN", "SINCE", since) == b"+OK\r\n"
    replayed = [(m.topic.rsplit("/", 1)[1], dict(m.properties.UserProperty)["__ts"])
                for m in watcher.others]
    watcher.others = []
    assert replayed == [(b"sensors/b".hex().upper(), vb), (b"sensors/a".hex().upper(), va)]
    # Live afterwards, once per change.
    assert writer.set("sensors/c", "3") == b"+OK\r\n"
    assert [k for k, _ in notifications(watcher)] == [b"sensors/c"]
    assert watcher.request("KEYNOTIFY", "x*", "PATTERN", "SINCE", "then") == \
        b"-ERR syntax error\r\n"


def test_watches_resume_on_any_node_and_after_a_leader_change(cluster):  # noqa: F811
    """The change history is replicated: a watch resumes on a follower, and on a survivor after
    the leader dies; a pattern watch on one node sees changes written through another."""
    from test_cluster import status

    leader_id = status(cluster[0])["leader"]
    leader = cluster[leader_id - 1]
    followers = [n for n in cluster if n is not leader]
    writer = StoreClient(Paho(leader, "hist-w"), "hist-w")
    assert writer.set("door", "open") == b"+OK\r\n"
    v1 = version(writer)
    assert writer.set("door", "shut") == b"+OK\r\n"
    v2 = version(writer)
    # A pattern watch on a follower sees a change written through the leader.
    pw = StoreClient(Paho(followers[0], "hist-pw"), "hist-pw")
    assert pw.request("KEYNOTIFY", "do*", "PATTERN") == b"+OK\r\n"
    assert writer.set("dock", "1") == b"+OK\r\n"
    assert [k for k, _ in notifications(pw, within=2)] == [b"dock"]
    # A resumed watch on the other follower replays from its own copy of the history.
    r = StoreClient(Paho(followers[1], "hist-r"), "hist-r")
    assert r.request("KEYNOTIFY", "door", "SINCE", v1) == b"+OK\r\n"
    assert [dict(m.properties.UserProperty)["__ts"] for m in r.others] == [v2]
    # The leader dies; a survivor still resumes from v1.
    writer.paho.close()
    leader.proc.kill()
    leader.proc.wait()
    leader.stopped = True
    survivor = StoreClient(Paho(followers[0], "hist-s"), "hist-s")
    deadline = time.monotonic() + 30
    while True:
        answer = survivor.request("KEYNOTIFY", "door", "SINCE", v1, timeout=10)
        if answer == b"+OK\r\n" or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert answer == b"+OK\r\n"
    assert [dict(m.properties.UserProperty)["__ts"] for m in survivor.others] == [v2]
