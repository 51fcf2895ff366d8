package sidecar

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/pkg/routes"
)

const (
	healthCheck = "/grpc.health.v1.Health/Check"
	healthWatch = "/grpc.health.v1.Health/Watch"
)

// checkoutProcedures is a policy of checkout with procedures: two routes,
// a gRPC method, and rules for some leaves of web. web's create-charge is
// dropped (all but one in 2^32), its get-item admitted with a quota, its
// _other dropped, and mobile's Check dropped.
func checkoutProcedures(rules ...Rule) *Policy {
	almostOne := math.Nextafter(1, 0)
	p := policy("checkout", append(rules,
		Rule{Peer: "web", Procedure: "create-charge", DropRatio: almostOne, LimitRPS: 50, AllowedRPS: 50},
		Rule{Peer: "web", Procedure: "get-item", LimitRPS: 100, AllowedRPS: 100, OfferedRPS: 10},
		Rule{Peer: "web", Procedure: names.Other, DropRatio: almostOne, LimitRPS: 0, AllowedRPS: 0},
		Rule{Peer: "mobile", Procedure: healthCheck, DropRatio: almostOne, LimitRPS: 5, AllowedRPS: 5},
	)...)
	slices.SortFunc(p.Peers, func(a, b Rule) int { return cmpRule(a.Peer, a.Procedure, a.Tier, leaf{b.Peer, b.Procedure, b.Tier}) })
	p.Procedures = []string{"create-charge", "get-item", healthCheck}
	p.Routes = []routes.Route{
		{Pattern: "POST /v1/charges", Procedure: "create-charge"},
		{Pattern: "GET /v1/items/{id}", Procedure: "get-item"},
	}
	return p
}

// leafCounts returns service's counters by "peer/procedure", without
// incarnations.
func leafCounts(l *Limiter, service string) map[string]PeerCounts {
	m := map[string]PeerCounts{}
	for _, c := range l.AppendCounts(service, nil) {
		c.Incarnation = 0
		m[c.Peer+"/"+c.Procedure] = c
	}
	return m
}

func TestDecideByProcedure(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	l.SetPolicy(checkoutProcedures())
	s := l.Service("checkout")
	for _, tc := range []struct {
		name   string
		decide func() Decision
		leaf   string // the leaf counted, "peer/procedure"
		drop   bool
	}{
		{"route", func() Decision { return s.DecideHTTP("web", "POST", "/v1/charges") }, "web/create-charge", true},
		{"route with a parameter", func() Decision { return s.DecideHTTP("web", "GET", "/v1/items/42") }, "web/get-item", false},
		{"no route matches", func() Decision { return s.DecideHTTP("web", "GET", "/v1/charges") }, "web/_other", true},
		{"a gRPC call through HTTP", func() Decision { return s.DecideHTTP("mobile", "POST", healthCheck) }, "mobile/" + healthCheck, true},
		{"declared method", func() Decision { return s.DecideGRPC("mobile", healthCheck) }, "mobile/" + healthCheck, true},
		{"undeclared method", func() Decision { return s.DecideGRPC("mobile", healthWatch) }, "mobile/_other", false},
		{"invalid method", func() Decision { return s.DecideGRPC("mobile", "not a method") }, "mobile/_other", false},
		{"a route's procedure by its gRPC name", func() Decision { return s.DecideGRPC("web", "create-charge") }, "web/create-charge", true},
		{"Decide knows no procedure", func() Decision { return s.Decide("web") }, "web/_other", true},
		{"a leaf without a rule", func() Decision { return s.DecideHTTP("mobile", "POST", "/v1/charges") }, "mobile/create-charge", false},
		{"no caller", func() Decision { return s.DecideGRPC("", healthCheck) }, "unknown/" + healthCheck, false},
		{"invalid caller", func() Decision { return s.DecideHTTP("bad name", "GET", "/v1/items/1") }, "unknown/get-item", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := leafCounts(l, "checkout")[tc.leaf].Offered
			d := tc.decide()
			if d.Drop != tc.drop {
				t.Errorf("Drop = %v, want %v", d.Drop, tc.drop)
			}
			if r := d.Rule(); r != nil && r.Peer+"/"+r.Procedure != tc.leaf {
				t.Errorf("decided under the rule of %s/%s, want %s", r.Peer, r.Procedure, tc.leaf)
			}
			if got := leafCounts(l, "checkout")[tc.leaf].Offered; got != before+1 {
				t.Errorf("%s offered %d, want %d", tc.leaf, got, before+1)
			}
		})
	}

	// One entry per leaf, sorted by peer then procedure; the reserved
	// peers have a leaf of every procedure, and the leaves the policy
	// limits have theirs before any request.
	var got []string
	for _, c := range l.AppendCounts("checkout", nil) {
		got = append(got, c.Peer+"/"+c.Procedure)
	}
	var want []string
	for _, peer := range []string{names.Overflow, names.Unknown} {
		for _, q := range []string{healthCheck, names.Other, "create-charge", "get-item"} {
			want = append(want, peer+"/"+q)
		}
	}
	want = append(want, "mobile/"+healthCheck, "mobile/_other", "mobile/create-charge",
		"web/_other", "web/create-charge", "web/get-item")
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("counted leaves\n got %v\nwant %v", got, want)
	}
}

