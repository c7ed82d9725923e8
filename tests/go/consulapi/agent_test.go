package consulapi

import (
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
)

// The agent endpoints Consul's clients call: self (with the DebugConfig keys they read),
// host, metrics (JSON by default), members, maintenance, reload, monitor, authorize.
func TestAgentEndpoints(t *testing.T) {
	for name, p := range map[string]*proc{"server": server, "agent": agent} {
		t.Run(name, func(t *testing.T) {
			c := client(t, p, "")
			self, err := c.Agent().Self()
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range []string{"Datacenter", "NodeName", "NodeID", "ServerMode", "ACLsEnabled", "ConnectEnabled", "Version"} {
				if _, ok := self["DebugConfig"][k]; !ok {
					t.Errorf("DebugConfig.%s missing", k)
				}
			}
			if self["Config"]["Datacenter"] != "dc1" {
				t.Errorf("Config.Datacenter: %v", self["Config"]["Datacenter"])
			}
			if name, err := c.Agent().NodeName(); err != nil || name == "" {
				t.Errorf("NodeName: %q %v", name, err)
			}
			host, err := c.Agent().Host()
			if err != nil || host["Host"] == nil || host["Memory"] == nil {
				t.Errorf("host: %v %v", host, err)
			}
			metrics, err := c.Agent().Metrics()
			if err != nil || metrics.Timestamp == "" {
				t.Errorf("metrics (JSON): %+v %v", metrics, err)
			}
			members, err := c.Agent().Members(false)
			if err != nil || len(members) == 0 {
				t.Errorf("members: %v %v", members, err)
			}
		})
	}
	a := client(t, agent, "")
	// A client's members are the LAN pool's: itself, its servers, and every other node the
	// servers keep alive (here one kept alive by heartbeats alone).
	s := client(t, server, "")
	if _, err := s.Raw().Write("/v1/internal/node/heartbeat", map[string]string{"Node": "go-host-9", "Address": "10.0.0.9"}, nil, nil); err != nil {
		t.Fatalf("heartbeat: %v", err)
	}
	waitFor(t, "go-host-9 among the agent's members", func() bool {
		members, err := a.Agent().Members(false)
		if err != nil {
			return false
		}
		roles := map[string]string{}
		for _, m := range members {
			roles[m.Name] = m.Tags["role"]
		}
		return roles["go-host-9"] == "node" && roles["go-agent"] == "node" && roles[server.addr] == "consul"
	})
	if err := a.Agent().EnableNodeMaintenance("go client test"); err != nil {
		t.Fatal(err)
	}
	checks, err := a.Agent().Checks()
	if err != nil || checks["_node_maintenance"] == nil || checks["_node_maintenance"].Status != "critical" {
		t.Fatalf("node maintenance check: %v %v", checks, err)
	}
	if err := a.Agent().DisableNodeMaintenance(); err != nil {
		t.Fatal(err)
	}
	if err := a.Agent().Reload(); err != nil {
		t.Fatalf("reload: %v", err)
	}
	// The log stream: a registration logs a line.
	stop := make(chan struct{})
	defer close(stop)
	logs, err := a.Agent().Monitor("debug", stop, nil)
	if err != nil {
		t.Fatalf("monitor: %v", err)
	}
	go a.Agent().ServiceRegister(&api.AgentServiceRegistration{ID: "mon-1", Name: "mon", Port: 1})
	defer a.Agent().ServiceDeregister("mon-1")
	select {
	case line := <-logs:
		if strings.TrimSpace(line) == "" {
			t.Fatal("an empty log line")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no log line from the monitor")
	}
	// Authorize: no intention, ACLs off: allowed by the default.
	auth, err := a.Agent().ConnectAuthorize(&api.AgentAuthorizeParams{
		Target:        "db",
		ClientCertURI: "spiffe://11111111-2222-3333-4444-555555555555.consul/ns/default/dc/dc1/svc/web",
	})
	if err != nil || auth == nil {
		t.Fatalf("authorize: %v %v", auth, err)
	}
	if auth.Reason == "" {
		t.Errorf("authorize gave no reason: %+v", auth)
	}
}

// Joining is gossip's; meshd has none: the call is refused with a reason, never a silent 200.
func TestJoinAndForceLeave(t *testing.T) {
	a := client(t, agent, "")
	err := a.Agent().Join("127.0.0.1:8301", false)
	if err == nil {
		t.Fatal("join answered success; meshd has no gossip pool to join")
	}
	s := client(t, server, "")
	register(t, s, "gone-node", "gone-1", "gone", 1)
	if err := s.Agent().ForceLeave("gone-node"); err != nil {
		t.Fatalf("force-leave: %v", err)
	}
}

// A server is an agent too: services and checks registered on it land on its own node, are
// kept in sync, and its node goes into maintenance; its own `consul` service is not theirs.
func TestServersAreAgentsToo(t *testing.T) {
	c := client(t, server, "")
	reg := &api.AgentServiceRegistration{
		ID: "on-server-1", Name: "on-server", Port: 7000,
		Check: &api.AgentServiceCheck{CheckID: "on-server-ttl", TTL: "60s"},
	}
	if err := c.Agent().ServiceRegister(reg); err != nil {
		t.Fatalf("register on a server: %v", err)
	}
	defer c.Agent().ServiceDeregister("on-server-1")
	services, err := c.Agent().Services()
	if err != nil || services["on-server-1"] == nil {
		t.Fatalf("agent services: %v %v", services, err)
	}
	if services["consul"] != nil {
		t.Error("the server's own consul service is listed as a local registration")
	}
	// Visible at the catalog on return, on the server's node.
	entries, _, err := c.Catalog().Service("on-server", "", nil)
	if err != nil || len(entries) != 1 || entries[0].Node != "go-server" {
		t.Fatalf("catalog: %+v %v", entries, err)
	}
	if err := c.Agent().PassTTL("on-server-ttl", "fine"); err != nil {
		t.Fatalf("pass TTL: %v", err)
	}
	waitFor(t, "the TTL check passing at the catalog", func() bool {
		h, _, err := c.Health().Checks("on-server", nil)
		return err == nil && len(h) == 1 && h[0].Status == "passing" && h[0].Output == "fine"
	})
	// Its own service is refused as a registration's id, with a reason.
	err = c.Agent().ServiceRegister(&api.AgentServiceRegistration{ID: "consul", Name: "impostor"})
	if err == nil || !strings.Contains(err.Error(), "400") || !strings.Contains(err.Error(), "own service") {
		t.Errorf("registering the id consul: %v", err)
	}
	if err := c.Agent().EnableNodeMaintenance("server maintenance"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the node maintenance check at the catalog", func() bool {
		h, _, err := c.Health().Node("go-server", nil)
		if err != nil {
			return false
		}
		for _, check := range h {
			if check.CheckID == "_node_maintenance" && check.Status == "critical" {
				return true
			}
		}
		return false
	})
	if err := c.Agent().DisableNodeMaintenance(); err != nil {
		t.Fatal(err)
	}
	if err := c.Agent().Reload(); err != nil {
		t.Fatalf("reload on a server: %v", err)
	}
	if err := c.Agent().ServiceDeregister("on-server-1"); err != nil {
		t.Fatal(err)
	}
	// The server's own service outlives anti-entropy's comparisons.
	consul, _, err := c.Catalog().Service("consul", "", nil)
	if err != nil || len(consul) == 0 {
		t.Fatalf("the consul service: %v %v", consul, err)
	}
	if entries, _, _ := c.Catalog().Service("on-server", "", nil); len(entries) != 0 {
		t.Errorf("deregistered, still in the catalog: %+v", entries)
	}
}

