package sidecar

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/criticality"
	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/names"
)

const (
	critPlus      = sluicev1.Criticality_CRITICALITY_CRITICAL_PLUS
	critical      = sluicev1.Criticality_CRITICALITY_CRITICAL
	sheddablePlus = sluicev1.Criticality_CRITICALITY_SHEDDABLE_PLUS
	sheddable     = sluicev1.Criticality_CRITICALITY_SHEDDABLE
)

// tieredPolicy is payments with tiers, as the wire brings it: header
// x-sluice-criticality, default CRITICAL, max CRITICAL; web may claim
// CRITICAL_PLUS, batch defaults to SHEDDABLE; get-charge defaults to
// SHEDDABLE_PLUS. web's and batch's sheddable create-charge leaves are
// dropped (all but one in 2^32), web's SHEDDABLE_PLUS get-charge at half,
// and its critical leaves are admitted.
func tieredPolicy() *sluicev1.DropPolicy {
	almostOne := math.Nextafter(1, 0)
	leaf := func(peer, proc string, tier sluicev1.Criticality, ratio float64) *sluicev1.PeerPolicy {
		return &sluicev1.PeerPolicy{Peer: peer, Procedure: proc, Criticality: tier, DropRatio: ratio,
			Mode: sluicev1.Mode_MODE_ENFORCE, LimitRps: proto.Float64(100), AllowedRps: proto.Float64(100)}
	}
	return &sluicev1.DropPolicy{
		Name: "callee/payments", Service: "payments", Direction: sluicev1.Direction_DIRECTION_INBOUND,
		Procedures: []string{"create-charge", "get-charge", healthCheck},
		Routes: []*sluicev1.Route{
			{Pattern: "POST /v1/charges", Procedure: "create-charge"},
			{Pattern: "GET /v1/charges/{id}", Procedure: "get-charge"},
		},
		Criticality: &sluicev1.CriticalityPolicy{
			Header:      criticality.DefaultHeader,
			DefaultTier: critical,
			MaxTier:     critical,
			Procedures:  []*sluicev1.ProcedureCriticality{{Procedure: "get-charge", DefaultTier: sheddablePlus}},
			Callers: []*sluicev1.CallerCriticality{
				{Caller: "web", MaxTier: critPlus},
				{Caller: "batch", DefaultTier: sheddable},
			},
		},
		Peers: []*sluicev1.PeerPolicy{
			leaf("web", "create-charge", sheddable, almostOne),
			leaf("web", "create-charge", critical, 0),
			leaf("web", "create-charge", critPlus, 0),
			leaf("web", "get-charge", sheddablePlus, 0.5),
			leaf("web", "get-charge", critical, 0),
			leaf("batch", "create-charge", sheddable, almostOne),
			leaf("web", healthCheck, sheddable, almostOne),
		},
	}
}

func tieredLimiter(t *testing.T, opts LimiterOptions) (*Limiter, *ServiceLimiter) {
	t.Helper()
	p, err := PolicyFromProto(tieredPolicy())
	if err != nil {
		t.Fatal(err)
	}
	l := NewLimiter(opts)
	l.SetPolicy(p)
	return l, l.Service("payments")
}

// tierCounts returns service's counters by "peer/procedure/TIER", without
// incarnations.
func tierCounts(l *Limiter, service string) map[string]PeerCounts {
	m := map[string]PeerCounts{}
	for _, c := range l.AppendCounts(service, nil) {
		c.Incarnation = 0
		m[c.Peer+"/"+c.Procedure+"/"+c.Tier.String()] = c
	}
	return m
}