func TestWithoutProceduresDecideHTTPAndGRPCAreDecide(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	l.SetPolicy(policy("checkout", Rule{Peer: "web", DropRatio: math.Nextafter(1, 0)}))
	s := l.Service("checkout")
	for _, d := range []Decision{s.Decide("web"), s.DecideHTTP("web", "POST", "/v1/charges"), s.DecideGRPC("web", healthCheck)} {
		if !d.Drop || d.Rule().Procedure != "" {
			t.Errorf("decision %+v, want a drop under web's rule", d)
		}
	}
	if c := leafCounts(l, "checkout"); c["web/"].Offered != 3 || len(c) != 3 {
		t.Errorf("counts %v, want web's three in its one bucket", c)
	}
}

func TestMaxLeavesOverflow(t *testing.T) {
	// MaxLeaves, not MaxPeers, bounds the observed leaves of a service with
	// procedures; a new leaf beyond it is its procedure's _overflow leaf.
	l := NewLimiter(LimiterOptions{MaxPeers: 1, MaxLeaves: 3})
	l.SetPolicy(checkoutProcedures())
	s := l.Service("checkout")
	s.DecideHTTP("a", "POST", "/v1/charges")
	s.DecideHTTP("a", "GET", "/v1/items/1")
	s.DecideGRPC("b", healthCheck)
	s.DecideHTTP("b", "GET", "/v1/items/1") // full: (_overflow, get-item)
	s.DecideGRPC("c", healthCheck)          // (_overflow, Check)
	s.DecideHTTP("a", "POST", "/v1/charges")
	d := s.DecideHTTP("web", "POST", "/v1/charges") // limited: its own leaf
	if !d.Drop {
		t.Errorf("web's create-charge admitted after the table filled up")
	}
	c := leafCounts(l, "checkout")
	for leaf, want := range map[string]uint64{
		"a/create-charge": 2, "a/get-item": 1, "b/" + healthCheck: 1,
		"_overflow/get-item": 1, "_overflow/" + healthCheck: 1, "web/create-charge": 1,
	} {
		if c[leaf].Offered != want {
			t.Errorf("%s offered %d, want %d", leaf, c[leaf].Offered, want)
		}
	}
	if _, ok := c["b/get-item"]; ok {
		t.Errorf("b/get-item has counters beyond MaxLeaves")
	}
	if n := s.observedCount(); n != 3 {
		t.Errorf("%d observed leaves, want 3", n)
	}
}

