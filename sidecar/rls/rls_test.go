package rls

import (
	"context"
	"math"
	"net"
	"slices"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/pkg/descriptor"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/pkg/routes"
	"github.com/sluicehq/sluice/sidecar"
)

var almostOne = math.Nextafter(1, 0)

// checkout is a policy of checkout with procedures: web's create-charge
// dropped (all but one in 2^32), its get-item admitted with a quota of 100
// and 90 remaining, and a tenant descriptor that blocks "evil".
func checkout(unit sidecar.Unit) *sidecar.Policy {
	p := &sidecar.Policy{
		Name: names.Callee("checkout"), Service: "checkout", Direction: sidecar.Inbound, LiveInstances: 1,
		Procedures: []string{"create-charge", "get-item"},
		Routes: []routes.Route{
			{Pattern: "POST /v1/charges", Procedure: "create-charge"},
			{Pattern: "GET /v1/items/{id}", Procedure: "get-item"},
		},
		Peers: []sidecar.Rule{
			{Peer: "web", Procedure: "create-charge", DropRatio: almostOne, LimitRPS: 50, AllowedRPS: 50, OfferedRPS: 500},
			{Peer: "web", Procedure: "get-item", LimitRPS: 100, AllowedRPS: 100, OfferedRPS: 10},
		},
		Descriptors: []sidecar.DescriptorPolicy{{
			Name: "tenant", Source: descriptor.Source{Kind: descriptor.Header, Header: "x-tenant"},
			LimitRPS: 1e6, MissingLimitRPS: 1e6, Quantile: 0.99,
			Values: []sidecar.ValueRule{{Value: "evil", DropRatio: almostOne, LimitRPS: 1, OfferedRPS: 1000}},
		}},
		Unit: unit,
	}
	return p
}

func newService(t testing.TB, p *sidecar.Policy, m Mapping, reg prometheus.Registerer) (*Service, *sidecar.Limiter) {
	t.Helper()
	l := sidecar.NewLimiter(sidecar.LimiterOptions{})
	if p != nil {
		l.SetPolicy(p)
	}
	s, err := New(l.Service("checkout"), m, reg)
	if err != nil {
		t.Fatal(err)
	}
	return s, l
}

