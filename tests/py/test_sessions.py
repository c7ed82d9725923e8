"""py-consul 1.8.0's session calls, and locks in the KV store built on them, against real
`meshd` processes: mutual exclusion between client processes, and a lock released when
the holder's agent is killed."""

import os
import signal
import subprocess
import sys
import time

import pytest
from consul.exceptions import ConsulException, NotFound

from test_agent import eventually, start_agent, start_server

# A node check of the tests' own: the servers' liveness tracking (which marks a node whose
# `serfHealth` hears no heartbeat critical) leaves it alone, however slow the machine.
ALIVE = {"CheckID": "alive", "Name": "alive", "Status": "passing"}


def register_node(client, node="n1", status="passing"):
    assert client.catalog.register(node, "10.0.0.1", check=dict(ALIVE, Status=status)) is True


def test_sessions_lock_and_unlock_keys(client):
    register_node(client)
    a = client.session.create(name="a", node="n1", checks=["alive"], lock_delay=0)
    b = client.session.create(name="b", node="n1", checks=["alive"], behavior="delete", ttl=30)
    _, info = client.session.info(a)
    assert info["Name"] == "a" and info["Node"] == "n1"
    assert info["NodeChecks"] == ["alive"] and info["Behavior"] == "release"
    _, info = client.session.info(b)
    assert info["TTL"] == "30s" and info["Behavior"] == "delete"
    assert sorted(s["ID"] for s in client.session.node("n1")[1]) == sorted([a, b])
    assert sorted(s["ID"] for s in client.session.list()[1]) == sorted([a, b])

    assert client.kv.put("service/leader", "a", acquire=a) is True
    assert client.kv.put("service/leader", "b", acquire=b) is False, "b took a's lock"
    _, entry = client.kv.get("service/leader")
    assert entry["Session"] == a and entry["LockIndex"] == 1 and entry["Value"] == b"a"
    assert client.kv.put("service/leader", "x", release=b) is False, "b released a's lock"
    assert client.kv.put("service/leader", "a-done", release=a) is True
    assert client.kv.put("service/leader", "b", acquire=b) is True
    _, entry = client.kv.get("service/leader")
    assert entry["Session"] == b and entry["LockIndex"] == 2
    # b renews, then ends: its key goes with it (behavior delete).
    assert client.session.renew(b)["ID"] == b
    assert client.session.destroy(b) is True
    assert client.kv.get("service/leader")[1] is None
    assert client.session.info(b)[1] is None
    with pytest.raises(NotFound):
        client.session.renew(b)
    # An unknown session cannot lock.
    with pytest.raises(ConsulException) as refused:
        client.kv.put("service/leader", "x", acquire="00000000-0000-0000-0000-000000000000")
    assert "invalid session" in str(refused.value)


def test_a_failing_check_ends_the_session_and_releases_its_lock(client):
    register_node(client)
    s = client.session.create(node="n1", checks=["alive"], lock_delay=0)
    assert client.kv.put("job/lock", "mine", acquire=s) is True
    register_node(client, status="critical")
    eventually(lambda: client.session.info(s)[1] is None, timeout=10, what="session ended")
    _, entry = client.kv.get("job/lock")
    assert "Session" not in entry and entry["Value"] == b"mine"
    # A session cannot be made on a critical check.
    with pytest.raises(ConsulException) as refused:
        client.session.create(node="n1", checks=["alive"])
    assert "critical" in str(refused.value)
    # Named no checks, a session is bound to the node's liveness, which this node lacks.
    with pytest.raises(ConsulException) as refused:
        client.session.create(node="n1")
    assert "Missing check 'serfHealth' registration" in str(refused.value)


CONTENDER = r"""
import sys, time, consul
host, port, name, log, rounds = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
c = consul.Consul(host=host, port=port)
session = c.session.create(name=name, node="n1", checks=["alive"], lock_delay=0)
for _ in range(rounds):
    index = None
    while not c.kv.put("lock/leader", name, acquire=session):
        # Wait for the holder to let go, as the Go client's Lock does.
        index, _ = c.kv.get("lock/leader", index=index, wait="5s")
    with open(log, "a") as f:
        f.write(f"enter {name}\n")
    time.sleep(0.05)
    with open(log, "a") as f:
        f.write(f"exit {name}\n")
    assert c.kv.put("lock/leader", "", release=session)
c.session.destroy(session)
"""


