package consulapi

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
)

func register(t *testing.T, c *api.Client, node, id, name string, port int, tags ...string) {
	t.Helper()
	_, err := c.Catalog().Register(&api.CatalogRegistration{
		Node:    node,
		Address: "10.0.0.1",
		Service: &api.AgentService{ID: id, Service: name, Port: port, Tags: tags, Meta: map[string]string{"version": tags0(tags)}},
	}, nil)
	if err != nil {
		t.Fatalf("register %s on %s: %v", id, node, err)
	}
}

func tags0(tags []string) string {
	if len(tags) == 0 {
		return ""
	}
	return tags[0]
}

// Every list endpoint takes ?filter= with Consul's selectors; a bad expression is an error
// naming where it went wrong.
func TestFiltersOnListEndpoints(t *testing.T) {
	c := client(t, server, "")
	register(t, c, "filter-a", "fweb-1", "fweb", 8080, "v1")
	register(t, c, "filter-b", "fweb-2", "fweb", 8081, "v2")
	q := func(f string) *api.QueryOptions { return &api.QueryOptions{Filter: f} }

	nodes, _, err := c.Catalog().Nodes(q(`Node == "filter-b"`))
	if err != nil || len(nodes) != 1 || nodes[0].Node != "filter-b" {
		t.Fatalf("catalog nodes: %v %v", nodes, err)
	}
	svc, _, err := c.Catalog().Service("fweb", "", q(`ServiceMeta.version == v2`))
	if err != nil || len(svc) != 1 || svc[0].ServiceID != "fweb-2" {
		t.Fatalf("catalog service: %v %v", svc, err)
	}
	health, _, err := c.Health().Service("fweb", "", false, q(`"v1" in Service.Tags`))
	if err != nil || len(health) != 1 || health[0].Service.ID != "fweb-1" {
		t.Fatalf("health service: %v %v", health, err)
	}
	// Into each result's checks: the instance whose check is critical.
	_, err = c.Catalog().Register(&api.CatalogRegistration{
		Node: "filter-b", Address: "10.0.0.1",
		Check: &api.AgentCheck{Node: "filter-b", CheckID: "fweb-2-alive", Name: "alive", Status: api.HealthCritical, ServiceID: "fweb-2"},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	critical, _, err := c.Health().Service("fweb", "", false, q(`Checks.Status == critical`))
	if err != nil || len(critical) != 1 || critical[0].Service.ID != "fweb-2" {
		t.Fatalf("health service filtered on its checks: %v %v", critical, err)
	}
	list, _, err := c.Catalog().NodeServiceList("filter-a", q(`Port == 8080`))
	if err != nil || list == nil || len(list.Services) != 1 {
		t.Fatalf("node-services: %v %v", list, err)
	}
	_, _, err = c.Catalog().Nodes(q(`Node ==`))
	if err == nil || !strings.Contains(err.Error(), "400") {
		t.Fatalf("a bad filter: %v", err)
	}
	// The agent's own lists filter too.
	a := client(t, agent, "")
	if err := a.Agent().ServiceRegister(&api.AgentServiceRegistration{ID: "local-1", Name: "local", Port: 9000, Tags: []string{"blue"}}); err != nil {
		t.Fatal(err)
	}
	defer a.Agent().ServiceDeregister("local-1")
	got, err := a.Agent().ServicesWithFilter(`"blue" in Tags`)
	if err != nil || len(got) != 1 || got["local-1"] == nil {
		t.Fatalf("agent services filtered: %v %v", got, err)
	}
	got, err = a.Agent().ServicesWithFilter(`"red" in Tags`)
	if err != nil || len(got) != 0 {
		t.Fatalf("agent services filtered out: %v %v", got, err)
	}
}

// SkipNodeUpdate without an address adds a service to a node and leaves the node as it is.
func TestRegisterWithSkipNodeUpdate(t *testing.T) {
	c := client(t, server, "")
	_, err := c.Catalog().Register(&api.CatalogRegistration{
		Node: "skip-node", Address: "10.1.1.1", NodeMeta: map[string]string{"rack": "r1"},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Catalog().Register(&api.CatalogRegistration{
		Node: "skip-node", SkipNodeUpdate: true,
		Service: &api.AgentService{ID: "late", Service: "late", Port: 1},
	}, nil)
	if err != nil {
		t.Fatalf("SkipNodeUpdate without Address: %v", err)
	}
	n, _, err := c.Catalog().Node("skip-node", nil)
	if err != nil || n.Node.Address != "10.1.1.1" || n.Node.Meta["rack"] != "r1" || n.Services["late"] == nil {
		t.Fatalf("node after SkipNodeUpdate: %+v %v", n, err)
	}
}

// Servers register themselves as the `consul` service; nodes carry an ID, tagged addresses
// and Consul's meta keys.
func TestServersAndNodesLookLikeConsuls(t *testing.T) {
	c := client(t, server, "")
	consul, _, err := c.Catalog().Service("consul", "", nil)
	if err != nil || len(consul) == 0 {
		t.Fatalf("the consul service: %v %v", consul, err)
	}
	// Healthy by its node's liveness check, which its heartbeats keep passing.
	entries, _, err := c.Health().Service("consul", "", true, nil)
	if err != nil || len(entries) != 1 || len(entries[0].Checks) == 0 || entries[0].Checks.AggregatedStatus() != api.HealthPassing {
		t.Fatalf("the consul service's health: %v %v", entries, err)
	}
	n, _, err := c.Catalog().Node("go-server", nil)
	if err != nil || n == nil {
		t.Fatalf("the server's node: %v", err)
	}
	if n.Node.ID == "" {
		t.Errorf("node without ID: %+v", n.Node)
	}
	for _, k := range []string{"lan", "lan_ipv4", "wan", "wan_ipv4"} {
		if n.Node.TaggedAddresses[k] == "" {
			t.Errorf("tagged address %q missing: %v", k, n.Node.TaggedAddresses)
		}
	}
	for _, k := range []string{"consul-version", "consul-network-segment"} {
		if _, ok := n.Node.Meta[k]; !ok {
			t.Errorf("node meta %q missing: %v", k, n.Node.Meta)
		}
	}
	leader, err := c.Status().Leader()
	if err != nil || leader == "" {
		t.Fatalf("leader: %q %v", leader, err)
	}
	// A datacenter that does not exist is Consul's error, not this one's answer.
	_, _, err = c.Catalog().Nodes(&api.QueryOptions{Datacenter: "nowhere"})
	if err == nil || !strings.Contains(err.Error(), "No path to datacenter") {
		t.Fatalf("?dc=nowhere: %v", err)
	}
}

// A blocking query with a filter (consul-template's watch) returns at once without an
// index, then blocks until a change, and wakes with the new answer.
func TestBlockingQueryWithFilterWakes(t *testing.T) {
	c := client(t, server, "")
	register(t, c, "watch-node", "watched-1", "watched", 80, "prod")
	filter := `"prod" in Service.Tags`
	first, meta, err := c.Health().Service("watched", "", false, &api.QueryOptions{Filter: filter})
	if err != nil || len(first) != 1 {
		t.Fatalf("first read: %v %v", first, err)
	}
	done := make(chan []*api.ServiceEntry, 1)
	go func() {
		got, _, err := c.Health().Service("watched", "", false, &api.QueryOptions{Filter: filter, WaitIndex: meta.LastIndex, WaitTime: 30 * time.Second})
		if err != nil {
			t.Error(err)
		}
		done <- got
	}()
	time.Sleep(200 * time.Millisecond)
	register(t, c, "watch-node", "watched-2", "watched", 81, "prod")
	select {
	case got := <-done:
		if len(got) != 2 {
			t.Fatalf("woken with %d instances, want 2", len(got))
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the blocking query did not wake")
	}
}

// After the agent's register call returns, the servers have the service: a client reads
// its own write.
func TestAgentRegistrationIsVisibleAtTheServersOnReturn(t *testing.T) {
	a := client(t, agent, "")
	s := client(t, server, "")
	if err := a.Agent().ServiceRegister(&api.AgentServiceRegistration{ID: "ryw-1", Name: "ryw", Port: 7000}); err != nil {
		t.Fatal(err)
	}
	defer a.Agent().ServiceDeregister("ryw-1")
	got, _, err := s.Catalog().Service("ryw", "", nil)
	if err != nil || len(got) != 1 {
		t.Fatalf("read after the agent's register returned: %v %v", got, err)
	}
}

// An unknown /v1 path is a 404 naming it (the client's raw query does not check the
// status, so plain net/http asks).
func TestUnknownPathNamesThePath(t *testing.T) {
	resp, err := http.Get("http://" + server.addr + "/v1/no/such/endpoint")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 404 || !strings.Contains(string(body), "/v1/no/such/endpoint") {
		t.Fatalf("unknown path: %d %q", resp.StatusCode, body)
	}
}

// Empty values come back as Consul writes them: omitted where its fields are `omitempty`,
// `null` where it writes a nil map; and ?filter= reaches into a proxy's upstreams.
func TestEmptyValuesAndNestedFiltersLookLikeConsuls(t *testing.T) {
	c := client(t, server, "")
	_, err := c.Catalog().Register(&api.CatalogRegistration{
		Node: "shape-node", Address: "10.1.1.1",
		Service: &api.AgentService{ID: "shape-web", Service: "shape-web", Port: 80},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Catalog().Register(&api.CatalogRegistration{
		Node: "shape-node", Address: "10.1.1.1", SkipNodeUpdate: true,
		Service: &api.AgentService{
			Kind: api.ServiceKindConnectProxy, ID: "shape-web-sidecar-proxy", Service: "shape-web-sidecar-proxy", Port: 21000,
			Proxy: &api.AgentServiceConnectProxyConfig{
				DestinationServiceName: "shape-web",
				Upstreams:              []api.Upstream{{DestinationName: "shape-db", LocalBindPort: 9000}},
			},
		},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var rows []map[string]interface{}
	if _, err := c.Raw().Query("/v1/catalog/service/shape-web", &rows, nil); err != nil || len(rows) != 1 {
		t.Fatalf("catalog service: %v %v", rows, err)
	}
	row := rows[0]
	for key, want := range map[string]interface{}{"TaggedAddresses": nil, "NodeMeta": nil, "ServiceLocality": nil} {
		if got, ok := row[key]; !ok || got != want {
			t.Errorf("%s: %v (present: %v), want null", key, got, ok)
		}
	}
	if _, ok := row["ServiceTaggedAddresses"]; ok {
		t.Errorf("ServiceTaggedAddresses written empty: %v", row["ServiceTaggedAddresses"])
	}
	proxy, _ := row["ServiceProxy"].(map[string]interface{})
	for _, key := range []string{"Upstreams", "Config", "DestinationServiceName", "LocalServicePort"} {
		if _, ok := proxy[key]; ok {
			t.Errorf("ServiceProxy.%s written empty: %v", key, proxy)
		}
	}
	if gw, ok := proxy["MeshGateway"].(map[string]interface{}); !ok || len(gw) != 0 {
		t.Errorf("ServiceProxy.MeshGateway: %v, want {}", proxy["MeshGateway"])
	}
	// A resolver with nothing set has no Subsets, Failover or Meta.
	if _, _, err := c.ConfigEntries().Set(&api.ServiceResolverConfigEntry{Kind: api.ServiceResolver, Name: "shape-db"}, nil); err != nil {
		t.Fatal(err)
	}
	var resolver map[string]interface{}
	if _, err := c.Raw().Query("/v1/config/service-resolver/shape-db", &resolver, nil); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"Subsets", "Failover", "Meta"} {
		if _, ok := resolver[key]; ok {
			t.Errorf("resolver %s written empty: %v", key, resolver)
		}
	}
	// Nested selectors, through the client's Filter.
	for filter, want := range map[string]int{
		`Service.Proxy.Upstreams.DestinationName == "shape-db"`: 1,
		`Service.Proxy.Upstreams.DestinationName == "nope"`:     0,
		`Service.Proxy.Upstreams is empty`:                       0,
	} {
		entries, _, err := c.Health().Service("shape-web-sidecar-proxy", "", false, &api.QueryOptions{Filter: filter})
		if err != nil || len(entries) != want {
			t.Errorf("health filter %q: %d entries, want %d (%v)", filter, len(entries), want, err)
		}
	}
	services, _, err := c.Catalog().Service("shape-web-sidecar-proxy", "", &api.QueryOptions{Filter: `ServiceProxy.Upstreams.LocalBindAddress == ""`})
	if err != nil || len(services) != 1 {
		t.Errorf("catalog filter on upstreams: %v %v", services, err)
	}
}