func TestDecideByTier(t *testing.T) {
	l, s := tieredLimiter(t, LimiterOptions{OneStripe: true})
	for _, tc := range []struct {
		name             string
		decide           func() Decision
		leaf             string
		drop             bool
		invalid, lowered uint64
	}{
		{"no header: the service's default", func() Decision { return s.DecideHTTPTier("web", "POST", "/v1/charges", "") }, "web/create-charge/CRITICAL", false, 0, 0},
		{"header", func() Decision { return s.DecideHTTPTier("web", "POST", "/v1/charges", "SHEDDABLE") }, "web/create-charge/SHEDDABLE", true, 0, 0},
		{"lower case", func() Decision { return s.DecideHTTPTier("web", "POST", "/v1/charges", "sheddable") }, "web/create-charge/SHEDDABLE", true, 0, 0},
		{"within the caller's max", func() Decision { return s.DecideHTTPTier("web", "POST", "/v1/charges", "CRITICAL_PLUS") }, "web/create-charge/CRITICAL_PLUS", false, 0, 0},
		{"over the service's max", func() Decision { return s.DecideHTTPTier("mobile", "POST", "/v1/charges", "CRITICAL_PLUS") }, "mobile/create-charge/CRITICAL", false, 0, 1},
		{"invalid: the default", func() Decision { return s.DecideHTTPTier("web", "POST", "/v1/charges", "URGENT") }, "web/create-charge/CRITICAL", false, 1, 0},
		{"procedure default", func() Decision { return s.DecideHTTPTier("mobile", "GET", "/v1/charges/7", "") }, "mobile/get-charge/SHEDDABLE_PLUS", false, 0, 0},
		{"caller default", func() Decision { return s.DecideHTTPTier("batch", "POST", "/v1/charges", "") }, "batch/create-charge/SHEDDABLE", true, 0, 0},
		{"procedure default over the caller's", func() Decision { return s.DecideHTTPTier("batch", "GET", "/v1/charges/7", "") }, "batch/get-charge/SHEDDABLE_PLUS", false, 0, 0},
		{"invalid: the procedure's default", func() Decision { return s.DecideHTTPTier("web", "GET", "/v1/charges/7", "x") }, "web/get-charge/SHEDDABLE_PLUS", true, 1, 0}, // ratio 0.5: its first is dropped
		{"header over the procedure's default", func() Decision { return s.DecideHTTPTier("web", "GET", "/v1/charges/7", "CRITICAL") }, "web/get-charge/CRITICAL", false, 0, 0},
		{"gRPC", func() Decision { return s.DecideGRPCTier("web", healthCheck, "SHEDDABLE") }, "web/" + healthCheck + "/SHEDDABLE", true, 0, 0},
		{"gRPC without a header", func() Decision { return s.DecideGRPC("web", healthCheck) }, "web/" + healthCheck + "/CRITICAL", false, 0, 0},
		{"Decide", func() Decision { return s.Decide("batch") }, "batch/_other/SHEDDABLE", false, 0, 0},
		{"DecideTier", func() Decision { return s.DecideTier("web", "SHEDDABLE_PLUS") }, "web/_other/SHEDDABLE_PLUS", false, 0, 0},
		{"DecideHTTP: the defaults", func() Decision { return s.DecideHTTP("batch", "POST", "/v1/charges") }, "batch/create-charge/SHEDDABLE", true, 0, 0},
		{"unknown caller", func() Decision { return s.DecideHTTPTier("", "POST", "/v1/charges", "SHEDDABLE") }, "unknown/create-charge/SHEDDABLE", false, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := tierCounts(l, "payments")[tc.leaf]
			inv, low := s.critInvalid.Load(), s.critLowered.Load()
			if d := tc.decide(); d.Drop != tc.drop {
				t.Errorf("Drop = %v, want %v", d.Drop, tc.drop)
			}
			after := tierCounts(l, "payments")[tc.leaf]
			if after.Offered != before.Offered+1 {
				t.Errorf("%s offered %d, want %d; counts %v", tc.leaf, after.Offered, before.Offered+1, tierCounts(l, "payments"))
			}
			if got := s.critInvalid.Load() - inv; got != tc.invalid {
				t.Errorf("invalid counted %d, want %d", got, tc.invalid)
			}
			if got := s.critLowered.Load() - low; got != tc.lowered {
				t.Errorf("lowered counted %d, want %d", got, tc.lowered)
			}
		})
	}

	// Each tier's ratio applies to its own leaf: web's SHEDDABLE_PLUS
	// get-charge drops half, its CRITICAL get-charge none.
	var shed, crit int
	for range 1000 {
		if s.DecideHTTPTier("web", "GET", "/v1/charges/1", "SHEDDABLE_PLUS").Drop {
			shed++
		}
		if s.DecideHTTPTier("web", "GET", "/v1/charges/1", "CRITICAL").Drop {
			crit++
		}
	}
	if shed != 500 || crit != 0 {
		t.Errorf("drops of 1000: SHEDDABLE_PLUS %d, CRITICAL %d; want 500 and 0", shed, crit)
	}
	if r, ok := s.LeafTierRatio("web", "get-charge", criticality.SheddablePlus); !ok || r != 0.5 {
		t.Errorf("LeafTierRatio = %v, %v", r, ok)
	}
	if got := s.CriticalityHeader(); got != criticality.DefaultHeader {
		t.Errorf("CriticalityHeader = %q", got)
	}
	// Untiered leaves do not exist in a tiered table.
	for k := range tierCounts(l, "payments") {
		if strings.HasSuffix(k, "/") {
			t.Errorf("untiered leaf %q in a tiered table", k)
		}
	}
}

