package sidecar

import (
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/pkg/routes"
)

// BenchmarkDecide measures the hot path. The goal (a sidecar adds no
// noticeable latency) is ≤ 15 ns/op and 0 allocs/op; run with
// -cpu 1,2 to see contention on a shared peer.
func BenchmarkDecide(b *testing.B) {
	newLimiter := func() (*Limiter, *ServiceLimiter) {
		l := NewLimiter(LimiterOptions{})
		rules := []Rule{{Peer: "caller-a", DropRatio: 0.01}, {Peer: "caller-drop", DropRatio: 0.5}}
		for i := range 64 {
			rules = append(rules, Rule{Peer: fmt.Sprintf("caller-%02d", i), DropRatio: 0.01})
		}
		l.SetPolicy(policy("checkout", rules...))
		return l, l.Service("checkout")
	}
	b.Run("bound-serial", func(b *testing.B) {
		_, s := newLimiter()
		b.ReportAllocs()
		for b.Loop() {
			s.Decide("caller-a")
		}
	})
	b.Run("limiter-serial", func(b *testing.B) {
		l, _ := newLimiter()
		b.ReportAllocs()
		for b.Loop() {
			l.Decide("checkout", "caller-a")
		}
	})
	b.Run("parallel-same-peer", func(b *testing.B) {
		_, s := newLimiter()
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				s.Decide("caller-a")
			}
		})
	})
	b.Run("parallel-many-peers", func(b *testing.B) {
		_, s := newLimiter()
		peers := make([]string, 64)
		for i := range peers {
			peers[i] = fmt.Sprintf("caller-%02d", i)
		}
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := rand.IntN(len(peers))
			for pb.Next() {
				s.Decide(peers[i%len(peers)])
				i++
			}
		})
	})
	b.Run("drop-p0.5", func(b *testing.B) {
		_, s := newLimiter()
		b.ReportAllocs()
		for b.Loop() {
			s.Decide("caller-drop")
		}
	})
	// The fail modes of an expired policy (failmode.go). caller-a's
	// bucket holds 10^10 tokens, so local-admit never runs dry.
	expired := func(mode dataplane.FailMode, rules ...Rule) *ServiceLimiter {
		l := NewLimiter(LimiterOptions{})
		p := policy("checkout", rules...)
		p.FailMode, p.TTL, p.FailOpenDecay, p.LiveInstances = mode, time.Second, time.Second, 1
		now := time.Now()
		l.SetPolicyAt(p, now)
		l.Expire(now.Add(p.TTL + p.FailOpenDecay/2))
		return l.Service("checkout")
	}
	b.Run("local-admit", func(b *testing.B) {
		s := expired(dataplane.FailLocal, Rule{Peer: "caller-a", DropRatio: 0.01, LimitRPS: 1e11})
		b.ReportAllocs()
		for b.Loop() {
			s.Decide("caller-a")
		}
	})
	b.Run("local-drop", func(b *testing.B) {
		s := expired(dataplane.FailLocal, Rule{Peer: "caller-a", DropRatio: 0.5, LimitRPS: 0})
		b.ReportAllocs()
		for b.Loop() {
			s.Decide("caller-a")
		}
	})
	b.Run("local-parallel-same-peer", func(b *testing.B) {
		s := expired(dataplane.FailLocal, Rule{Peer: "caller-a", DropRatio: 0.01, LimitRPS: 1e11})
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				s.Decide("caller-a")
			}
		})
	})
	b.Run("open-p0.5-half-decayed", func(b *testing.B) {
		s := expired(dataplane.FailOpen, Rule{Peer: "caller-drop", DropRatio: 0.5})
		b.ReportAllocs()
		for b.Loop() {
			s.Decide("caller-drop")
		}
	})
	b.Run("random-drop-p0.5", func(b *testing.B) {
		l := NewLimiter(LimiterOptions{Strategy: Random})
		l.SetPolicy(policy("checkout", Rule{Peer: "caller-drop", DropRatio: 0.5}))
		s := l.Service("checkout")
		b.ReportAllocs()
		for b.Loop() {
			s.Decide("caller-drop")
		}
	})
}