def test_a_lock_admits_one_process_at_a_time(client, tmp_path):
    register_node(client)
    log = tmp_path / "log"
    host, port = client.http.host, client.http.port
    procs = [
        subprocess.Popen([sys.executable, "-c", CONTENDER, host, str(port), f"p{i}", str(log), "3"])
        for i in range(4)
    ]
    for p in procs:
        assert p.wait(timeout=120) == 0
    lines = log.read_text().split("\n")[:-1]
    assert len(lines) == 24
    for enter, leave in zip(lines[::2], lines[1::2]):
        who = enter.split()[1]
        assert enter == f"enter {who}" and leave == f"exit {who}", f"two holders at once: {lines}"


def test_killing_the_holders_agent_releases_its_lock():
    server = start_server(liveness="2s")
    agent = start_agent([server.addr], node="holder")
    try:
        holder = agent.client()
        eventually(lambda: server.client().catalog.node("holder")[1], what="the agent's node registered")
        # Through the agent the session is the agent's node's, bound to its liveness.
        session = holder.session.create(lock_delay=0)
        _, info = server.client().session.info(session)
        assert info["Node"] == "holder" and info["NodeChecks"] == ["serfHealth"]
        assert holder.kv.put("app/leader", "holder", acquire=session) is True
        other = server.client()
        register_node(other, node="standby")
        standby = other.session.create(node="standby", checks=["alive"], lock_delay=0)
        assert other.kv.put("app/leader", "standby", acquire=standby) is False
        agent.proc.send_signal(signal.SIGKILL)
        agent.proc.wait(timeout=10)
        eventually(lambda: other.kv.put("app/leader", "standby", acquire=standby), timeout=30,
                   what="the standby taking the lock after the holder's agent died")
        assert other.session.info(session)[1] is None
    finally:
        if agent.proc.poll() is None:
            agent.stop(signal.SIGKILL)
        assert server.stop() == 0


SEMAPHORE = r"""
import json, sys, time, consul
host, port, name, log = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
rounds, limit, contenders = int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
c = consul.Consul(host=host, port=port)
prefix = "sem/db"
session = c.session.create(name=name, node="n1", checks=["alive"], lock_delay=0)
# The Go client's semaphore: a contender key held by each session, and a .lock key whose
# holders change only by check-and-set.
assert c.kv.put(f"{prefix}/{session}", name, acquire=session)
# Start together: wait until every contender is in (so the limit is contended for). The
# marks stay, so one that finishes early cannot hold back one that starts late.
assert c.kv.put(f"sem-start/{name}", "")
index = None
while True:
    index, started = c.kv.get("sem-start/", keys=True, index=index, wait="5s")
    if len(started or []) >= contenders:
        break

def holders_and_index():
    index, entries = c.kv.get(prefix + "/", recurse=True)
    live = {e["Session"] for e in entries or [] if e.get("Session")}
    lock = next((e for e in entries or [] if e["Key"] == f"{prefix}/.lock"), None)
    state = json.loads(lock["Value"]) if lock and lock["Value"] else {"Limit": limit, "Holders": {}}
    state["Holders"] = {h: True for h in state["Holders"] if h in live}
    return state, (lock["ModifyIndex"] if lock else 0), index

for _ in range(rounds):
    while True:
        state, cas, index = holders_and_index()
        if len(state["Holders"]) < state["Limit"]:
            state["Holders"][session] = True
            if c.kv.put(f"{prefix}/.lock", json.dumps(state), cas=cas):
                break
            continue
        c.kv.get(prefix + "/", recurse=True, index=index, wait="5s")
    with open(log, "a") as f:
        f.write(f"enter {name}\n")
    time.sleep(0.2)
    with open(log, "a") as f:
        f.write(f"exit {name}\n")
    while True:
        state, cas, _ = holders_and_index()
        state["Holders"].pop(session, None)
        if c.kv.put(f"{prefix}/.lock", json.dumps(state), cas=cas):
            break
c.kv.delete(f"{prefix}/{session}")
c.session.destroy(session)
"""


def test_a_semaphore_admits_its_limit_of_processes(client, tmp_path):
    register_node(client)
    log = tmp_path / "log"
    host, port = client.http.host, client.http.port
    procs = [
        subprocess.Popen([sys.executable, "-c", SEMAPHORE, host, str(port), f"p{i}", str(log), "2", "2", "5"])
        for i in range(5)
    ]
    for p in procs:
        assert p.wait(timeout=120) == 0
    holding, most = 0, 0
    for line in log.read_text().split("\n")[:-1]:
        holding += 1 if line.startswith("enter") else -1
        most = max(most, holding)
        assert holding <= 2, f"more holders than the limit: {log.read_text()}"
    assert holding == 0 and most == 2, f"the limit was never reached: {log.read_text()}"