// TestTierOfUnlistedLeafAdmitted: a tier the policy does not list for a
// limited (peer, procedure) is a new leaf, admitted and counted, as an
// unseen caller's.
func TestTierOfUnlistedLeafAdmitted(t *testing.T) {
	l, s := tieredLimiter(t, LimiterOptions{})
	for range 10 {
		if s.DecideHTTPTier("batch", "POST", "/v1/charges", "CRITICAL").Drop {
			t.Fatal("batch's CRITICAL create-charge, unlisted, dropped")
		}
	}
	if got := tierCounts(l, "payments")["batch/create-charge/CRITICAL"].Offered; got != 10 {
		t.Errorf("offered %d, want 10", got)
	}
	if got := tierCounts(l, "payments")["batch/create-charge/SHEDDABLE"]; got.Offered != 0 {
		t.Errorf("the listed SHEDDABLE leaf counted %+v", got)
	}
}

// TestTieredOverflowKeepsTier: beyond MaxLeaves, a new caller's request is
// _overflow's of its procedure and its tier; leaves count against the
// bound tier by tier.
func TestTieredOverflowKeepsTier(t *testing.T) {
	l, s := tieredLimiter(t, LimiterOptions{MaxLeaves: 2})
	s.DecideHTTPTier("a", "POST", "/v1/charges", "CRITICAL")
	s.DecideHTTPTier("a", "POST", "/v1/charges", "SHEDDABLE") // the second leaf of one caller
	s.DecideHTTPTier("b", "POST", "/v1/charges", "SHEDDABLE_PLUS")
	s.DecideHTTPTier("c", "GET", "/v1/charges/1", "")
	c := tierCounts(l, "payments")
	for _, k := range []string{"a/create-charge/CRITICAL", "a/create-charge/SHEDDABLE", "_overflow/create-charge/SHEDDABLE_PLUS", "_overflow/get-charge/SHEDDABLE_PLUS"} {
		if c[k].Offered != 1 {
			t.Errorf("%s offered %d, want 1", k, c[k].Offered)
		}
	}
	if _, ok := c["b/create-charge/SHEDDABLE_PLUS"]; ok {
		t.Error("b has a leaf beyond MaxLeaves")
	}
	if n := s.observedCount(); n != 2 {
		t.Errorf("%d observed leaves, want 2", n)
	}
}

