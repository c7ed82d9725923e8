// Package consulapi drives meshd with HashiCorp's official Go client
// (github.com/hashicorp/consul/api, as Debian packages it), the client most tools that talk
// to Consul are built on. `cargo xtask test` runs it (see tests/go/README.md).
package consulapi

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
)

// proc is a meshd process this test started, and the HTTP address it printed.
type proc struct {
	cmd  *exec.Cmd
	addr string
}

var (
	// server: `meshd server -dev`, ACLs off.
	server *proc
	// agent: `meshd agent` joined to server.
	agent *proc
	// secured: `meshd server -dev` with ACLs on (default deny), bootstrapped.
	secured *proc
	// management: secured's bootstrap token.
	management string
)

func start(args ...string) (*proc, error) {
	bin := os.Getenv("MESHD_BIN")
	if bin == "" {
		return nil, fmt.Errorf("MESHD_BIN is not set: build meshd and name the binary")
	}
	base := []string{"-http-addr", "127.0.0.1:0", "-grpc-addr", "127.0.0.1:0", "-dns-addr", "127.0.0.1:0", "-log-level", "warn"}
	cmd := exec.Command(bin, append(args, base...)...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		cmd.Process.Kill()
		return nil, fmt.Errorf("meshd %s printed no address: %v", args[0], err)
	}
	i := strings.Index(line, "http://")
	if i < 0 {
		cmd.Process.Kill()
		return nil, fmt.Errorf("meshd %s: unexpected first line %q", args[0], line)
	}
	return &proc{cmd: cmd, addr: strings.TrimSpace(line[i+len("http://"):])}, nil
}

func (p *proc) stop() {
	if p != nil && p.cmd.Process != nil {
		p.cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { p.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			p.cmd.Process.Kill()
		}
	}
}

// client of p, with token (may be empty).
func client(t testing.TB, p *proc, token string) *api.Client {
	t.Helper()
	cfg := api.DefaultNonPooledConfig()
	cfg.Address = p.addr
	cfg.Token = token
	c, err := api.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestMain(m *testing.M) {
	// The tests talk to the processes they start, never to a Consul named by the environment.
	for _, v := range []string{"CONSUL_HTTP_ADDR", "CONSUL_HTTP_TOKEN", "CONSUL_HTTP_SSL", "CONSUL_CACERT"} {
		os.Unsetenv(v)
	}
	code := run(m)
	os.Exit(code)
}

func run(m *testing.M) int {
	var err error
	defer func() { agent.stop(); server.stop(); secured.stop() }()
	if server, err = start("server", "-dev", "-node", "go-server"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if agent, err = start("agent", "-dev", "-node", "go-agent", "-retry-join", server.addr, "-advertise", "127.0.0.1"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if secured, err = start("server", "-dev", "-node", "go-secured", "-acl-enabled", "-acl-default-policy", "deny"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cfg := api.DefaultNonPooledConfig()
	cfg.Address = secured.addr
	c, _ := api.NewClient(cfg)
	boot, _, err := c.ACL().Bootstrap()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bootstrap:", err)
		return 1
	}
	management = boot.SecretID
	// The agent has joined once its node is in the catalog.
	for i := 0; i < 200; i++ {
		cfg := api.DefaultNonPooledConfig()
		cfg.Address = server.addr
		s, _ := api.NewClient(cfg)
		if n, _, err := s.Catalog().Node("go-agent", nil); err == nil && n != nil {
			return m.Run()
		}
		time.Sleep(50 * time.Millisecond)
	}
	fmt.Fprintln(os.Stderr, "the agent did not join")
	return 1
}

// waitFor polls ok until it holds, failing the test after 10 s: for what reaches the
// catalog after the call that caused it returned (a check's status, synced in the
// background as Consul's agents do).
func waitFor(t testing.TB, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
