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
