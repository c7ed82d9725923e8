"""py-consul 1.8.0's KV calls against a real `meshd server` (`-dev`, and each server of
three sharing a catalog over etcd), unchanged: what consul-template, envconsul and
Spring Cloud Consul do with the KV store."""

import threading
import uuid

import consul
import pytest
from consul.exceptions import ClientError

from conftest import _start_server, _stop_server


def test_put_get_flags_cas_and_delete(client):
    assert client.kv.put("app/config", "hello", flags=7) is True
    index, entry = client.kv.get("app/config")
    assert entry["Value"] == b"hello"
    assert entry["Flags"] == 7
    assert entry["CreateIndex"] == entry["ModifyIndex"] == int(index)
    # cas=0 only creates; a stale index is refused; the current one applies.
    assert client.kv.put("app/config", "x", cas=0) is False
    assert client.kv.put("app/config", "x", cas=entry["ModifyIndex"] + 100) is False
    assert client.kv.put("app/config", b"\x00\xffbin", cas=entry["ModifyIndex"]) is True
    _, entry = client.kv.get("app/config")
    assert entry["Value"] == b"\x00\xffbin"
    # A missing key reads as None, with an index to wait on.
    index, missing = client.kv.get("app/none")
    assert missing is None and int(index) > 0
    # Delete with a stale cas does nothing; with the current one it deletes.
    assert client.kv.delete("app/config", cas=entry["ModifyIndex"] - 1) is False
    assert client.kv.delete("app/config", cas=entry["ModifyIndex"]) is True
    assert client.kv.get("app/config")[1] is None


def test_recurse_keys_separator_and_recursive_delete(client):
    for key in ["svc/web/port", "svc/web/tls/cert", "svc/api/port", "svcs"]:
        assert client.kv.put(key, "v") is True
    _, entries = client.kv.get("svc/", recurse=True)
    assert [e["Key"] for e in entries] == ["svc/api/port", "svc/web/port", "svc/web/tls/cert"]
    _, keys = client.kv.get("svc/", keys=True, separator="/")
    assert keys == ["svc/api/", "svc/web/"]
    _, keys = client.kv.get("svc", keys=True)
    assert keys == ["svc/api/port", "svc/web/port", "svc/web/tls/cert", "svcs"]
    assert client.kv.delete("svc/web/", recurse=True) is True
    _, keys = client.kv.get("", keys=True)
    assert keys == ["svc/api/port", "svcs"]
    assert client.kv.get("nothing/", recurse=True)[1] is None


def test_a_value_over_512_kib_is_refused_and_nothing_is_stored(client):
    with pytest.raises(ClientError) as refused:
        client.kv.put("big", "x" * (512 * 1024 + 1))
    assert "524288" in str(refused.value)
    assert client.kv.get("big")[1] is None
    assert client.kv.put("big", "x" * (512 * 1024)) is True


def test_blocking_queries_wake_on_the_key_and_on_the_prefix(client):
    client.kv.put("cfg/a", "1")
    client.kv.put("other/x", "1")
    key_index, _ = client.kv.get("cfg/a")
    prefix_index, _ = client.kv.get("cfg/", recurse=True)
    got = {}

    def wait(name, *args, **kwargs):
        got[name] = client.kv.get(*args, wait="60s", **kwargs)

    waiters = [
        threading.Thread(target=wait, args=("key", "cfg/a"), kwargs={"index": key_index}),
        threading.Thread(target=wait, args=("prefix", "cfg/"), kwargs={"index": prefix_index, "recurse": True}),
    ]
    for w in waiters:
        w.start()
    client.kv.put("cfg/b", "1")
    waiters[1].join(timeout=30)
    assert not waiters[1].is_alive(), "a new key under the prefix did not wake its listing"
    index, entries = got["prefix"]
    assert int(index) > int(prefix_index)
    assert [e["Key"] for e in entries] == ["cfg/a", "cfg/b"]
    assert waiters[0].is_alive(), "another key's write woke the key's watcher"
    client.kv.put("cfg/a", "2")
    waiters[0].join(timeout=30)
    assert not waiters[0].is_alive(), "the key's own write did not wake its watcher"
    assert got["key"][1]["Value"] == b"2"


@pytest.fixture
def two_etcd_servers(etcd):
    prefix = f"/py-kv-{uuid.uuid4().hex}/"
    started = [
        _start_server("-store", "etcd", "-etcd-endpoints", etcd, "-etcd-prefix", prefix, "-node", f"kv-{i}")
        for i in range(2)
    ]
    yield [consul.Consul(host=host, port=port) for _, (host, port) in started]
    for proc, _ in started:
        _stop_server(proc)


def test_a_check_and_set_race_between_two_servers_applies_once(two_etcd_servers, monkeypatch):
    for var in ("CONSUL_HTTP_TOKEN", "CONSUL_HTTP_ADDR", "CONSUL_HTTP_SSL"):
        monkeypatch.delenv(var, raising=False)
    a, b = two_etcd_servers
    for round in range(20):
        key = f"race/{round}"
        results = {}
        barrier = threading.Barrier(2)

        def create(name, c):
            barrier.wait()
            results[name] = c.kv.put(key, name, cas=0)

        threads = [threading.Thread(target=create, args=(n, c)) for n, c in (("a", a), ("b", b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        winners = [n for n, won in results.items() if won]
        assert len(winners) == 1, f"round {round}: {results}"
        # Both servers read the winner's value.
        for c in (a, b):
            _, entry = c.kv.get(key, consistency="consistent")
            assert entry["Value"] == winners[0].encode()


def test_transactions_through_py_consul(client):
    import base64

    def b64(text):
        return base64.b64encode(text.encode()).decode()

    assert client.kv.put("tx/a", "1") is True
    _, entry = client.kv.get("tx/a")
    result = client.txn.put([
        {"KV": {"Verb": "cas", "Key": "tx/a", "Value": b64("2"), "Index": entry["ModifyIndex"]}},
        {"KV": {"Verb": "set", "Key": "tx/b", "Value": b64("b")}},
        {"KV": {"Verb": "get", "Key": "tx/b"}},
    ])
    assert result["Errors"] is None
    assert base64.b64decode(result["Results"][2]["KV"]["Value"]) == b"b"
    assert client.kv.get("tx/a")[1]["Value"] == b"2"
    # A failing operation rolls back the whole transaction.
    with pytest.raises(ClientError) as rolled_back:
        client.txn.put([
            {"KV": {"Verb": "delete", "Key": "tx/b"}},
            {"KV": {"Verb": "check-index", "Key": "tx/a", "Index": entry["ModifyIndex"]}},
        ])
    assert "409" in str(rolled_back.value) and '"OpIndex":1' in str(rolled_back.value).replace(" ", "")
    assert client.kv.get("tx/b")[1]["Value"] == b"b"
