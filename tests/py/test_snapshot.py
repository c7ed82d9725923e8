"""Snapshots against real `meshd server` processes: py-consul 1.8.0's `snapshot.save` and
`snapshot.restore`, and `meshd snapshot save|restore|inspect`. A save under write load holds
every write acknowledged before it, restored into a fresh server on a data dir (surviving
its restart) and into an etcd-backed pair (the migration path); a restore wakes a blocked
client at a higher index; a corrupt archive is refused and changes nothing."""

import os
import stat
import subprocess
import threading
import uuid

import consul
import pytest
from consul.exceptions import ConsulException

from conftest import _meshd_binary, _start_server, _stop_server


@pytest.fixture
def clean_env(monkeypatch):
    for var in ("CONSUL_HTTP_TOKEN", "CONSUL_HTTP_ADDR", "CONSUL_HTTP_SSL"):
        monkeypatch.delenv(var, raising=False)


def _server(*args):
    proc, (host, port) = _start_server(*args)
    return proc, consul.Consul(host=host, port=port), f"{host}:{port}"


def _meshd(*args):
    return subprocess.run([_meshd_binary(), *args], capture_output=True, text=True, timeout=120)


def test_a_save_under_load_restores_into_a_fresh_server_with_every_acknowledged_write(clean_env, tmp_path):
    src, a, _ = _server("-data-dir", str(tmp_path / "a"))
    try:
        a.catalog.register("n1", "10.0.0.1", service={"Service": "web", "ID": "web1", "Port": 80})
        acked = []  # (key, whether its write was acknowledged before the save began)
        saving = threading.Event()
        stop = threading.Event()
        enough = threading.Event()

        def write(worker):
            i = 0
            while not stop.is_set():
                key = f"load/{worker}/{i}"
                assert a.kv.put(key, "v") is True
                acked.append((key, not saving.is_set()))
                if len(acked) >= 200:
                    enough.set()
                i += 1

        writers = [threading.Thread(target=write, args=(w,)) for w in range(4)]
        for t in writers:
            t.start()
        assert enough.wait(timeout=60), "the writers are running"
        before = [k for k, _ in list(acked)]
        saving.set()
        archive = a.snapshot.save()
        stop.set()
        for t in writers:
            t.join(timeout=30)
        assert archive[:2] == b"\x1f\x8b"
    finally:
        _stop_server(src)

    data = tmp_path / "b"
    dst, b, _ = _server("-data-dir", str(data))
    try:
        assert b.snapshot.restore(archive) is True
        _, keys = b.kv.get("load/", keys=True)
        missing = set(before) - set(keys)
        assert not missing, f"{len(missing)} writes acknowledged before the save are missing"
    finally:
        _stop_server(dst)
    # Durable: the restore survives the server's restart.
    again, b, _ = _server("-data-dir", str(data))
    try:
        _, keys = b.kv.get("load/", keys=True)
        assert set(before) <= set(keys)
        assert [s["ServiceID"] for s in b.catalog.service("web")[1]] == ["web1"]
    finally:
        _stop_server(again)


def test_a_restore_wakes_a_blocked_client_above_its_index_and_a_corrupt_archive_changes_nothing(clean_env):
    young, y, _ = _server("-dev")
    try:
        y.kv.put("cfg", "young")
        archive = y.snapshot.save()
    finally:
        _stop_server(young)
    proc, c, _ = _server("-dev")
    try:
        for i in range(50):
            c.kv.put("cfg", str(i))
        index, _ = c.kv.get("cfg")
        woke = {}

        def block():
            woke["index"], woke["entry"] = c.kv.get("cfg", index=index, wait="30s")

        t = threading.Thread(target=block)
        t.start()
        for bad in (archive[: len(archive) // 2], b"not a snapshot", archive[:-8] + b"\x00" * 8):
            with pytest.raises(ConsulException) as refused:
                c.snapshot.restore(bad)
            assert "snapshot archive" in str(refused.value)
        assert c.kv.get("cfg")[1]["Value"] == b"49", "a refused archive changes nothing"
        assert c.snapshot.restore(archive) is True
        t.join(timeout=30)
        assert int(woke["index"]) > int(index), "the index never goes backwards"
        assert woke["entry"]["Value"] == b"young"
    finally:
        _stop_server(proc)


def test_the_cli_saves_a_private_file_inspects_it_and_restores_it(clean_env, tmp_path):
    proc, c, addr = _server("-dev")
    try:
        c.kv.put("app/a", "1")
        c.kv.put("app/b", "2")
        path = tmp_path / "backup.snap"
        saved = _meshd("snapshot", "save", "-http-addr", addr, str(path))
        assert saved.returncode == 0, saved.stderr
        assert saved.stdout.startswith("Saved and verified snapshot to index ")
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        shown = _meshd("snapshot", "inspect", str(path))
        assert shown.returncode == 0, shown.stderr
        rows = dict(line.split() for line in shown.stdout.splitlines() if line.strip().startswith(("kv ", "nodes ")))
        assert rows["kv"] == "2", shown.stdout
        c.kv.delete("app/", recurse=True)
        restored = _meshd("snapshot", "restore", "-http-addr", addr, str(path))
        assert restored.returncode == 0, restored.stderr
        assert c.kv.get("app/b")[1]["Value"] == b"2"
        corrupt = tmp_path / "corrupt.snap"
        corrupt.write_bytes(path.read_bytes()[:-20])
        refused = _meshd("snapshot", "restore", "-http-addr", addr, str(corrupt))
        assert refused.returncode != 0
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        assert "damaged or truncated" in refused.stderr
    finally:
        _stop_server(proc)


def test_an_embedded_servers_snapshot_restores_into_an_etcd_cluster(clean_env, etcd, tmp_path):
    src, a, _ = _server("-data-dir", str(tmp_path / "a"))
    try:
        for i in range(300):
            a.kv.put(f"migrate/{i:03}", str(i))
        a.catalog.register("n1", "10.0.0.1", service={"Service": "web", "ID": "web1", "Port": 80})
        archive = a.snapshot.save()
    finally:
        _stop_server(src)
    prefix = f"/py-{uuid.uuid4().hex}/"
    servers = [
        _server("-store", "etcd", "-etcd-endpoints", etcd, "-etcd-prefix", prefix, "-node", f"server-{i}")
        for i in range(2)
    ]
    try:
        first, second = servers[0][1], servers[1][1]
        first.kv.put("leftover", "x")
        assert second.snapshot.restore(archive) is True
        for c in (first, second):
            _, keys = c.kv.get("migrate/", keys=True, consistency="consistent")
            assert len(keys) == 300
            assert c.kv.get("leftover", consistency="consistent")[1] is None
            assert [s["ServiceID"] for s in c.catalog.service("web")[1]] == ["web1"]
        assert first.kv.put("after", "1") is True
    finally:
        for proc, _, _ in servers:
            _stop_server(proc)
