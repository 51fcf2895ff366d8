package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/sidecar/reporter"
)

func validConfig() Config {
	c := DefaultConfig()
	c.Service = "checkout"
	return c
}

// problems splits a Validate error into its problems.
func problems(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// flagOf is the flag a problem names: the text before the first ": ".
func flagOf(err error) string {
	name, _, _ := strings.Cut(err.Error(), ": ")
	return name
}

// TestBadConfigNamesTheFlag: each bad field is one problem that starts with
// the name of the flag that sets it, and values at the bounds are fine.
func TestBadConfigNamesTheFlag(t *testing.T) {
	flags := Command().Flags()
	for i, tc := range []struct {
		flag   string // the flag the problem must name; "" when the config is valid
		change func(*Config)
	}{
		{"", func(*Config) {}},
		{"service", func(c *Config) { c.Service = "" }},
		{"service", func(c *Config) { c.Service = "check out" }},
		{"service", func(c *Config) { c.Service = names.Overflow }},
		{"service", func(c *Config) { c.Service = strings.Repeat("s", names.MaxLen+1) }},
		{"id", func(c *Config) { c.ID = "" }},
		{"id", func(c *Config) { c.ID = "pod/1" }},
		{"", func(c *Config) { c.Zone = "" }},
		{"zone", func(c *Config) { c.Zone = "zone a" }},
		{"upstream", func(c *Config) { c.Upstream = "" }},
		{"upstream", func(c *Config) { c.Upstream = "ftp://x" }},
		{"upstream", func(c *Config) { c.Upstream = "http://" }},
		{"upstream", func(c *Config) { c.Upstream = "127.0.0.1:8080" }},
		{"aggregators", func(c *Config) { c.Aggregators = nil }},
		{"controllers", func(c *Config) { c.Controllers = nil }},
		{"", func(c *Config) { c.XDSProtocol = "sotw" }},
		{"xds-protocol", func(c *Config) { c.XDSProtocol = "grpc" }},
		{"", func(c *Config) { c.ReportInterval = reporter.MinInterval }},
		{"", func(c *Config) { c.ReportInterval = reporter.MaxInterval }},
		{"report-interval", func(c *Config) { c.ReportInterval = 0 }},
		{"report-interval", func(c *Config) { c.ReportInterval = reporter.MinInterval - 1 }},
		{"report-interval", func(c *Config) { c.ReportInterval = reporter.MaxInterval + 1 }},
		{"caller-header", func(c *Config) { c.CallerHeader = "" }},
		{"", func(c *Config) { c.CallerIdentity = XFCCIdentity; c.TrustedProxies = []string{"10.1.2.3", "fd00::/8"} }},
		{"", func(c *Config) { c.CallerIdentity = MTLSIdentity; c.CallerMismatch = "reject" }},
		{"caller-identity", func(c *Config) { c.CallerIdentity = "jwt" }},
		{"trusted-proxies", func(c *Config) { c.CallerIdentity = XFCCIdentity; c.TrustedProxies = []string{"envoy"} }},
		{"trusted-proxies", func(c *Config) { c.CallerIdentity = XFCCIdentity; c.TrustedProxies = nil }},
		{"caller-mismatch", func(c *Config) { c.CallerMismatch = "reject" }},
		{"caller-mismatch", func(c *Config) { c.CallerMismatch = "warn" }},
		{"", func(c *Config) { c.MaxPeers = 1 }},
		{"", func(c *Config) { c.MaxPeers = MaxPeersBound }},
		{"max-peers", func(c *Config) { c.MaxPeers = 0 }},
		{"max-peers", func(c *Config) { c.MaxPeers = MaxPeersBound + 1 }},
		{"max-leaves", func(c *Config) { c.MaxLeaves = 0 }},
		{"max-leaves", func(c *Config) { c.MaxLeaves = MaxLeavesBound + 1 }},
		{"", func(c *Config) { c.PeerIdle = 2 * c.ReportInterval }},
		{"", func(c *Config) { c.ReportInterval = reporter.MaxInterval; c.PeerIdle = 0 }},
		{"peer-idle", func(c *Config) { c.PeerIdle = 2*c.ReportInterval - 1 }},
		{"peer-idle", func(c *Config) { c.PeerIdle = -1 }},
		{"", func(c *Config) { c.Strategy = "random" }},
		{"strategy", func(c *Config) { c.Strategy = "fastest" }},
		{"", func(c *Config) { c.RateLimitHeaders = "draft" }},
		{"", func(c *Config) { c.RateLimitHeaders = "x-ratelimit" }},
		{"ratelimit-headers", func(c *Config) { c.RateLimitHeaders = "" }},
		{"ratelimit-headers", func(c *Config) { c.RateLimitHeaders = "ietf" }},
		{"", func(c *Config) { c.ProxyBodyTimeout, c.ProxyMaxRequests, c.ProxyMaxConns = time.Nanosecond, 1, 1 }},
		{"proxy-body-timeout", func(c *Config) { c.ProxyBodyTimeout = 0 }},
		{"proxy-body-timeout", func(c *Config) { c.ProxyBodyTimeout = -time.Second }},
		{"", func(c *Config) { c.ProxyMinBodyRate = 0 }},
		{"proxy-min-body-rate", func(c *Config) { c.ProxyMinBodyRate = -1 }},
		{"proxy-max-requests", func(c *Config) { c.ProxyMaxRequests = 0 }},
		{"proxy-max-connections", func(c *Config) { c.ProxyMaxConns = -1 }},
		{"grpc-max-message-size", func(c *Config) { c.GRPCMaxMessage = 0 }},
		{"grpc-max-message-size", func(c *Config) { c.GRPCMaxMessage = 1 << 31 }},
		{"", func(c *Config) { c.GRPCMaxMessage = 1<<31 - 1 }},
		{"", func(c *Config) { c.RLS.CallerKey = "" }}, // off: not checked
		{"", func(c *Config) {
			c.RLS.Listen = "127.0.0.1:0"
			c.RLS.DescriptorKeys = map[string]string{"tenant": "tenant_id"}
		}},
		{"", func(c *Config) { c.RLS.Listen = "127.0.0.1:0"; c.RLS.ProcedureKey, c.RLS.MethodKey = "", "" }},
		{"rls-listen", func(c *Config) { c.RLS.Listen = "8081" }},
		{"rls-caller-key", func(c *Config) { c.RLS.Listen = "127.0.0.1:0"; c.RLS.CallerKey = "" }},
		{"rls-method-key", func(c *Config) { c.RLS.Listen = "127.0.0.1:0"; c.RLS.MethodKey = "path" }},
		{"rls-tier-key", func(c *Config) { c.RLS.Listen = "127.0.0.1:0"; c.RLS.TierKey = "a key" }},
		{"rls-descriptor-keys", func(c *Config) { c.RLS.Listen = "127.0.0.1:0"; c.RLS.DescriptorKeys = map[string]string{"tenant": ""} }},
	} {
		t.Run(fmt.Sprintf("%d/%s", i, cmpOr(tc.flag, "valid")), func(t *testing.T) {
			c := validConfig()
			tc.change(&c)
			err := c.Validate()
			if tc.flag == "" {
				if err != nil {
					t.Fatalf("Validate = %v, want nil", err)
				}
				return
			}
			if flags.Lookup(tc.flag) == nil {
				t.Fatalf("the sidecar command has no --%s: the table is wrong", tc.flag)
			}
			ps := problems(err)
			if len(ps) != 1 {
				t.Fatalf("Validate = %v, want one problem naming --%s", err, tc.flag)
			}
			if got := flagOf(ps[0]); got != tc.flag {
				t.Errorf("Validate = %q, names %q, want the flag %q", ps[0], got, tc.flag)
			}
		})
	}
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// TestBadConfigReportsEveryProblemAtOnce: a config that is wrong
// everywhere gets one problem per field, each naming a flag of the command.
func TestBadConfigReportsEveryProblemAtOnce(t *testing.T) {
	flags := Command().Flags()
	c := Config{Zone: "zone a"} // every other field zero, and zero is wrong for each
	want := []string{"service", "id", "zone", "upstream", "aggregators", "controllers",
		"xds-protocol", "report-interval", "caller-header", "caller-identity", "caller-mismatch", "max-leaves", "max-peers", "strategy", "ratelimit-headers",
		"proxy-body-timeout", "proxy-max-requests", "proxy-max-connections", "grpc-max-message-size"}
	var got []string
	for _, p := range problems(c.Validate()) {
		name := flagOf(p)
		if flags.Lookup(name) == nil {
			t.Errorf("problem %q does not start with a flag name", p)
		}
		got = append(got, name)
	}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("problems name %v, want %v", got, want)
	}
}

// TestBadConfigFailsNew: New validates, so a bad config builds nothing; the
// same config, fixed, builds an agent without connecting to anything.
func TestBadConfigFailsNew(t *testing.T) {
	bad := validConfig()
	bad.Upstream = "ftp://x"
	a, err := New(bad, nil, prometheus.NewRegistry())
	if err == nil || a != nil {
		t.Fatalf("New with --upstream ftp://x = %v, %v; want nil and an error", a, err)
	}
	if !strings.HasPrefix(err.Error(), "upstream: ") {
		t.Errorf("New = %q, want an error naming upstream", err)
	}
	if _, err := New(Config{}, nil, nil); err == nil {
		t.Error("New with a zero Config succeeded")
	}

	reg := prometheus.NewRegistry()
	a, err = New(validConfig(), nil, reg)
	if err != nil {
		t.Fatalf("New with a valid config: %v", err)
	}
	defer a.Close()
	if a.Handler() == nil || len(a.Workers()) != 3 || a.Ready() != nil {
		t.Errorf("New built an agent that is not ready to run: handler %v, %d workers, ready %v",
			a.Handler(), len(a.Workers()), a.Ready())
	}
}

// TestBadConfigCommand: the command fills Config from flags over the
// environment, and stops at Validate with every problem before it binds
// anything.
func TestBadConfigCommand(t *testing.T) {
	t.Setenv("SLUICE_SIDECAR_SERVICE", "")           // no service, whatever the machine has set
	t.Setenv("SLUICE_SIDECAR_STRATEGY", "fastest")   // bad, from the environment
	t.Setenv("SLUICE_SIDECAR_MAX_PEERS", "0")        // bad, but the flag below wins
	t.Setenv("SLUICE_SIDECAR_UPSTREAM", "http://ok") // good, but the flag below wins
	cmd := Command()
	cmd.SetArgs([]string{"--upstream", "ftp://x", "--max-peers", "5",
		"--listen", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"})
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	// Should Validate let this through, the sidecar would run: bound it.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := cmd.ExecuteContext(ctx)
	if err == nil || errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatalf("Execute = %v, want a configuration error at once; output:\n%s", err, &out)
	}
	msg := err.Error()
	for _, want := range []string{"service: ", "upstream: \"ftp://x\"", "strategy: \"fastest\""} {
		if !strings.Contains(msg, want) {
			t.Errorf("error does not report %q:\n%s", want, msg)
		}
	}
	if strings.Contains(msg, "max-peers") {
		t.Errorf("--max-peers 5 lost to SLUICE_SIDECAR_MAX_PEERS=0:\n%s", msg)
	}
	if strings.Contains(out.String(), "listening") {
		t.Errorf("the sidecar listened before it rejected its configuration:\n%s", &out)
	}
}