func TestLimitedLeafPinnedAfterFlood(t *testing.T) {
	l := NewLimiter(LimiterOptions{MaxLeaves: 4})
	s := l.Service("checkout")
	l.SetPolicy(checkoutProcedures())
	for i := range 50 {
		s.DecideHTTP(fmt.Sprintf("flood-%d", i), "POST", "/v1/charges")
	}
	l.SetPolicy(checkoutProcedures(Rule{Peer: "late", Procedure: "get-item", DropRatio: math.Nextafter(1, 0), LimitRPS: 1}))
	if d := s.DecideHTTP("late", "GET", "/v1/items/9"); !d.Drop {
		t.Errorf("late's get-item, limited after a flood, was admitted: judged as %+v", d.Rule())
	}
	if d := s.DecideHTTP("late", "POST", "/v1/charges"); d.Drop {
		t.Errorf("late's create-charge, not limited, was dropped")
	}
	if c := leafCounts(l, "checkout"); c["late/get-item"].Offered != 1 || c["_overflow/create-charge"].Offered != 47 {
		t.Errorf("late/get-item %d, _overflow/create-charge %d; want 1 and 47", c["late/get-item"].Offered, c["_overflow/create-charge"].Offered)
	}
}

func TestEvictIdleLeavesAndIncarnations(t *testing.T) {
	const idle = 8 * time.Second
	l := NewLimiter(LimiterOptions{MaxLeaves: 2, PeerIdle: idle})
	l.SetPolicy(checkoutProcedures())
	s := l.Service("checkout")
	s.DecideHTTP("a", "GET", "/v1/items/1")
	s.DecideHTTP("a", "POST", "/v1/charges")
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	for d := time.Duration(0); d <= idle; d += ExpiryPeriod {
		s.DecideHTTP("a", "GET", "/v1/items/1") // a's get-item stays busy
		l.Expire(at(d))
	}
	first := l.AppendCounts("checkout", nil)
	c := leafCounts(l, "checkout")
	if _, ok := c["a/create-charge"]; ok {
		t.Fatalf("a/create-charge not evicted after %v idle", idle)
	}
	if _, ok := c["a/get-item"]; !ok {
		t.Fatalf("a/get-item evicted while busy")
	}
	if _, ok := c["web/create-charge"]; !ok {
		t.Fatalf("the limited leaf web/create-charge was evicted")
	}
	// The leaf comes back as a new incarnation, from zero; its sibling
	// keeps its own.
	s.DecideHTTP("a", "POST", "/v1/charges")
	inc := map[string]uint64{}
	for _, p := range first {
		inc[p.Peer+"/"+p.Procedure] = p.Incarnation
	}
	for _, p := range l.AppendCounts("checkout", nil) {
		switch p.Peer + "/" + p.Procedure {
		case "a/create-charge":
			if p.Offered != 1 || p.Incarnation == 0 {
				t.Errorf("a/create-charge back with %+v, want 1 offered under a new incarnation", p)
			}
		case "a/get-item":
			if p.Incarnation != inc["a/get-item"] {
				t.Errorf("a/get-item's incarnation changed with its sibling's eviction")
			}
		}
	}
}

func TestPolicySwapLeavesStaleLeavesToEviction(t *testing.T) {
	// Procedures that a new policy no longer declares leave their leaves
	// stale: reported as they were, no longer counted, evicted once idle,
	// the reserved ones included.
	const idle = 8 * time.Second
	l := NewLimiter(LimiterOptions{PeerIdle: idle})
	l.SetPolicy(checkoutProcedures())
	s := l.Service("checkout")
	s.DecideHTTP("a", "POST", "/v1/charges")
	tb := s.table.Load()
	checkLeaves(t, &tb.index, tb.leaves, tb.procs, "a", "b", "web", names.Unknown)
	l.SetPolicy(policy("checkout")) // no procedures any more
	tb = s.table.Load()
	checkLeaves(t, &tb.index, tb.leaves, tb.procs, "a", "b", "web", names.Unknown)
	if d := s.DecideHTTP("a", "POST", "/v1/charges"); d.Drop {
		t.Errorf("dropped without a rule")
	}
	c := leafCounts(l, "checkout")
	if c["a/create-charge"].Offered != 1 || c["a/"].Offered != 1 {
		t.Errorf("a/create-charge %d, a/ %d; want 1 and 1", c["a/create-charge"].Offered, c["a/"].Offered)
	}
	for d := time.Duration(0); d <= idle; d += ExpiryPeriod {
		s.Decide("a")
		l.Expire(t0.Add(d))
	}
	var got []string
	for _, p := range l.AppendCounts("checkout", nil) {
		got = append(got, p.Peer+"/"+p.Procedure)
	}
	if want := []string{"_overflow/", "a/", "unknown/"}; !slices.Equal(got, want) {
		t.Errorf("leaves after the stale ones went idle: %v, want %v", got, want)
	}
	if n := s.observedCount(); n != 1 {
		t.Errorf("%d observed leaves, want 1", n)
	}
}