func desc(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func counts(l *sidecar.Limiter) map[string]sidecar.PeerCounts {
	m := map[string]sidecar.PeerCounts{}
	for _, c := range l.AppendCounts("checkout", nil) {
		m[c.Peer+"/"+c.Procedure] = c
	}
	return m
}

func TestShouldRateLimit(t *testing.T) {
	m := DefaultMapping("checkout")
	m.Headers = true
	type want struct {
		overall rlsv3.RateLimitResponse_Code
		codes   []rlsv3.RateLimitResponse_Code
		limits  []uint32 // current_limit's requests_per_unit; 0: none
		remain  []uint32
		headers []string // x-ratelimit-limit, -remaining, -reset; nil: none
	}
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	for _, tc := range []struct {
		name string
		req  *rlsv3.RateLimitRequest
		want want
	}{{
		name: "admitted with a quota",
		req:  &rlsv3.RateLimitRequest{Domain: "checkout", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("source_cluster", "web", "method", "GET", "path", "/v1/items/7?x=1")}},
		want: want{ok, []rlsv3.RateLimitResponse_Code{ok}, []uint32{100}, []uint32{90}, []string{"100, 100;w=1", "90", "1"}},
	}, {
		name: "dropped",
		req:  &rlsv3.RateLimitRequest{Domain: "checkout", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("source_cluster", "web", "method", "POST", "path", "/v1/charges")}},
		want: want{over, []rlsv3.RateLimitResponse_Code{over}, []uint32{50}, []uint32{0}, []string{"50, 50;w=1", "0", "53"}},
	}, {
		name: "one of two dropped; headers of the least remaining",
		req: &rlsv3.RateLimitRequest{Domain: "checkout", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			desc("source_cluster", "web", "method", "GET", "path", "/v1/items/7"),
			desc("source_cluster", "web", "method", "POST", "path", "/v1/charges"),
		}},
		want: want{over, []rlsv3.RateLimitResponse_Code{ok, over}, []uint32{100, 50}, []uint32{90, 0}, []string{"50, 50;w=1", "0", "53"}},
	}, {
		name: "unlisted bucket: ok, no limit",
		req:  &rlsv3.RateLimitRequest{Domain: "checkout", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("source_cluster", "mobile")}},
		want: want{ok, []rlsv3.RateLimitResponse_Code{ok}, []uint32{0}, []uint32{0}, nil},
	}, {
		name: "unmapped descriptor",
		req:  &rlsv3.RateLimitRequest{Domain: "checkout", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("remote_address", "10.0.0.1")}},
		want: want{ok, []rlsv3.RateLimitResponse_Code{ok}, []uint32{0}, []uint32{0}, nil},
	}, {
		name: "other domain",
		req:  &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("source_cluster", "web", "method", "POST", "path", "/v1/charges")}},
		want: want{ok, []rlsv3.RateLimitResponse_Code{ok}, []uint32{0}, []uint32{0}, nil},
	}, {
		name: "tenant dropped after the bucket admitted",
		req: &rlsv3.RateLimitRequest{Domain: "checkout", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			desc("source_cluster", "web", "method", "GET", "path", "/v1/items/7"),
			desc("tenant", "evil"),
		}},
		want: want{over, []rlsv3.RateLimitResponse_Code{ok, over}, []uint32{100, 1000000}, []uint32{90, 0}, []string{"100, 100;w=1", "90", "1"}},
	}, {
		name: "tenant in the bucket's descriptor",
		req: &rlsv3.RateLimitRequest{Domain: "checkout", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			desc("source_cluster", "web", "method", "GET", "path", "/v1/items/7", "tenant", "evil"),
		}},
		want: want{over, []rlsv3.RateLimitResponse_Code{over}, []uint32{1000000}, []uint32{0}, []string{"100, 100;w=1", "90", "1"}},
	}, {
		name: "no descriptors",
		req:  &rlsv3.RateLimitRequest{Domain: "checkout"},
		want: want{ok, nil, nil, nil, nil},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := newService(t, checkout(sidecar.UnitRequests), m, nil)
			resp, err := s.ShouldRateLimit(context.Background(), tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if resp.OverallCode != tc.want.overall {
				t.Errorf("overall %v, want %v", resp.OverallCode, tc.want.overall)
			}
			if len(resp.Statuses) != len(tc.want.codes) {
				t.Fatalf("%d statuses, want %d", len(resp.Statuses), len(tc.want.codes))
			}
			for i, st := range resp.Statuses {
				if st.Code != tc.want.codes[i] || st.GetCurrentLimit().GetRequestsPerUnit() != tc.want.limits[i] || st.LimitRemaining != tc.want.remain[i] {
					t.Errorf("status %d: %v, want %v limit %d remaining %d", i, st, tc.want.codes[i], tc.want.limits[i], tc.want.remain[i])
				}
				if st.CurrentLimit != nil && (st.CurrentLimit.Unit != rlsv3.RateLimitResponse_RateLimit_SECOND || st.DurationUntilReset == nil) {
					t.Errorf("status %d: %v, want a limit per SECOND and a reset", i, st)
				}
			}
			var got []string
			for _, h := range resp.ResponseHeadersToAdd {
				got = append(got, h.Value)
			}
			if !slices.Equal(got, tc.want.headers) {
				t.Errorf("headers %v, want %v", got, tc.want.headers)
			}
		})
	}
}