// TestFailLocalTiersShareTheLeafBucket: under fail mode local the tiers of
// one (peer, procedure) take tokens from one bucket of its limit's share:
// limits are not per tier.
func TestFailLocalTiersShareTheLeafBucket(t *testing.T) {
	admitted := func(tiers ...criticality.Tier) int {
		var rules []Rule
		for _, tier := range tiers {
			rules = append(rules, Rule{Peer: "web", Tier: tier, LimitRPS: 400})
		}
		p := failPolicy(dataplane.FailLocal, rules...)
		p.Criticality = &CriticalityPolicy{Header: criticality.DefaultHeader, Default: criticality.Critical}
		l := NewLimiter(LimiterOptions{})
		l.SetPolicyAt(p, t0)
		s := l.Service("checkout")
		l.Expire(t0.Add(testTTL)) // 400/4 rps for 100ms: 10 tokens
		n := 0
		for range 50 {
			for _, tier := range tiers {
				if !s.DecideTier("web", tier.String()).Drop {
					n++
				}
			}
		}
		return n
	}
	one := admitted(criticality.Critical)
	two := admitted(criticality.Critical, criticality.Sheddable)
	if one != 10 || two != one {
		t.Errorf("admitted %d with one tier, %d with two; want 10 and the same", one, two)
	}
}

func TestDecideTierAllocatesNothing(t *testing.T) {
	l, s := tieredLimiter(t, LimiterOptions{MaxLeaves: 1})
	s.DecideHTTPTier("observed", "GET", "/v1/charges/1", "") // fills the table
	newNames := make([]string, 1000)
	for i := range newNames {
		newNames[i] = fmt.Sprintf("new-%d", i)
	}
	next := 0
	long := strings.Repeat("x", 4096)
	for _, tc := range []struct {
		name string
		f    func() Decision
		drop bool
	}{
		{"header, dropped", func() Decision { return s.DecideHTTPTier("web", "POST", "/v1/charges", "SHEDDABLE") }, true},
		{"header, admitted", func() Decision { return s.DecideHTTPTier("web", "POST", "/v1/charges", "CRITICAL_PLUS") }, false},
		{"lowered", func() Decision { return s.DecideHTTPTier("batch", "POST", "/v1/charges", "CRITICAL_PLUS") }, false},
		{"invalid", func() Decision { return s.DecideHTTPTier("batch", "POST", "/v1/charges", long) }, true},
		{"procedure default", func() Decision { return s.DecideHTTPTier("observed", "GET", "/v1/charges/1", "") }, false},
		{"gRPC", func() Decision { return s.DecideGRPCTier("web", healthCheck, "SHEDDABLE") }, true},
		{"Decide", func() Decision { return s.DecideTier("batch", "") }, false},
		{"overflow", func() Decision {
			next++
			return s.DecideHTTPTier(newNames[next%len(newNames)], "POST", "/v1/charges", "SHEDDABLE")
		}, false},
		{"unknown", func() Decision { return s.DecideHTTPTier("", "POST", "/v1/charges", "SHEDDABLE") }, false},
		{"long caller", func() Decision { return s.DecideHTTPTier(long, "POST", "/v1/charges", "SHEDDABLE") }, false},
	} {
		tc.f() // a first sighting may allocate
		var last Decision
		if got := testing.AllocsPerRun(1000, func() { last = tc.f() }); got != 0 {
			t.Errorf("%s: %v allocations per decision", tc.name, got)
		}
		if last.Drop != tc.drop {
			t.Errorf("%s: Drop = %v, want %v", tc.name, last.Drop, tc.drop)
		}
	}
	_ = l
}

