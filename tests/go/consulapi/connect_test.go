package consulapi

import (
	"strings"
	"testing"

	"github.com/hashicorp/consul/api"
)

// The legacy ID-based intentions API, as the 1.8 client calls it.
func TestLegacyIntentions(t *testing.T) {
	c := client(t, server, "")
	id, _, err := c.Connect().IntentionCreate(&api.Intention{
		SourceName: "web", DestinationName: "db", Action: api.IntentionActionAllow, Description: "go",
	}, nil)
	if err != nil || id == "" {
		t.Fatalf("create: %q %v", id, err)
	}
	got, _, err := c.Connect().IntentionGet(id, nil)
	if err != nil || got == nil || got.SourceName != "web" || got.Action != api.IntentionActionAllow {
		t.Fatalf("get: %+v %v", got, err)
	}
	got.Action = api.IntentionActionDeny
	if _, err := c.Connect().IntentionUpdate(got, nil); err != nil {
		t.Fatalf("update: %v", err)
	}
	allowed, _, err := c.Connect().IntentionCheck(&api.IntentionCheck{Source: "web", Destination: "db"}, nil)
	if err != nil || allowed {
		t.Fatalf("check after deny: %v %v", allowed, err)
	}
	matches, _, err := c.Connect().IntentionMatch(&api.IntentionMatch{By: api.IntentionMatchDestination, Names: []string{"db"}}, nil)
	if err != nil || len(matches["db"]) != 1 {
		t.Fatalf("match: %v %v", matches, err)
	}
	if _, err := c.Connect().IntentionDelete(id, nil); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if got, _, err := c.Connect().IntentionGet(id, nil); err == nil && got != nil {
		t.Fatalf("get after delete: %+v", got)
	}
	if _, _, err := c.Connect().IntentionGet("not-a-uuid", nil); err == nil || !strings.Contains(err.Error(), "400") {
		t.Fatalf("a bad id: %v", err)
	}
}

// A supplied private key and root are refused, never accepted and ignored; the
// configuration read carries the intermediate's TTL.
func TestCAConfiguration(t *testing.T) {
	c := client(t, server, "")
	conf, _, err := c.Connect().CAGetConfig(nil)
	if err != nil || conf.Provider != "consul" {
		t.Fatalf("get: %+v %v", conf, err)
	}
	if _, ok := conf.Config["IntermediateCertTTL"]; !ok {
		t.Errorf("IntermediateCertTTL missing: %v", conf.Config)
	}
	_, err = c.Connect().CASetConfig(&api.CAConfig{
		Provider: "consul",
		Config: map[string]interface{}{
			"PrivateKey": "-----BEGIN EC PRIVATE KEY-----\nMHc=\n-----END EC PRIVATE KEY-----",
			"RootCert":   "-----BEGIN CERTIFICATE-----\nMII=\n-----END CERTIFICATE-----",
		},
	}, nil)
	if err == nil || !strings.Contains(err.Error(), "400") {
		t.Fatalf("a supplied key and root: %v", err)
	}
	roots, _, err := c.Agent().ConnectCARoots(nil)
	if err != nil || len(roots.Roots) == 0 || roots.TrustDomain == "" {
		t.Fatalf("roots: %+v %v", roots, err)
	}
}

// Config entries as the Go client writes them (unset pointers as null, empty structs as
// objects), read back.
func TestConfigEntriesFromTheGoClient(t *testing.T) {
	c := client(t, server, "")
	entries := []api.ConfigEntry{
		&api.ServiceConfigEntry{Kind: api.ServiceDefaults, Name: "gw-web", Protocol: "http"},
		&api.IngressGatewayConfigEntry{
			Kind: api.IngressGateway, Name: "ingress",
			Listeners: []api.IngressListener{{Port: 8080, Protocol: "http", Services: []api.IngressService{{Name: "gw-web"}}}},
		},
		&api.TerminatingGatewayConfigEntry{
			Kind: api.TerminatingGateway, Name: "egress",
			Services: []api.LinkedService{{Name: "legacy", CAFile: "certs/legacy-ca.pem"}},
		},
		&api.ServiceResolverConfigEntry{Kind: api.ServiceResolver, Name: "gw-web", DefaultSubset: "", Subsets: map[string]api.ServiceResolverSubset{"v1": {Filter: "Service.Meta.version == v1"}}},
	}
	for _, e := range entries {
		ok, _, err := c.ConfigEntries().Set(e, nil)
		if err != nil || !ok {
			t.Fatalf("set %s %s: %v %v", e.GetKind(), e.GetName(), ok, err)
		}
		got, _, err := c.ConfigEntries().Get(e.GetKind(), e.GetName(), nil)
		if err != nil || got.GetName() != e.GetName() {
			t.Fatalf("get %s %s: %v", e.GetKind(), e.GetName(), err)
		}
	}
	list, _, err := c.ConfigEntries().List(api.ServiceResolver, nil)
	if err != nil || len(list) != 1 {
		t.Fatalf("list: %v %v", list, err)
	}
	chain, _, err := c.DiscoveryChain().Get("gw-web", nil, nil)
	if err != nil || chain.Chain == nil || !strings.Contains(chain.Chain.StartNode, "gw-web.default") {
		t.Fatalf("chain: %+v %v", chain, err)
	}
	for id := range chain.Chain.Targets {
		if !strings.HasSuffix(id, ".default.default.dc1") && !strings.Contains(id, ".default.default.dc1") {
			t.Errorf("target id without the partition segment: %q", id)
		}
	}
}