// TestCountedAsProxied checks that each bucket descriptor is one decision
// in its leaf's counters, as a proxied request, and that the tenant
// descriptor decides every request its bucket admitted, and no other.
func TestCountedAsProxied(t *testing.T) {
	s, l := newService(t, checkout(sidecar.UnitRequests), DefaultMapping("checkout"), nil)
	ctx := context.Background()
	for range 10 {
		s.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "checkout", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			desc("source_cluster", "web", "path", "/v1/charges", "method", "POST", "tenant", "acme"),
		}})
		s.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "checkout", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			desc("source_cluster", "web", "path", "/v1/items/1", "method", "GET", "tenant", "acme"),
		}})
		s.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "checkout", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			desc("path", "/v1/items/1", "method", "GET"),
		}})
	}
	c := counts(l)
	if got := c["web/create-charge"]; got.Offered != 10 || got.Dropped != 10 {
		t.Errorf("web/create-charge: %+v, want 10 offered, 10 dropped", got)
	}
	if got := c["web/get-item"]; got.Offered != 10 || got.Dropped != 0 {
		t.Errorf("web/get-item: %+v, want 10 offered, 0 dropped", got)
	}
	if got := c[names.Unknown+"/get-item"]; got.Offered != 10 {
		t.Errorf("unknown/get-item: %+v, want 10 offered", got)
	}
	dc := l.RotateDescriptors("checkout", nil)
	if len(dc) != 1 || dc[0].Offered != 20 {
		t.Errorf("descriptors %+v, want tenant with 20 offered: the requests the bucket admitted, "+
			"10 of acme and 10 without a tenant (descriptor.Missing), as the proxy counts them", dc)
	}
}

// TestHitsAddend checks that hits_addend is the cost of a policy counting
// cost (the descriptor's over the request's), and one request of a policy
// counting requests.
func TestHitsAddend(t *testing.T) {
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	for _, unit := range []sidecar.Unit{sidecar.UnitCost, sidecar.UnitRequests} {
		p := checkout(unit)
		p.Peers[1].LimitRPS, p.Peers[1].AllowedRPS = 1e6, 1e6
		var r prometheus.Registerer
		if unit == sidecar.UnitRequests {
			r = reg
		}
		s, l := newService(t, p, DefaultMapping("checkout"), r)
		d := desc("source_cluster", "web", "path", "/v1/items/1", "method", "GET")
		s.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "checkout", HitsAddend: 5, Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
		d.HitsAddend = wrapperspb.UInt64(7)
		s.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "checkout", HitsAddend: 5, Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
		d.HitsAddend = nil
		s.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "checkout", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}})
		got := counts(l)["web/get-item"]
		if got.Offered != 3 {
			t.Errorf("%v: %d offered, want 3 requests", unit, got.Offered)
		}
		if unit == sidecar.UnitCost && (got.OfferedCost != 13000 || got.AdmittedCost != 13000) {
			t.Errorf("cost: offered %v admitted %v, want 5 + 7 + 1 (the default price) = 13 units, in milli-units", got.OfferedCost, got.AdmittedCost)
		}
		if unit == sidecar.UnitRequests {
			if n := testutil.ToFloat64(s.hitsIgnrd); n != 2 {
				t.Errorf("hits ignored %v, want 2", n)
			}
		}
	}
}

