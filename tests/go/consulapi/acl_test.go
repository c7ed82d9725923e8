package consulapi

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
)

// signES256 makes a JWT with claims, signed by key (as an identity provider would).
func signES256(t *testing.T, key *ecdsa.PrivateKey, claims map[string]interface{}) string {
	t.Helper()
	enc := func(v interface{}) string {
		b, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return base64.RawURLEncoding.EncodeToString(b)
	}
	input := enc(map[string]string{"alg": "ES256", "typ": "JWT"}) + "." + enc(claims)
	digest := sha256.Sum256([]byte(input))
	r, s, err := ecdsa.Sign(rand.Reader, key, digest[:])
	if err != nil {
		t.Fatal(err)
	}
	sig := make([]byte, 64)
	r.FillBytes(sig[:32])
	s.FillBytes(sig[32:])
	return input + "." + base64.RawURLEncoding.EncodeToString(sig)
}

func publicPEM(t *testing.T, key *ecdsa.PrivateKey) string {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}))
}

// A JWT auth method, a binding rule, a login whose token has the identity the rule
// computed, and a logout.
func TestAuthMethodLoginAndLogout(t *testing.T) {
	admin := client(t, secured, management)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	method, _, err := admin.ACL().AuthMethodCreate(&api.ACLAuthMethod{
		Name:        "go-idp",
		Type:        "jwt",
		MaxTokenTTL: 10 * time.Minute,
		Config: map[string]interface{}{
			"JWTValidationPubKeys": []string{publicPEM(t, key)},
			"JWTSupportedAlgs":     []string{"ES256"},
			"BoundAudiences":       []string{"meshd"},
			"ClaimMappings":        map[string]string{"svc": "service"},
		},
	}, nil)
	if err != nil || method.MaxTokenTTL != 10*time.Minute {
		t.Fatalf("auth method: %+v %v", method, err)
	}
	rule, _, err := admin.ACL().BindingRuleCreate(&api.ACLBindingRule{
		AuthMethod: "go-idp", BindType: api.BindingRuleBindTypeService, BindName: "${value.service}",
		Selector: `value.service != ""`,
	}, nil)
	if err != nil || rule.ID == "" {
		t.Fatalf("binding rule: %+v %v", rule, err)
	}
	methods, _, err := admin.ACL().AuthMethodList(nil)
	if err != nil || len(methods) != 1 || methods[0].Name != "go-idp" {
		t.Fatalf("list: %v %v", methods, err)
	}

	anon := client(t, secured, "")
	now := time.Now().Unix()
	jwt := signES256(t, key, map[string]interface{}{"svc": "billing", "aud": "meshd", "iat": now, "exp": now + 300})
	token, _, err := anon.ACL().Login(&api.ACLLoginParams{AuthMethod: "go-idp", BearerToken: jwt, Meta: map[string]string{"host": "h1"}}, nil)
	if err != nil {
		t.Fatalf("login: %v", err)
	}
	if token.AuthMethod != "go-idp" || len(token.ServiceIdentities) != 1 || token.ServiceIdentities[0].ServiceName != "billing" {
		t.Fatalf("login token: %+v", token)
	}
	if token.ExpirationTime == nil || token.ExpirationTime.Sub(time.Now()) > 11*time.Minute {
		t.Fatalf("login token's expiry: %v", token.ExpirationTime)
	}
	self, _, err := client(t, secured, token.SecretID).ACL().TokenReadSelf(nil)
	if err != nil || self.AccessorID != token.AccessorID {
		t.Fatalf("the login's token works: %+v %v", self, err)
	}
	// Another audience is refused.
	bad := signES256(t, key, map[string]interface{}{"svc": "billing", "aud": "other", "exp": now + 300})
	if _, _, err := anon.ACL().Login(&api.ACLLoginParams{AuthMethod: "go-idp", BearerToken: bad}, nil); err == nil || !strings.Contains(err.Error(), "403") {
		t.Fatalf("a token for another audience: %v", err)
	}
	if _, err := client(t, secured, token.SecretID).ACL().Logout(nil); err != nil {
		t.Fatalf("logout: %v", err)
	}
	if _, _, err := client(t, secured, token.SecretID).ACL().TokenReadSelf(nil); err == nil {
		t.Fatal("the token works after logout")
	}
	if _, err := admin.ACL().Logout(nil); err == nil {
		t.Fatal("the management token logged out")
	}
	if _, err := admin.ACL().AuthMethodDelete("go-idp", nil); err != nil {
		t.Fatal(err)
	}
}

// The built-in read-only policy, a secret that is not a UUID, rules in Consul's HCL with
// several blocks on one line, and the replication status.
func TestACLShapes(t *testing.T) {
	admin := client(t, secured, management)
	ro, _, err := admin.ACL().PolicyReadByName("builtin/global-read-only", nil)
	if err != nil || ro == nil || ro.ID == "" {
		t.Fatalf("builtin/global-read-only: %+v %v", ro, err)
	}
	policy, _, err := admin.ACL().PolicyCreate(&api.ACLPolicy{
		Name:  "one-line",
		Rules: `service "web" { policy = "write" } node_prefix "" { policy = "read" } key_prefix "app/" { policy = "read" }`,
	}, nil)
	if err != nil {
		t.Fatalf("several blocks on one line: %v", err)
	}
	tok, _, err := admin.ACL().TokenCreate(&api.ACLToken{
		SecretID: "my-own-secret-not-a-uuid",
		Policies: []*api.ACLTokenPolicyLink{{ID: policy.ID}},
	}, nil)
	if err != nil || tok.SecretID != "my-own-secret-not-a-uuid" {
		t.Fatalf("a secret that is not a UUID: %+v %v", tok, err)
	}
	web := client(t, secured, "my-own-secret-not-a-uuid")
	if _, err := web.Catalog().Register(&api.CatalogRegistration{Node: "n1", Address: "10.0.0.1"}, nil); err == nil {
		t.Fatal("node:write granted by a read rule")
	}
	repl, _, err := admin.ACL().Replication(nil)
	if err != nil || repl.Enabled {
		t.Fatalf("replication (one datacenter): %+v %v", repl, err)
	}
	// An unknown token is Consul's error.
	if _, _, err := client(t, secured, "00000000-0000-4000-8000-000000000000").Catalog().Nodes(nil); err == nil || !strings.Contains(err.Error(), "ACL not found") {
		t.Fatalf("an unknown token: %v", err)
	}
}