func TestDecideProcedureAllocatesNothing(t *testing.T) {
	l := NewLimiter(LimiterOptions{MaxLeaves: 1})
	l.SetPolicy(checkoutProcedures())
	s := l.Service("checkout")
	s.DecideHTTP("observed", "GET", "/v1/items/1") // fills the table
	newNames := make([]string, 1000)
	for i := range newNames {
		newNames[i] = fmt.Sprintf("new-%d", i)
	}
	next := 0
	longMethod := "/" + strings.Repeat("x", 2*names.MaxProcedureLen)
	for _, tc := range []struct {
		name string
		f    func() Decision
		drop bool
	}{
		{"http leaf dropped", func() Decision { return s.DecideHTTP("web", "POST", "/v1/charges") }, true},
		{"http leaf admitted", func() Decision { return s.DecideHTTP("web", "GET", "/v1/items/123") }, false},
		{"http other", func() Decision { return s.DecideHTTP("web", "DELETE", "/nowhere") }, true},
		{"grpc leaf", func() Decision { return s.DecideGRPC("mobile", healthCheck) }, true},
		{"grpc undeclared", func() Decision { return s.DecideGRPC("mobile", healthWatch) }, false},
		{"grpc too long", func() Decision { return s.DecideGRPC("mobile", longMethod) }, false},
		{"overflow leaf", func() Decision { next++; return s.DecideHTTP(newNames[next%len(newNames)], "POST", "/v1/charges") }, false},
		{"unknown leaf", func() Decision { return s.DecideGRPC("", healthCheck) }, false},
		{"observed leaf", func() Decision { return s.DecideHTTP("observed", "GET", "/v1/items/1") }, false},
		{"Decide", func() Decision { return s.Decide("web") }, true},
	} {
		var last Decision
		if got := testing.AllocsPerRun(1000, func() { last = tc.f() }); got != 0 {
			t.Errorf("%s: %v allocations per decision", tc.name, got)
		}
		if last.Drop != tc.drop {
			t.Errorf("%s: Drop = %v, want %v", tc.name, last.Drop, tc.drop)
		}
	}
}

func TestMiddlewareDecidesByProcedure(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	l.SetPolicy(checkoutProcedures())
	s := l.Service("checkout")
	next := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })
	srv := httptest.NewServer(s.Middleware(next, HTTPOptions{RateLimitHeaders: DraftRateLimitHeaders}))
	defer srv.Close()
	for _, tc := range []struct {
		method, path       string
		status             int
		policy, rateLimit  string
		bodyPrefix, bucket string
	}{
		{"POST", "/v1/charges", http.StatusTooManyRequests, `"checkout/web/create-charge";q=50;w=1`, `"checkout/web/create-charge";r=0;t=53`,
			"request from caller web to procedure create-charge of service checkout was rate limited", "web/create-charge"},
		{"GET", "/v1/items/7?full=1", http.StatusOK, `"checkout/web/get-item";q=100;w=1`, `"checkout/web/get-item";r=90;t=1`, "ok", "web/get-item"},
		{"GET", "/elsewhere", http.StatusTooManyRequests, `"checkout/web/_other";q=0;w=1`, `"checkout/web/_other";r=0;t=60`,
			"request from caller web to procedure _other of service checkout", "web/_other"},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			req, err := http.NewRequestWithContext(ctx, tc.method, srv.URL+tc.path, nil)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set(DefaultCallerHeader, "web")
			before := leafCounts(l, "checkout")[tc.bucket].Offered
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.status || !strings.HasPrefix(string(body), tc.bodyPrefix) {
				t.Errorf("got %d %q, want %d %q...", resp.StatusCode, body, tc.status, tc.bodyPrefix)
			}
			if got := resp.Header.Get("RateLimit-Policy"); got != tc.policy {
				t.Errorf("RateLimit-Policy %q, want %q", got, tc.policy)
			}
			if got := resp.Header.Get("RateLimit"); got != tc.rateLimit {
				t.Errorf("RateLimit %q, want %q", got, tc.rateLimit)
			}
			if got := leafCounts(l, "checkout")[tc.bucket].Offered; got != before+1 {
				t.Errorf("%s offered %d, want %d", tc.bucket, got, before+1)
			}
		})
	}
}