// BenchmarkMiddlewareDecide is the sidecar binary's request path without
// the app: decide, then write the 429, or set the admitted response's
// rate-limit headers and call a handler that does nothing. Every form
// assigns values rendered when the policy was installed: 0 allocs/op.
func BenchmarkMiddlewareDecide(b *testing.B) {
	l := NewLimiter(LimiterOptions{})
	l.SetPolicy(policy("checkout",
		Rule{Peer: "steady", LimitRPS: 100, AllowedRPS: 100, OfferedRPS: 40},
		Rule{Peer: "blocked", DropRatio: math.Nextafter(1, 0), LimitRPS: 0, AllowedRPS: 0},
	))
	s := l.Service("checkout")
	next := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	for _, bc := range []struct {
		name, caller string
		form         RateLimitHeaders
	}{
		{"admit", "steady", NoRateLimitHeaders},
		{"admit-draft", "steady", DraftRateLimitHeaders},
		{"admit-x-ratelimit", "steady", XRateLimitHeaders},
		{"drop", "blocked", NoRateLimitHeaders},
		{"drop-x-ratelimit", "blocked", XRateLimitHeaders},
		// A unary gRPC call as the sidecar's proxy gets it: its outcome is
		// read from the grpc-status the app answered with.
		{"admit-grpc", "steady", NoRateLimitHeaders},
	} {
		b.Run(bc.name, func(b *testing.B) {
			h := s.Middleware(next, HTTPOptions{RateLimitHeaders: bc.form})
			req := httptest.NewRequest(http.MethodGet, "/", nil)
			req.Header.Set(DefaultCallerHeader, bc.caller)
			w := &discardWriter{h: http.Header{}}
			if bc.name == "admit-grpc" {
				req = httptest.NewRequest(http.MethodPost, "/grpc.health.v1.Health/Check", nil)
				req.ProtoMajor, req.ProtoMinor, req.Proto = 2, 0, "HTTP/2.0"
				req.Header.Set("Content-Type", "application/grpc")
				req.Header.Set(DefaultCallerHeader, bc.caller)
				w.h["Grpc-Status"] = []string{"0"}
			}
			b.ReportAllocs()
			for b.Loop() {
				h.ServeHTTP(w, req)
			}
		})
	}
}

// BenchmarkSetPolicy installs a policy of 64 limited callers, half of them
// dropped: what a sidecar pays about once a second, rendering every
// rejection and every admitted response's headers.
func BenchmarkSetPolicy(b *testing.B) {
	var rules []Rule
	for i := range 64 {
		rules = append(rules, Rule{Peer: fmt.Sprintf("caller-%02d", i), DropRatio: float64(i%2) * 0.9,
			LimitRPS: 100, AllowedRPS: 100, OfferedRPS: 50 + float64(i%2)*950})
	}
	p := policy("checkout", rules...)
	l := NewLimiter(LimiterOptions{})
	b.ReportAllocs()
	for b.Loop() {
		l.SetPolicy(p)
	}
}

// procedurePolicy is a policy of checkout with procedures: nGRPC gRPC
// methods "/shop.Checkout/Method<i>", and the HTTP routes of an API of
// nRoutes routes (realistic templates, several per resource), each its own
// procedure, and caller-a limited in every leaf.
func procedurePolicy(nGRPC, nRoutes int) *Policy {
	p := policy("checkout")
	for i := range nGRPC {
		p.Procedures = append(p.Procedures, fmt.Sprintf("/shop.Checkout/Method%d", i))
	}
	resources := []string{"items", "orders", "carts", "users", "charges", "refunds", "invoices", "shipments", "coupons", "reviews"}
	for i := range nRoutes {
		res := resources[i/5%len(resources)]
		v := fmt.Sprintf("v%d", i/(5*len(resources))+1)
		pattern := [...]string{
			"GET /" + v + "/" + res,
			"POST /" + v + "/" + res,
			"GET /" + v + "/" + res + "/{id}",
			"PUT /" + v + "/" + res + "/{id}",
			"DELETE /" + v + "/" + res + "/{id}",
		}[i%5]
		proc := fmt.Sprintf("route-%02d", i)
		p.Procedures = append(p.Procedures, proc)
		p.Routes = append(p.Routes, routes.Route{Pattern: pattern, Procedure: proc})
	}
	for _, q := range append([]string{names.Other}, p.Procedures...) {
		p.Peers = append(p.Peers, Rule{Peer: "caller-a", Procedure: q, DropRatio: 0.01})
	}
	slices.SortFunc(p.Peers, func(a, b Rule) int { return cmpRule(a.Peer, a.Procedure, a.Tier, leaf{b.Peer, b.Procedure, b.Tier}) })
	return p
}