func TestPolicyFromProtoCriticality(t *testing.T) {
	p, err := PolicyFromProto(tieredPolicy())
	if err != nil {
		t.Fatal(err)
	}
	c := p.Criticality
	if c == nil || c.Header != criticality.DefaultHeader || c.Default != criticality.Critical || c.Max != criticality.Critical ||
		len(c.Procedures) != 1 || c.Procedures[0] != (ProcedureCriticality{"get-charge", criticality.SheddablePlus}) ||
		len(c.Callers) != 2 || c.Callers[0] != (CallerCriticality{"web", criticality.None, criticality.CriticalPlus}) {
		t.Errorf("Criticality = %+v", c)
	}
	if r := p.LeafTier("web", "get-charge", criticality.SheddablePlus); r == nil || r.DropRatio != 0.5 {
		t.Errorf("LeafTier = %+v", r)
	}
	for i := 1; i < len(p.Peers); i++ {
		a, b := p.Peers[i-1], p.Peers[i]
		if cmpRule(a.Peer, a.Procedure, a.Tier, leaf{b.Peer, b.Procedure, b.Tier}) >= 0 {
			t.Errorf("peers %d and %d out of order", i-1, i)
		}
	}
	back, err := PolicyFromProto(p.Proto())
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(back.Proto(), p.Proto()) {
		t.Errorf("round trip:\n got %v\nwant %v", back.Proto(), p.Proto())
	}
	m := tieredPolicy()
	m.Criticality.Header, m.Criticality.DefaultTier = "", 0
	if p, err := PolicyFromProto(m); err != nil || p.Criticality.Header != criticality.DefaultHeader || p.Criticality.Default != criticality.Critical {
		t.Errorf("unset header and default: %v, %+v", err, p.Criticality)
	}

	for _, tc := range []struct {
		name   string
		change func(m *sluicev1.DropPolicy)
		want   string
	}{
		{"outbound", func(m *sluicev1.DropPolicy) {
			m.Name, m.Direction = "caller/payments", sluicev1.Direction_DIRECTION_OUTBOUND
			m.Procedures, m.Routes = nil, nil
		}, "criticality: set in an outbound policy"},
		{"unknown default", func(m *sluicev1.DropPolicy) { m.Criticality.DefaultTier = 9 }, "criticality.default_tier: unknown value 9"},
		{"unknown max", func(m *sluicev1.DropPolicy) { m.Criticality.MaxTier = -1 }, "criticality.max_tier: unknown value -1"},
		{"upper-case header", func(m *sluicev1.DropPolicy) { m.Criticality.Header = "X-Tier" }, "criticality.header: \"X-Tier\" is not a lower-case header name"},
		{"header with a space", func(m *sluicev1.DropPolicy) { m.Criticality.Header = "x tier" }, "criticality.header:"},
		{"undeclared procedure", func(m *sluicev1.DropPolicy) {
			m.Criticality.Procedures[0].Procedure = "refund"
		}, "criticality.procedures[0].procedure: \"refund\" is neither declared"},
		{"procedure twice", func(m *sluicev1.DropPolicy) {
			m.Criticality.Procedures = append(m.Criticality.Procedures, &sluicev1.ProcedureCriticality{Procedure: "get-charge", DefaultTier: critical})
		}, "criticality.procedures[1].procedure: \"get-charge\" is listed again, first at criticality.procedures[0]"},
		{"procedure without a default", func(m *sluicev1.DropPolicy) {
			m.Criticality.Procedures[0].DefaultTier = 0
		}, "criticality.procedures[0].default_tier: unspecified"},
		{"procedure's unknown default", func(m *sluicev1.DropPolicy) {
			m.Criticality.Procedures[0].DefaultTier = 5
		}, "criticality.procedures[0].default_tier: unknown value 5"},
		{"bad caller", func(m *sluicev1.DropPolicy) { m.Criticality.Callers[1].Caller = "bad name" }, "criticality.callers[1].caller:"},
		{"caller twice", func(m *sluicev1.DropPolicy) {
			m.Criticality.Callers = append(m.Criticality.Callers, &sluicev1.CallerCriticality{Caller: "web"})
		}, "criticality.callers[2].caller: \"web\" is listed again, first at criticality.callers[0]"},
		{"caller's unknown max", func(m *sluicev1.DropPolicy) { m.Criticality.Callers[0].MaxTier = 7 }, "criticality.callers[0].max_tier: unknown value 7"},
		{"peer's unknown tier", func(m *sluicev1.DropPolicy) { m.Peers[2].Criticality = 8 }, "peers[2].criticality: unknown value 8"},
		{"untiered peer", func(m *sluicev1.DropPolicy) { m.Peers[2].Criticality = 0 }, "peers[2].criticality: unspecified, but the policy declares criticality"},
		{"tier without criticality", func(m *sluicev1.DropPolicy) { m.Criticality = nil }, "peers[0].criticality: SHEDDABLE set, but the policy declares no criticality"},
		{"leaf listed twice", func(m *sluicev1.DropPolicy) {
			m.Peers = append(m.Peers, &sluicev1.PeerPolicy{Peer: "web", Procedure: "get-charge", Criticality: sheddablePlus})
		}, "peers[7].peer: \"web\" with procedure \"get-charge\" and criticality SHEDDABLE_PLUS is listed again, first at peers[3]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := tieredPolicy()
			tc.change(m)
			_, err := PolicyFromProto(m)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("PolicyFromProto = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestMiddlewareDecidesByTier: over a real loopback server, a SHEDDABLE
// request of web is dropped while a CRITICAL one of web, to the same
// procedure, passes; the policy's header is read whatever its case.
func TestMiddlewareDecidesByTier(t *testing.T) {
	l, s := tieredLimiter(t, LimiterOptions{})
	next := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })
	srv := httptest.NewServer(s.Middleware(next, HTTPOptions{}))
	defer srv.Close()
	for _, tc := range []struct {
		tier   string
		status int
		leaf   string
	}{
		{"SHEDDABLE", http.StatusTooManyRequests, "web/create-charge/SHEDDABLE"},
		{"CRITICAL", http.StatusOK, "web/create-charge/CRITICAL"},
		{"", http.StatusOK, "web/create-charge/CRITICAL"},
	} {
		t.Run(tc.tier, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, "POST", srv.URL+"/v1/charges", nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set(DefaultCallerHeader, "web")
			if tc.tier != "" {
				req.Header.Set("X-Sluice-Criticality", tc.tier)
			}
			before := tierCounts(l, "payments")[tc.leaf].Offered
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.status {
				t.Errorf("status %d, want %d", resp.StatusCode, tc.status)
			}
			if got := tierCounts(l, "payments")[tc.leaf].Offered; got != before+1 {
				t.Errorf("%s offered %d, want %d", tc.leaf, got, before+1)
			}
		})
	}
}

// TestGRPCInterceptorsDecideByTier: the same over gRPC, the tier in the
// call's metadata.
func TestGRPCInterceptorsDecideByTier(t *testing.T) {
	l, s := tieredLimiter(t, LimiterOptions{})
	client := startHealthServer(t, s, GRPCOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, DefaultCallerHeader, "web")

	_, err := client.Check(metadata.AppendToOutgoingContext(ctx, criticality.DefaultHeader, "SHEDDABLE"), &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("SHEDDABLE Check: %v, want RESOURCE_EXHAUSTED", err)
	}
	if _, err := client.Check(metadata.AppendToOutgoingContext(ctx, criticality.DefaultHeader, "CRITICAL"), &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("CRITICAL Check: %v, want admitted", err)
	}
	stream, err := client.Watch(metadata.AppendToOutgoingContext(ctx, criticality.DefaultHeader, "bogus"), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Errorf("Watch: %v, want admitted", err)
	}
	c := tierCounts(l, "payments")
	if c["web/"+healthCheck+"/SHEDDABLE"].Dropped != 1 || c["web/"+healthCheck+"/CRITICAL"].Offered != 1 ||
		c["web/"+names.Other+"/CRITICAL"].Offered != 1 || s.critInvalid.Load() != 1 {
		t.Errorf("counts %v, invalid %d", c, s.critInvalid.Load())
	}
}

// BenchmarkDecideTier measures a decision of a service with criticality:
// the header parsed, the caller looked up among the listed ones (web) or
// not (mobile), the leaf found by its tier.
func BenchmarkDecideTier(b *testing.B) {
	p, err := PolicyFromProto(tieredPolicy())
	if err != nil {
		b.Fatal(err)
	}
	l := NewLimiter(LimiterOptions{})
	l.SetPolicy(p)
	s := l.Service("payments")
	for _, bc := range []struct{ name, peer, tier string }{
		{"listed-caller", "web", "CRITICAL"},
		{"unlisted-caller", "mobile", "SHEDDABLE_PLUS"},
		{"no-header", "mobile", ""},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				s.DecideGRPCTier(bc.peer, healthCheck, bc.tier)
			}
		})
	}
}
