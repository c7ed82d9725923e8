"""py-consul 1.8.0's event calls against real `meshd` processes. Without gossip, servers
keep the most recent events and an agent lists the ones for its node and services."""

import threading

from test_agent import cluster, eventually, no_consul_environment  # noqa: F401 (fixtures)


def test_fire_and_list_through_py_consul(client):
    fired = client.event.fire("deploy", "1609030")
    assert fired["Name"] == "deploy" and fired["Version"] == 1
    client.event.fire("restart")
    index, events = client.event.list()
    assert [e["Name"] for e in events] == ["deploy", "restart"]
    assert events[0]["Payload"] == b"1609030"
    _, deploys = client.event.list(name="deploy")
    assert [e["ID"] for e in deploys] == [fired["ID"]]
    got = {}

    def wait():
        got["reply"] = client.event.list(name="deploy", index=index, wait="30s")

    waiter = threading.Thread(target=wait)
    waiter.start()
    client.event.fire("deploy", "2")
    waiter.join(timeout=30)
    assert not waiter.is_alive(), "a new event did not wake the blocking list"
    new_index, deploys = got["reply"]
    assert int(new_index) > int(index) and len(deploys) == 2


def test_an_agent_lists_only_the_events_for_it(cluster):  # noqa: F811 (the fixture)
    server, agent = cluster
    local = agent.client()
    local.agent.service.register("web", port=80, tags=["v2"])
    eventually(lambda: server.client().catalog.service("web")[1], what="web registered")
    admin = server.client()
    admin.event.fire("everyone")
    admin.event.fire("other-node", node="^somewhere-else$")
    admin.event.fire("this-node", node="^node-a$")
    admin.event.fire("web-v2", service="web", tag="v2")
    admin.event.fire("web-v1", service="web", tag="v1")
    admin.event.fire("db", service="db")
    _, on_server = admin.event.list()
    assert len(on_server) == 6
    _, on_agent = local.event.list()
    assert [e["Name"] for e in on_agent] == ["everyone", "this-node", "web-v2"]