// BenchmarkDecideProcedure measures Decide for a callee with procedures:
// finding the request's procedure, then its leaf. grpc: a declared full
// method of ten; http50: a path matched by the 48th of 50 routes. The goal
// is ≤ 30 ns/op and 0 allocs/op.
func BenchmarkDecideProcedure(b *testing.B) {
	b.Run("grpc", func(b *testing.B) {
		l := NewLimiter(LimiterOptions{})
		l.SetPolicy(procedurePolicy(10, 0))
		s := l.Service("checkout")
		method := strings.Clone("/shop.Checkout/Method7")
		if d := s.DecideGRPC("caller-a", method); d.Rule() == nil || d.Rule().Procedure != method {
			b.Fatalf("decided under %+v, want the rule of %s", d.Rule(), method)
		}
		b.ReportAllocs()
		for b.Loop() {
			s.DecideGRPC("caller-a", method)
		}
	})
	b.Run("http50", func(b *testing.B) {
		l := NewLimiter(LimiterOptions{})
		l.SetPolicy(procedurePolicy(0, 50))
		s := l.Service("checkout")
		// Route 47 of 50: "GET /v1/reviews/{id}".
		p := l.Policy("checkout")
		want := p.Routes[47]
		path := strings.Replace(strings.Fields(want.Pattern)[1], "{id}", "8d3f2a", 1)
		method := strings.Fields(want.Pattern)[0]
		if d := s.DecideHTTP("caller-a", method, path); d.Rule() == nil || d.Rule().Procedure != want.Procedure {
			b.Fatalf("%s %s decided under %+v, want the rule of %s", method, path, d.Rule(), want.Procedure)
		}
		b.ReportAllocs()
		for b.Loop() {
			s.DecideHTTP("caller-a", method, path)
		}
	})
}

// BenchmarkDecideDescriptor measures a descriptor's decision (issue #15's
// goal: ≤ 60 ns/op, 0 allocs/op) on a sketch that has already counted a
// million distinct values in its window, under a policy that lists 1,024
// values, the controller's default bound:
//   - listed: a listed heavy value at ratio 0.5 (half the calls count a
//     drop too);
//   - unlisted: one unlisted value far over its allowance (the local
//     rule's coin and a drop on almost every call);
//   - unlisted-1M: unlisted values taken in turn from the million, the
//     sketch rotated after each pass as the reporter rotates it after each
//     window: a window of a million distinct values. Their bytes come from
//     memory, and every decision misses the caches more than a real
//     request's, whose value was just parsed, would.
//
// The policy is a single sidecar's (LiveInstances 1): its allowance, 62
// requests a window at 50 rps, is above what the sketch over-counts a
// light value by with a million values in one window (at most its line's
// Adds / 8: about 15 by the window's end with the default 2¹⁶ slots). With
// the 300 sidecars the allowance is 1,
// and every value of such a window would be dropped as over-counted: a
// sketch too small for its window (docs/benchmarks.md), whose drop path
// the unlisted case measures.
func BenchmarkDecideDescriptor(b *testing.B) {
	const distinct = 1_000_000
	values := make([]string, distinct)
	for i := range values {
		values[i] = fmt.Sprintf("tenant-%07d", i)
	}
	listed := make([]ValueRule, 0, 1024)
	for i := range cap(listed) {
		listed = append(listed, ValueRule{Value: fmt.Sprintf("listed-%04d", i), DropRatio: 0.5, LimitRPS: 50, OfferedRPS: 100})
	}
	l := NewLimiter(LimiterOptions{})
	p := tenantPolicy(func(d *DescriptorPolicy) {
		d.LimitRPS, d.MissingLimitRPS = 50, 50
		d.Values = listed
	})
	l.SetPolicy(p)
	s := l.Service("api")
	for _, v := range values {
		s.DecideDescriptor(0, v)
	}
	sk := s.descStates["tenant"].sk
	runtime.GC() // the setup's garbage, collected now rather than during the first case
	for _, c := range []struct {
		name   string
		values []string
	}{
		{"listed", []string{"listed-0042"}},
		{"unlisted", []string{"tenant-0000042"}},
		{"unlisted-1M", values},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				s.DecideDescriptor(0, c.values[i])
				if i++; i == len(c.values) {
					i = 0
					if len(c.values) > 1 { // a window of them
						b.StopTimer()
						sk.Rotate()
						b.StartTimer()
					}
				}
			}
		})
	}
}