func TestGRPCInterceptorsDecideByProcedure(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	l.SetPolicy(checkoutProcedures())
	s := l.Service("checkout")
	client := startHealthServer(t, s, GRPCOptions{RateLimitHeaders: DraftRateLimitHeaders})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, DefaultCallerHeader, "mobile")

	// Check is declared and mobile's is dropped; Watch is not: _other.
	var trailer metadata.MD
	_, err := client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
	if status.Code(err) != codes.ResourceExhausted ||
		!strings.Contains(status.Convert(err).Message(), "to procedure "+healthCheck+" of service checkout") {
		t.Errorf("Check: %v, want RESOURCE_EXHAUSTED naming the procedure", err)
	}
	if got, want := trailer.Get("ratelimit-policy"), `"checkout/mobile/`+healthCheck+`";q=5;w=1`; len(got) != 1 || got[0] != want {
		t.Errorf("ratelimit-policy trailer %q, want %q", got, want)
	}
	stream, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Errorf("Watch: %v, want admitted", err)
	}
	c := leafCounts(l, "checkout")
	if c["mobile/"+healthCheck].Dropped != 1 || c["mobile/_other"].Offered != 1 || c["mobile/_other"].Dropped != 0 {
		t.Errorf("mobile's Check %+v, _other %+v; want one drop and one admitted", c["mobile/"+healthCheck], c["mobile/_other"])
	}
}