// TestHostile checks the bounds: too many descriptors or entries are
// refused and counted; long, invalid and odd values neither panic nor
// grow the tables.
func TestHostile(t *testing.T) {
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	s, l := newService(t, checkout(sidecar.UnitRequests), DefaultMapping("checkout"), reg)
	many := &rlsv3.RateLimitRequest{Domain: "checkout"}
	for range MaxDescriptors + 1 {
		many.Descriptors = append(many.Descriptors, desc("source_cluster", "web"))
	}
	if _, err := s.ShouldRateLimit(ctx, many); status.Code(err) != codes.InvalidArgument {
		t.Errorf("%d descriptors: %v, want InvalidArgument", len(many.Descriptors), err)
	}
	wide := desc()
	for range MaxEntries + 1 {
		wide.Entries = append(wide.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: "k", Value: "v"})
	}
	if _, err := s.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "checkout", Descriptors: []*ratelimitv3.RateLimitDescriptor{wide}}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("%d entries: %v, want InvalidArgument", len(wide.Entries), err)
	}
	if n := testutil.ToFloat64(s.rejected[0]) + testutil.ToFloat64(s.rejected[1]); n != 2 {
		t.Errorf("rejected %v, want 2", n)
	}
	long := strings.Repeat("a", 1<<20)
	bad := "web\xff\xfe"
	for _, d := range []*ratelimitv3.RateLimitDescriptor{
		desc("source_cluster", long, "path", long, "tenant", long),
		desc("source_cluster", bad, "path", "/v1/\xff", "method", bad, "tenant", bad),
		desc("source_cluster", "", "", ""),
		desc("", "", "tenant", ""),
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{nil, nil}},
		nil,
	} {
		if _, err := s.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "checkout", HitsAddend: math.MaxUint32, Descriptors: []*ratelimitv3.RateLimitDescriptor{d}}); err != nil {
			t.Errorf("%.60v: %v", d, err)
		}
	}
	if testutil.ToFloat64(s.folded) != 1 {
		t.Errorf("folded %v, want 1", testutil.ToFloat64(s.folded))
	}
	for k := range counts(l) {
		if len(k) > 200 {
			t.Errorf("a counter of %d bytes: a hostile value was stored", len(k))
		}
	}
	if _, err := s.ShouldRateLimit(ctx, nil); err != nil {
		t.Errorf("nil request: %v", err)
	}
}

func TestMappingValidate(t *testing.T) {
	m := DefaultMapping("checkout")
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	m = Mapping{CallerKey: "path", ProcedureKey: "path", MethodKey: "a b", Descriptors: map[string]string{"Bad Name": "x", "tenant": ""}}
	err := m.Validate()
	for _, field := range []string{"Domain", "ProcedureKey", "MethodKey", `Descriptors: "Bad Name"`, `Descriptors: "tenant"`} {
		if err == nil || !strings.Contains(err.Error(), field) {
			t.Errorf("Validate() = %v, want it to name %s", err, field)
		}
	}
}

// TestShouldRateLimitAllocs keeps a decision to the response and its
// statuses slice.
func TestShouldRateLimitAllocs(t *testing.T) {
	s, _ := newService(t, checkout(sidecar.UnitRequests), DefaultMapping("checkout"), nil)
	req := &rlsv3.RateLimitRequest{Domain: "checkout", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		desc("source_cluster", "web", "method", "GET", "path", "/v1/items/7", "tenant", "acme"),
	}}
	ctx := context.Background()
	s.ShouldRateLimit(ctx, req)
	if n := testing.AllocsPerRun(1000, func() { s.ShouldRateLimit(ctx, req) }); n > 2 {
		t.Errorf("%v allocations per call, want at most 2 (the response and its statuses)", n)
	}
}

