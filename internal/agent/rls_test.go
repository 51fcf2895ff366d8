package agent

import (
	"context"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
)

// TestRLSCountsInTheLimiter: a sidecar with --rls-listen answers
// ShouldRateLimit from its own limiter, whose counters the reports read,
// under the configured domain and keys.
func TestRLSCountsInTheLimiter(t *testing.T) {
	c := validConfig()
	c.RLS.Listen, c.RLS.Domain, c.RLS.CallerKey = "127.0.0.1:0", "mesh", "caller"
	a, err := New(c, nil, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if a.RLSServer() == nil {
		t.Fatal("no rate limit server with --rls-listen")
	}
	for _, domain := range []string{"mesh", "checkout"} {
		resp, err := a.rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{
			{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "caller", Value: "web"}}},
		}})
		if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("%s: %v, %v; want OK", domain, resp, err)
		}
	}
	var web uint64
	for _, pc := range a.Limiter().AppendCounts("checkout", nil) {
		if pc.Peer == "web" {
			web += pc.Offered
		}
	}
	if web != 1 {
		t.Errorf("web offered %d, want 1: the domain mesh's call only", web)
	}

	off := validConfig()
	b, err := New(off, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if b.RLSServer() != nil {
		t.Error("a rate limit server without --rls-listen")
	}
}