func TestPolicyFromProtoProcedures(t *testing.T) {
	good := func() *sluicev1.DropPolicy {
		m := goodPolicy()
		m.Procedures = []string{"create-charge", "get-item", healthCheck}
		m.Routes = []*sluicev1.Route{
			{Pattern: "POST /v1/charges", Procedure: "create-charge"},
			{Pattern: "GET /v1/items/{id}", Procedure: "get-item"},
		}
		for _, pp := range m.Peers {
			pp.Procedure = names.Other
		}
		m.Peers = append(m.Peers,
			&sluicev1.PeerPolicy{Peer: "cart", Procedure: "create-charge", DropRatio: 0.5, Mode: sluicev1.Mode_MODE_ENFORCE, LimitRps: proto.Float64(5)},
			&sluicev1.PeerPolicy{Peer: "cart", Procedure: healthCheck, Mode: sluicev1.Mode_MODE_ENFORCE, LimitRps: proto.Float64(5)})
		return m
	}
	p, err := PolicyFromProto(good())
	if err != nil {
		t.Fatal(err)
	}
	if r := p.Leaf("cart", "create-charge"); r == nil || r.DropRatio != 0.5 {
		t.Errorf("Leaf(cart, create-charge) = %+v", r)
	}
	if p.Rule("cart") != nil {
		t.Errorf("Rule(cart) = %+v, want none: cart has no whole bucket", p.Rule("cart"))
	}
	back, err := PolicyFromProto(p.Proto())
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(back.Proto(), p.Proto()) {
		t.Errorf("round trip:\n got %v\nwant %v", back.Proto(), p.Proto())
	}

	tooMany := make([]string, routes.MaxRoutes+1)
	for i := range tooMany {
		tooMany[i] = fmt.Sprintf("p%d", i)
	}
	for _, tc := range []struct {
		name   string
		change func(m *sluicev1.DropPolicy)
		want   string
	}{
		{"outbound", func(m *sluicev1.DropPolicy) {
			m.Name, m.Direction = "caller/checkout", sluicev1.Direction_DIRECTION_OUTBOUND
		}, "procedures: set in an outbound policy"},
		{"bad procedure", func(m *sluicev1.DropPolicy) { m.Procedures[1] = "get item" }, "procedures[1]:"},
		{"_other declared", func(m *sluicev1.DropPolicy) { m.Procedures = append(m.Procedures, names.Other) }, "procedures[3]: \"_other\" is implicit"},
		{"procedure declared twice", func(m *sluicev1.DropPolicy) { m.Procedures = append(m.Procedures, "get-item") }, "procedures[3]: \"get-item\" is declared again"},
		{"too many procedures", func(m *sluicev1.DropPolicy) { m.Procedures = tooMany }, "procedures: 257 procedures"},
		{"route to an undeclared procedure", func(m *sluicev1.DropPolicy) { m.Routes[1].Procedure = "get-items" }, "routes[1].procedure: \"get-items\" is not declared"},
		{"shadowed route", func(m *sluicev1.DropPolicy) {
			m.Routes = append(m.Routes, &sluicev1.Route{Pattern: "POST /v1/charges", Procedure: "get-item"})
		}, "duplicate of route 0"},
		{"bad pattern", func(m *sluicev1.DropPolicy) { m.Routes[0].Pattern = "POST v1" }, "routes: route 0"},
		{"rule of an undeclared procedure", func(m *sluicev1.DropPolicy) { m.Peers[5].Procedure = "refund" }, "peers[5].procedure: \"refund\" is neither declared"},
		{"whole bucket with procedures", func(m *sluicev1.DropPolicy) { m.Peers[5].Procedure = "" }, "peers[5].procedure: \"\" is neither declared"},
		{"procedure without procedures", func(m *sluicev1.DropPolicy) {
			m.Procedures, m.Routes = nil, nil
		}, "peers[0].procedure: \"_other\" set, but the policy declares no procedures"},
		{"leaf listed twice", func(m *sluicev1.DropPolicy) {
			m.Peers = append(m.Peers, &sluicev1.PeerPolicy{Peer: "cart", Procedure: "create-charge"})
		}, "peers[6].peer: \"cart\" with procedure \"create-charge\" is listed again, first at peers[4]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := good()
			tc.change(m)
			_, err := PolicyFromProto(m)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("PolicyFromProto = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestProcedurePolicySwapConcurrentWithDecide: policies with the same
// procedures and different rules swapped under DecideHTTP and DecideGRPC
// (and a table filling up with new leaves): every decision is counted
// once, in some leaf, and follows one policy. (A policy that changes the
// procedures drops the leaves it makes stale and never counted, and a
// decision in flight on the old table may count in one of them unreported,
// as in an eviction; so the procedures stay the same here.)
func TestProcedurePolicySwapConcurrentWithDecide(t *testing.T) {
	policies := []*Policy{
		checkoutProcedures(),
		checkoutProcedures(Rule{Peer: "mobile", Procedure: "get-item", DropRatio: 0.5}),
	}
	policies[1].Peers = slices.DeleteFunc(policies[1].Peers, func(r Rule) bool { return r.Peer == "web" && r.Procedure == "create-charge" })
	l := NewLimiter(LimiterOptions{MaxLeaves: 6})
	s := l.Service("checkout")
	l.SetPolicy(policies[0])
	var calls, drops atomic.Uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	peers := []string{"web", "mobile", "", "new-1", "new-2", "new-3", "new-4"}
	for g := range 4 {
		wg.Go(func() {
			for i := g; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				var d Decision
				switch peer := peers[i%len(peers)]; i % 3 {
				case 0:
					d = s.DecideHTTP(peer, "POST", "/v1/charges")
				case 1:
					d = s.DecideHTTP(peer, "GET", "/v1/items/3")
				default:
					d = s.DecideGRPC(peer, healthCheck)
				}
				calls.Add(1)
				if d.Drop {
					drops.Add(1)
					if r := d.Rule(); r == nil || r.DropRatio == 0 {
						t.Errorf("drop under rule %+v", r)
						return
					}
				}
			}
		})
	}
	for n := 0; n < 500 || calls.Load() < 10_000; n++ {
		l.SetPolicy(policies[n%len(policies)])
	}
	close(stop)
	waitTimeout(t, &wg)
	var offered, dropped uint64
	for _, c := range l.AppendCounts("checkout", nil) {
		offered += c.Offered
		dropped += c.Dropped
	}
	if offered != calls.Load() || dropped != drops.Load() {
		t.Errorf("counted %d offered, %d dropped; decisions were %d, %d drops", offered, dropped, calls.Load(), drops.Load())
	}
}

// TestDecidedMarkIgnoredWithProcedures (issue 14): a caller enforcing
// outbound decides per callee, not per procedure, so a service that
// declares procedures ignores its decided mark even with TrustDecided, and
// decides and counts the request in its leaf, counting the mark
// (decided_ignored_total, reason procedures); before this, web's marked
// charges passed undecided and uncounted, and its create-charge leaf
// limit never held. Over HTTP and gRPC.
func TestDecidedMarkIgnoredWithProcedures(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	l.SetPolicy(checkoutProcedures())
	s := l.Service("checkout")
	h := s.Middleware(http.NotFoundHandler(), HTTPOptions{TrustDecided: true})
	for _, tc := range []struct{ method, path, leaf string }{
		{"POST", "/v1/charges", "web/create-charge"},
		{"GET", "/v1/items/7", "web/get-item"},
	} {
		before := leafCounts(l, "checkout")[tc.leaf]
		req := httptest.NewRequest(tc.method, tc.path, nil)
		req.Header.Set(DefaultCallerHeader, "web")
		req.Header.Set(DecidedHeader, "web")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		after := leafCounts(l, "checkout")[tc.leaf]
		if after.Offered != before.Offered+1 {
			t.Errorf("%s %s: %s offered %d, want %d: the marked request is counted in its leaf", tc.method, tc.path, tc.leaf, after.Offered, before.Offered+1)
		}
		if tc.leaf == "web/create-charge" && (w.Code != http.StatusTooManyRequests || after.Dropped != before.Dropped+1) {
			t.Errorf("marked charge: status %d, dropped %d; want 429 by its leaf's rule", w.Code, after.Dropped-before.Dropped)
		}
	}

	client := startHealthServer(t, s, GRPCOptions{TrustDecided: true})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ctx = metadata.AppendToOutgoingContext(ctx, DefaultCallerHeader, "mobile", DecidedHeader, "mobile")
	if _, err := client.Check(ctx, &healthpb.HealthCheckRequest{}); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("marked Check: %v, want RESOURCE_EXHAUSTED by its leaf's rule", err)
	}
	if c := leafCounts(l, "checkout")["mobile/"+healthCheck]; c.Offered != 1 || c.Dropped != 1 {
		t.Errorf("mobile's Check %+v, want one offered and dropped", c)
	}

	if up := s.DecidedUpstream(); up != 0 {
		t.Errorf("DecidedUpstream %d, want 0", up)
	}
	if n, untrusted := s.ident.decidedLeaf.Load(), s.ident.decidedIgnore.Load(); n != 3 || untrusted != 0 {
		t.Errorf("marks ignored for procedures %d, untrusted %d; want 3 and 0", n, untrusted)
	}

	// Without procedures the mark is honoured, as before.
	l.SetPolicy(policy("checkout", Rule{Peer: "web", DropRatio: math.Nextafter(1, 0)}))
	req := httptest.NewRequest("POST", "/v1/charges", nil)
	req.Header.Set(DefaultCallerHeader, "web")
	req.Header.Set(DecidedHeader, "web")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	if w.Code != http.StatusNotFound || s.DecidedUpstream() != 1 {
		t.Errorf("without procedures: status %d, DecidedUpstream %d; want the app's 404 and 1", w.Code, s.DecidedUpstream())
	}
}