// With ACLs, a server's agent syncs what is registered on it with no token made for it, and
// its tokens are set as Consul's are: `agent`, and `default` for requests naming none.
func TestServerAgentUnderACLs(t *testing.T) {
	m := client(t, secured, management)
	if err := m.Agent().ServiceRegister(&api.AgentServiceRegistration{ID: "acl-srv-1", Name: "acl-srv", Port: 7001}); err != nil {
		t.Fatalf("register on a secured server: %v", err)
	}
	defer m.Agent().ServiceDeregister("acl-srv-1")
	entries, _, err := m.Catalog().Service("acl-srv", "", nil)
	if err != nil || len(entries) != 1 || entries[0].Node != "go-secured" {
		t.Fatalf("catalog: %+v %v", entries, err)
	}
	anon := client(t, secured, "")
	if err := anon.Agent().ServiceRegister(&api.AgentServiceRegistration{ID: "anon-1", Name: "anon", Port: 1}); err == nil || !strings.Contains(err.Error(), "403") {
		t.Errorf("an anonymous registration on a secured server: %v", err)
	}
	// A read-only default token: requests naming none read the catalog, then no longer.
	policy, _, err := m.ACL().PolicyCreate(&api.ACLPolicy{Name: "server-default-read", Rules: `node_prefix "" { policy = "read" }`}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.ACL().PolicyDelete(policy.ID, nil)
	token, _, err := m.ACL().TokenCreate(&api.ACLToken{Policies: []*api.ACLTokenPolicyLink{{ID: policy.ID}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.ACL().TokenDelete(token.AccessorID, nil)
	if nodes, _, _ := anon.Catalog().Nodes(nil); len(nodes) != 0 {
		t.Fatalf("anonymous reads nodes before a default token: %v", nodes)
	}
	if _, err := anon.Agent().UpdateDefaultACLToken(token.SecretID, nil); err == nil || !strings.Contains(err.Error(), "403") {
		t.Errorf("setting the default token anonymously: %v", err)
	}
	if _, err := m.Agent().UpdateDefaultACLToken(token.SecretID, nil); err != nil {
		t.Fatalf("default token: %v", err)
	}
	nodes, _, err := anon.Catalog().Nodes(nil)
	if _, clearErr := m.Agent().UpdateDefaultACLToken("", nil); clearErr != nil {
		t.Fatalf("clearing the default token: %v", clearErr)
	}
	if err != nil || len(nodes) == 0 {
		t.Fatalf("with the default token, nodes: %v %v", nodes, err)
	}
	if nodes, _, _ := anon.Catalog().Nodes(nil); len(nodes) != 0 {
		t.Errorf("the default token cleared, anonymous still reads nodes: %v", nodes)
	}
	if _, err := m.Agent().UpdateAgentACLToken(management, nil); err != nil {
		t.Errorf("agent token: %v", err)
	}
	if _, err := m.Agent().UpdateReplicationACLToken("x", nil); err == nil || !strings.Contains(err.Error(), "400") {
		t.Errorf("replication token on a server: %v", err)
	}
}