// BenchmarkShouldRateLimit measures a call of one descriptor (caller,
// method, path, tenant) admitted under a policy with procedures and a
// descriptor: in process, and over gRPC on loopback.
func BenchmarkShouldRateLimit(b *testing.B) {
	req := &rlsv3.RateLimitRequest{Domain: "checkout", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		desc("source_cluster", "web", "method", "GET", "path", "/v1/items/7", "tenant", "acme"),
	}}
	ctx := context.Background()
	b.Run("inprocess", func(b *testing.B) {
		s, _ := newService(b, checkout(sidecar.UnitRequests), DefaultMapping("checkout"), nil)
		b.ReportAllocs()
		for b.Loop() {
			s.ShouldRateLimit(ctx, req)
		}
	})
	b.Run("inprocess-parallel", func(b *testing.B) {
		s, _ := newService(b, checkout(sidecar.UnitRequests), DefaultMapping("checkout"), nil)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				s.ShouldRateLimit(ctx, req)
			}
		})
	})
	b.Run("grpc-loopback", func(b *testing.B) {
		s, _ := newService(b, checkout(sidecar.UnitRequests), DefaultMapping("checkout"), nil)
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		g := grpc.NewServer(ServerOptions()...)
		s.Register(g)
		go g.Serve(lis)
		defer g.Stop()
		conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		c := rlsv3.NewRateLimitServiceClient(conn)
		if _, err := c.ShouldRateLimit(ctx, req); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := c.ShouldRateLimit(ctx, req); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestProvisionalStatuses: under a surge projection's provisional ratio
// (a copy of the policy's rule) a call is answered by that ratio, and
// its statuses are rendered once, not per call.
func TestProvisionalStatuses(t *testing.T) {
	s, l := newService(t, checkout(sidecar.UnitRequests), DefaultMapping("checkout"), nil)
	l.SetProvisional("checkout", []sidecar.Provisional{{Peer: "web", Procedure: "get-item", Ratio: 0.5}})
	req := &rlsv3.RateLimitRequest{Domain: "checkout", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		desc("source_cluster", "web", "method", "GET", "path", "/v1/items/7"),
	}}
	ctx := context.Background()
	over := 0
	for range 100 {
		resp, err := s.ShouldRateLimit(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
			over++
			if got := resp.Statuses[0].GetCurrentLimit().GetRequestsPerUnit(); got != 100 {
				t.Errorf("limit %d, want 100", got)
			}
		}
	}
	if over != 50 {
		t.Errorf("%d of 100 over the limit, want 50 at a provisional ratio of 0.5", over)
	}
	if n := testing.AllocsPerRun(100, func() { s.ShouldRateLimit(ctx, req) }); n > 2 {
		t.Errorf("%v allocations per call under a provisional ratio, want at most 2", n)
	}
}

// FuzzShouldRateLimit: whatever the domain, keys, values and hits, a call
// answers one status per descriptor, or refuses the call; never a panic.
func FuzzShouldRateLimit(f *testing.F) {
	f.Add("checkout", "source_cluster", "web", "path", "/v1/charges", "tenant", "evil", uint32(0), uint8(1))
	f.Add("checkout", "", "", "path", strings.Repeat("/x", 3000), "method", "\xff", uint32(math.MaxUint32), uint8(3))
	f.Add("edge", "source_cluster", "_overflow", "tier", "", "", "", uint32(7), uint8(70))
	s, _ := newService(f, checkout(sidecar.UnitCost), DefaultMapping("checkout"), nil)
	f.Fuzz(func(t *testing.T, domain, k1, v1, k2, v2, k3, v3 string, hits uint32, n uint8) {
		req := &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: hits}
		for range int(n) % (MaxDescriptors + 2) {
			req.Descriptors = append(req.Descriptors, desc(k1, v1, k2, v2, k3, v3))
		}
		resp, err := s.ShouldRateLimit(context.Background(), req)
		if err != nil {
			if len(req.Descriptors) <= MaxDescriptors {
				t.Fatalf("%d descriptors refused: %v", len(req.Descriptors), err)
			}
			return
		}
		if len(resp.Statuses) != len(req.Descriptors) {
			t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(req.Descriptors))
		}
	})
}

// TestMissingValue: a call without the tenant entry is decided as
// descriptor.Missing, as a proxied request without the header; a policy
// that blocks Missing marks the call's bucket descriptor OVER_LIMIT.
func TestMissingValue(t *testing.T) {
	p := checkout(sidecar.UnitRequests)
	p.Descriptors[0].MissingLimitRPS = 0
	s, _ := newService(t, p, DefaultMapping("checkout"), nil)
	resp, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "checkout", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		desc("remote_address", "10.0.0.1"),
		desc("source_cluster", "web", "method", "GET", "path", "/v1/items/7"),
	}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].Code != rlsv3.RateLimitResponse_OK ||
		resp.Statuses[1].Code != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[1].GetCurrentLimit().GetName() != "tenant" {
		t.Errorf("%v, want the bucket's descriptor over tenant's limit", resp)
	}
}