// BenchmarkDecideCost measures Decide for a callee counting cost (issue
// #16) against its twin, the same call to a declared procedure of an
// untiered, unpriced policy: the goal is ≤ the twin + 2 ns/op and 0
// allocs/op.
//   - static: the procedure has a static cost, so a request adds nothing
//     to count (AppendCounts multiplies the leaf's counts by it); its twin
//     is BenchmarkDecideProcedure/grpc;
//   - header: the callee trusts a request header: each request parses its
//     value ("12.5") and is counted and priced in one add (a packed word);
//     same twin;
//   - hits: a cost already a number (Envoy's hits_addend, through
//     DecideHits), counted as header's, for a callee without procedures
//     (a route match would add its noise to both); its twin is
//     hits-twin, DecideHits for the same callee counting requests.
func BenchmarkDecideCost(b *testing.B) {
	run := func(b *testing.B, c *CostPolicy, header string) {
		l := NewLimiter(LimiterOptions{})
		p := procedurePolicy(10, 0)
		p.Unit, p.Cost = UnitCost, c
		l.SetPolicy(p)
		s := l.Service("checkout")
		method := strings.Clone("/shop.Checkout/Method7")
		if d := s.DecideGRPCCost("caller-a", method, "", header); d.Rule() == nil || d.Rule().Procedure != method || d.Price() == 0 {
			b.Fatalf("decided under %+v at %v, want the rule of %s and a price", d.Rule(), d.Price(), method)
		}
		b.ReportAllocs()
		for b.Loop() {
			s.DecideGRPCCost("caller-a", method, "", header)
		}
	}
	b.Run("static", func(b *testing.B) {
		run(b, &CostPolicy{Default: 1, Procedures: []ProcedureCost{{"/shop.Checkout/Method7", 10}}, Max: 1e6}, "")
	})
	b.Run("header", func(b *testing.B) {
		run(b, &CostPolicy{Default: 1, RequestHeader: "x-sluice-request-cost", Max: 1e6}, "12.5")
	})
	hits := func(b *testing.B, c *CostPolicy, hits uint64) {
		l := NewLimiter(LimiterOptions{})
		p := policy("checkout", Rule{Peer: "caller-a", DropRatio: 0.01})
		if c != nil {
			p.Unit, p.Cost = UnitCost, c
		}
		l.SetPolicy(p)
		s := l.Service("checkout")
		if d := s.DecideHits("caller-a", "GET", "/v1/items/8d3f2a", "", hits); d.Rule() == nil || (c != nil) != (d.Price() > 0) {
			b.Fatalf("decided under %+v at %v, want caller-a's rule, priced: %v", d.Rule(), d.Price(), c != nil)
		}
		b.ReportAllocs()
		for b.Loop() {
			s.DecideHits("caller-a", "GET", "/v1/items/8d3f2a", "", hits)
		}
	}
	b.Run("hits", func(b *testing.B) {
		hits(b, &CostPolicy{Default: 1, RequestHeader: "x-sluice-request-cost", Max: 1e6}, 12)
	})
	b.Run("hits-twin", func(b *testing.B) { hits(b, nil, 12) })
}
