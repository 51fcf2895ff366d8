package sidecar

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/names"
)

// costPolicy is a policy of service "llm" counting cost: procedures
// /llm.Chat/Complete (static cost 10) and /llm.Chat/Embed (none), caller
// "chat" listed with max_concurrency cap (0: none), cost c.
func costPolicy(c *CostPolicy, cap uint32) *Policy {
	p := policy("llm", Rule{Peer: "chat", Procedure: "/llm.Chat/Complete", LimitRPS: 5000, AllowedRPS: math.Inf(1), MaxConcurrency: cap},
		Rule{Peer: "chat", Procedure: "/llm.Chat/Embed", LimitRPS: 5000, AllowedRPS: math.Inf(1), MaxConcurrency: cap})
	p.Procedures = []string{"/llm.Chat/Complete", "/llm.Chat/Embed"}
	p.Unit, p.Cost = UnitCost, c
	p.LiveInstances = 1
	return p
}

// costCounts returns the counts of (peer, procedure) of service llm.
func costCounts(t *testing.T, l *Limiter, peer, proc string) PeerCounts {
	t.Helper()
	for _, c := range l.AppendCounts("llm", nil) {
		if c.Peer == peer && c.Procedure == proc {
			return c
		}
	}
	t.Fatalf("no counts of %s %s", peer, proc)
	return PeerCounts{}
}

func TestCostPolicyRoundTrip(t *testing.T) {
	p := costPolicy(&CostPolicy{Default: 1, Procedures: []ProcedureCost{{"/llm.Chat/Complete", 10}}, RequestHeader: "x-cost", ResponseHeader: "x-sluice-cost", Max: 1e6}, 40)
	p.Peers[0].Debt = 12.5
	back, err := PolicyFromProto(p.Proto())
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(back.Proto(), p.Proto()) {
		t.Fatalf("round trip:\n got %v\nwant %v", back.Proto(), p.Proto())
	}
	if back.Unit != UnitCost || back.Cost.RequestHeader != "x-cost" || back.Peers[0].MaxConcurrency != 40 || back.Peers[0].Debt != 12.5 {
		t.Fatalf("lost fields: %+v %+v %+v", back.Unit, back.Cost, back.Peers[0])
	}
}

func TestCostPolicyFromProtoErrors(t *testing.T) {
	base := func() *sluicev1.DropPolicy {
		return costPolicy(&CostPolicy{Default: 1, Max: 10}, 0).Proto()
	}
	zero := uint32(0)
	for _, tc := range []struct {
		name  string
		edit  func(m *sluicev1.DropPolicy)
		field string
	}{
		{"cost without unit", func(m *sluicev1.DropPolicy) { m.Unit = sluicev1.Unit_UNIT_UNSPECIFIED }, "cost: set, but unit"},
		{"negative default", func(m *sluicev1.DropPolicy) { m.Cost.DefaultCost = -1 }, "cost.default_cost"},
		{"NaN default", func(m *sluicev1.DropPolicy) { m.Cost.DefaultCost = math.NaN() }, "cost.default_cost"},
		{"max 0", func(m *sluicev1.DropPolicy) { m.Cost.MaxCost = 0 }, "cost.max_cost"},
		{"max Inf", func(m *sluicev1.DropPolicy) { m.Cost.MaxCost = math.Inf(1) }, "cost.max_cost"},
		{"upper-case header", func(m *sluicev1.DropPolicy) { m.Cost.RequestHeader = "X-Cost" }, "cost.request_header"},
		{"bad response header", func(m *sluicev1.DropPolicy) { m.Cost.ResponseHeader = "a b" }, "cost.response_header"},
		{"undeclared procedure", func(m *sluicev1.DropPolicy) {
			m.Cost.Procedures = []*sluicev1.ProcedureCost{{Procedure: "/nope", Cost: 1}}
		}, "cost.procedures[0].procedure"},
		{"Inf procedure cost", func(m *sluicev1.DropPolicy) {
			m.Cost.Procedures = []*sluicev1.ProcedureCost{{Procedure: "/llm.Chat/Embed", Cost: math.Inf(1)}}
		}, "cost.procedures[0].cost"},
		{"cap 0", func(m *sluicev1.DropPolicy) { m.Peers[0].MaxConcurrency = &zero }, "peers[0].max_concurrency"},
		{"negative debt", func(m *sluicev1.DropPolicy) { m.Peers[1].Debt = -1 }, "peers[1].debt"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := base()
			tc.edit(m)
			_, err := PolicyFromProto(m)
			if err == nil || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("err %v, want one naming %q", err, tc.field)
			}
		})
	}
}

func TestParseCost(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want uint64
		st   costStatus
	}{
		{"12", 12000, costOK}, {"0.25", 250, costOK}, {" 3. ", 3000, costOK}, {".5", 500, costOK},
		{"0", 0, costOK}, {"1.0005", 1001, costOK}, {"1.0004", 1000, costOK},
		{"2000", 1000000, costClamped}, {"99999999999999999999999", 1000000, costClamped},
		{"", 0, costInvalid}, {".", 0, costInvalid}, {"-1", 0, costInvalid}, {"NaN", 0, costInvalid},
		{"Inf", 0, costInvalid}, {"1e3", 0, costInvalid}, {"1.2.3", 0, costInvalid}, {"1 2", 0, costInvalid},
	} {
		if got, st := parseCost(tc.in, 1000000); got != tc.want || st != tc.st {
			t.Errorf("parseCost(%q) = %d, %d; want %d, %d", tc.in, got, st, tc.want, tc.st)
		}
	}
}

func TestCostPricingPrecedence(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	l.SetPolicy(costPolicy(&CostPolicy{Default: 2, Procedures: []ProcedureCost{{"/llm.Chat/Complete", 10}}, RequestHeader: "x-cost", Max: 100}, 0))
	s := l.Service("llm")
	for _, tc := range []struct {
		method, header string
		want           float64
	}{
		{"/llm.Chat/Complete", "", 10}, // static
		{"/llm.Chat/Embed", "", 2},     // default
		{"/llm.Chat/Complete", "3.5", 3.5},
		{"/llm.Chat/Complete", "bad", 10}, // invalid: as if absent, never 0
		{"/llm.Chat/Embed", "-4", 2},
		{"/llm.Chat/Embed", "1000", 100}, // clamped
	} {
		if got := s.DecideGRPCCost("chat", tc.method, "", tc.header).Price(); got != tc.want {
			t.Errorf("%s with %q: price %v, want %v", tc.method, tc.header, got, tc.want)
		}
	}
	if n := s.costInvalid[costFromRequest].Load(); n != 2 {
		t.Errorf("invalid request costs %d, want 2", n)
	}
	if n := s.costClamped[costFromRequest].Load(); n != 1 {
		t.Errorf("clamped request costs %d, want 1", n)
	}
	c := costCounts(t, l, "chat", "/llm.Chat/Complete")
	if c.OfferedCost != 10000+3500+10000 || c.AdmittedCost != c.OfferedCost {
		t.Errorf("complete: offered cost %d admitted %d, want 23500 both", c.OfferedCost, c.AdmittedCost)
	}
}

func TestCostStaticCountsByMultiplying(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	p := costPolicy(&CostPolicy{Default: 2, Procedures: []ProcedureCost{{"/llm.Chat/Complete", 10}}, Max: 100}, 0)
	p.Peers[0].DropRatio = 0.5
	l.SetPolicy(p)
	s := l.Service("llm")
	for range 10 {
		s.DecideGRPC("chat", "/llm.Chat/Complete")
	}
	c := costCounts(t, l, "chat", "/llm.Chat/Complete")
	if c.OfferedCost != 100000 || c.AdmittedCost != (c.Offered-c.Dropped)*10000 || c.Dropped == 0 {
		t.Fatalf("counts %+v: want offered cost 100 units, admitted 10 per admitted request", c)
	}
	// A new price does not rewrite the past: the cumulative cost goes on
	// from where it was.
	p2 := costPolicy(&CostPolicy{Default: 2, Procedures: []ProcedureCost{{"/llm.Chat/Complete", 1}}, Max: 100}, 0)
	l.SetPolicy(p2)
	s.DecideGRPC("chat", "/llm.Chat/Complete")
	if c2 := costCounts(t, l, "chat", "/llm.Chat/Complete"); c2.OfferedCost != c.OfferedCost+1000 {
		t.Fatalf("after a price change: offered cost %d, want %d", c2.OfferedCost, c.OfferedCost+1000)
	}
}

// TestCostPackedCountsExactly: a request priced on its own is counted and
// priced in one packed word. However long nobody reads the counts (the
// request path folds its words itself), at the highest price a packed
// word takes, with a fractional one, and from several goroutines while
// another reads, every request and milli-unit is counted, the dropped
// ones' too; as it is for a max above a packed word's, which does not
// pack. A header price and a hits price count alike.
func TestCostPackedCountsExactly(t *testing.T) {
	for _, tc := range []struct {
		name   string
		max    float64
		header string
		price  uint64 // milli-units
		packs  bool
	}{
		{"packed, at the largest price", 4294967, "4294967", 4294967000, true},
		{"packed, fractional", 1e6, "12.345", 12345, true},
		{"not packed, max above a packed word's", 1e7, "9000000", 9e9, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := NewLimiter(LimiterOptions{})
			p := costPolicy(&CostPolicy{Default: 1, RequestHeader: "x-sluice-request-cost", Max: tc.max}, 0)
			for i := range p.Peers {
				p.Peers[i].DropRatio = 0.25
			}
			l.SetPolicy(p)
			s := l.Service("llm")
			if got := s.table.Load().cost.packs; got != tc.packs {
				t.Fatalf("packs = %v, want %v", got, tc.packs)
			}
			var offered, dropped atomic.Uint64
			decide := func(n int, hits bool) {
				for range n {
					var d Decision
					if hits {
						d = s.DecideHits("chat", "POST", "/llm.Chat/Embed", "", tc.price/1000)
					} else {
						d = s.DecideGRPCCost("chat", "/llm.Chat/Embed", "", tc.header)
					}
					if d.Price()*1000 != float64(tc.price) {
						t.Errorf("priced at %v, want %v milli-units", d.Price(), tc.price)
						return
					}
					offered.Add(1)
					if d.Drop {
						dropped.Add(1)
					}
				}
			}
			check := func(when string) {
				t.Helper()
				c := costCounts(t, l, "chat", "/llm.Chat/Embed")
				n, dr := offered.Load(), dropped.Load()
				if c.Offered != n || c.Dropped != dr || c.OfferedCost != n*tc.price || c.AdmittedCost != (n-dr)*tc.price {
					t.Fatalf("%s: counted %d offered, %d dropped, cost %d offered, %d admitted; want %d, %d, %d, %d",
						when, c.Offered, c.Dropped, c.OfferedCost, c.AdmittedCost, n, dr, n*tc.price, (n-dr)*tc.price)
				}
				if dr == 0 {
					t.Fatalf("%s: nothing dropped at a ratio of 0.25", when)
				}
			}
			// Unread for more than three times a word's count field, on
			// one goroutine (one stripe).
			decide(3<<packShift+123, false)
			check("read once, at the end")

			stop, read := make(chan struct{}), make(chan struct{})
			go func() {
				defer close(read)
				for {
					select {
					case <-stop:
						return
					default:
						l.AppendCounts("llm", nil)
					}
				}
			}()
			var wg sync.WaitGroup
			for w := range 4 {
				wg.Go(func() { decide(packFoldEvery+w*1000, w%2 == 1 && tc.price%1000 == 0) })
			}
			wg.Wait()
			close(stop)
			<-read
			check("four goroutines deciding, one reading")
		})
	}
}

// TestCostMeanClampedToAPackingMax: a leaf's running mean outlives its
// policy; a new policy whose max is lower, low enough to pack, prices the
// leaf's requests at that max, not at the old mean, which would overflow
// a packed word's price field (found by review: 2^48 milli-units lost
// in 40,000 requests).
func TestCostMeanClampedToAPackingMax(t *testing.T) {
	l := NewLimiter(LimiterOptions{OneStripe: true})
	l.SetPolicy(costPolicy(&CostPolicy{Default: 1e7, ResponseHeader: "x-sluice-cost", Max: 1e8}, 0))
	s := l.Service("llm")
	if s.table.Load().cost.packs {
		t.Fatal("a max of 1e8 units packs")
	}
	s.DecideGRPC("chat", "/llm.Chat/Embed").Done(0, false)
	l.SetPolicy(costPolicy(&CostPolicy{Default: 1, ResponseHeader: "x-sluice-cost", Max: 1000}, 0))
	if !s.table.Load().cost.packs {
		t.Fatal("a max of 1000 units does not pack")
	}
	before := costCounts(t, l, "chat", "/llm.Chat/Embed")
	const n = 40000
	for range n {
		if d := s.DecideGRPC("chat", "/llm.Chat/Embed"); d.Price() != 1000 {
			t.Fatalf("priced at %v, want the new max, 1000", d.Price())
		}
	}
	after := costCounts(t, l, "chat", "/llm.Chat/Embed")
	if got := after.OfferedCost - before.OfferedCost; got != n*1000*1000 {
		t.Errorf("offered cost grew by %d milli-units, want %d", got, n*1000*1000)
	}
	if got := after.Offered - before.Offered; got != n {
		t.Errorf("offered grew by %d, want %d", got, n)
	}
}

func TestCostResponseDoneAndMean(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	l.SetPolicy(costPolicy(&CostPolicy{Default: 4, ResponseHeader: "x-sluice-cost", Max: 100}, 0))
	s := l.Service("llm")
	d := s.DecideGRPC("chat", "/llm.Chat/Embed")
	if d.Price() != 4 || !d.pending() {
		t.Fatalf("price %v pending %v: want the default, 4, and a Done owed", d.Price(), d.pending())
	}
	c := costCounts(t, l, "chat", "/llm.Chat/Embed")
	if c.OfferedCost != 4000 || c.AdmittedCost != 0 {
		t.Fatalf("before Done: %+v, want offered cost 4, admitted 0", c)
	}
	d.Done(20, true)
	s.DecideGRPC("chat", "/llm.Chat/Embed").Done(math.NaN(), true) // invalid: its price counts
	s.DecideGRPC("chat", "/llm.Chat/Embed").Done(0, false)         // none: its price counts
	s.DecideGRPC("chat", "/llm.Chat/Embed").Done(500, true)        // clamped to 100
	c = costCounts(t, l, "chat", "/llm.Chat/Embed")
	if c.AdmittedCost != 20000+4000+4000+100000 || c.OfferedCost != 16000 {
		t.Fatalf("after Done: %+v, want admitted 128, offered 16", c)
	}
	if s.costInvalid[costFromResponse].Load() != 1 || s.costClamped[costFromResponse].Load() != 1 {
		t.Fatalf("response costs invalid %d clamped %d, want 1 each", s.costInvalid[costFromResponse].Load(), s.costClamped[costFromResponse].Load())
	}
	// The window's mean reported cost is (20+100)/2 = 60: the first
	// window that reports anything replaces the default outright, and
	// prices the next request.
	l.EndWindow("llm", time.Second)
	if got := s.DecideGRPC("chat", "/llm.Chat/Embed").Price(); math.Abs(got-60) > 1e-9 {
		t.Fatalf("price after a window %v, want 60", got)
	}
	// Then each window weighs by its responses, the older ones decayed by
	// costMeanDecay: two of 10 after the two of 60 give (d·120 + 20) / (d·2 + 2).
	s.DecideGRPC("chat", "/llm.Chat/Embed").Done(10, true)
	s.DecideGRPC("chat", "/llm.Chat/Embed").Done(10, true)
	l.EndWindow("llm", time.Second)
	if got, want := s.DecideGRPC("chat", "/llm.Chat/Embed").Price(), (costMeanDecay*120+20)/(costMeanDecay*2+2); math.Abs(got-want) > 1e-3 {
		t.Fatalf("price after two windows %v, want %v", got, want)
	}
	// A window without responses leaves it.
	l.EndWindow("llm", time.Second)
	if got, want := s.DecideGRPC("chat", "/llm.Chat/Embed").Price(), (costMeanDecay*120+20)/(costMeanDecay*2+2); math.Abs(got-want) > 1e-3 {
		t.Fatalf("price after a quiet window %v, want %v", got, want)
	}
	// Each leaf has its own mean: Complete reported nothing yet.
	if got := s.DecideGRPC("chat", "/llm.Chat/Complete").Price(); got != 4 {
		t.Fatalf("Complete priced %v, want its own mean, the default 4", got)
	}
}

func TestDoneNoOp(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	l.SetPolicy(costPolicy(&CostPolicy{Default: 1, Max: 10}, 0)) // static: nothing owed
	d := l.Service("llm").DecideGRPC("chat", "/llm.Chat/Embed")
	if d.pending() {
		t.Fatal("a statically priced, uncapped request owes a Done")
	}
	d.Done(5, true)
	if c := costCounts(t, l, "chat", "/llm.Chat/Embed"); c.AdmittedCost != 1000 {
		t.Fatalf("admitted cost %d after a no-op Done, want 1000", c.AdmittedCost)
	}
	Decision{}.Done(1, true) // the zero Decision, a drop's kind: nothing
}

func TestConcurrencyShare(t *testing.T) {
	for _, tc := range []struct {
		cap      uint32
		local    float64
		hasLocal bool
		global   float64
		live     int
		want     int64
	}{
		{40, 0, false, 0, 4, 10},      // no rates yet: cap / instances
		{40, 25, true, 100, 4, 10},    // a quarter of the load
		{40, 1, true, 100, 4, 1},      // 0.4: at least 1
		{10, 51, true, 100, 2, 5},     // 5.1 rounds down: with 4.9 → 4, the two hold 9 ≤ 10
		{10, 99.8, true, 200.9, 2, 5}, // 4.97: within a twentieth of a slot, 5 (two such hold 10, not 8)
		{10, 94, true, 200, 2, 4},     // 4.7: 4
		{40, 0, true, 100, 4, 1},      // at least 1
		{40, 500, true, 100, 4, 40},   // at most the cap
		{40, 5, true, 0, 3, 13},       // no global rate: cap / instances, rounded down
		{3, 0, false, 0, 0, 1},        // no live sidecar counted yet: 1
	} {
		if got := shareOf(tc.cap, tc.local, tc.hasLocal, tc.global, tc.live); got != tc.want {
			t.Errorf("shareOf(%+v) = %d, want %d", tc, got, tc.want)
		}
	}
}

// TestConcurrencyRefusalHTTP fills a capped leaf's share with requests a
// real loopback server's handler holds, and checks that the next is refused
// for concurrency, counted as dropped, and that completing one frees a
// slot.
func TestConcurrencyRefusalHTTP(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	p := costPolicy(&CostPolicy{Default: 1, Max: 10}, 4)
	p.Unit, p.Cost = UnitRequests, nil // a cap works for any unit
	p.LiveInstances = 2                // share: 4 / 2 = 2
	p.Routes = nil
	l.SetPolicy(p)
	s := l.Service("llm")
	entered, release := make(chan struct{}), make(chan struct{})
	h := s.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-release
	}), HTTPOptions{})
	srv := httptest.NewServer(h)
	defer srv.Close()
	get := func() (*http.Response, error) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/llm.Chat/Complete", nil)
		req.Header.Set(DefaultCallerHeader, "chat")
		return srv.Client().Do(req)
	}
	type result struct {
		res *http.Response
		err error
	}
	held := make(chan result, 2)
	for range 2 {
		go func() { res, err := get(); held <- result{res, err} }()
		waitFor(t, entered)
	}
	res, err := get()
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusTooManyRequests || res.Header.Get("Retry-After") != "1" {
		t.Fatalf("third request: %d Retry-After %q, want 429 and 1", res.StatusCode, res.Header.Get("Retry-After"))
	}
	if s.ConcurrencyDropped() != 1 {
		t.Fatalf("concurrency drops %d, want 1", s.ConcurrencyDropped())
	}
	c := costCounts(t, l, "chat", "/llm.Chat/Complete")
	if c.Offered != 3 || c.Dropped != 1 || c.InFlight != 2 {
		t.Fatalf("counts %+v, want 3 offered, 1 dropped, 2 in flight", c)
	}
	release <- struct{}{}
	if r := <-held; r.err != nil || r.res.StatusCode != http.StatusOK {
		t.Fatalf("held request: %v %v", r.res, r.err)
	}
	// Its slot is free once the middleware saw it complete.
	eventually(t, func() bool { return costCounts(t, l, "chat", "/llm.Chat/Complete").InFlight == 1 },
		func() string { return "the completed request's slot is not back" })
	go func() { res, err := get(); held <- result{res, err} }()
	waitFor(t, entered)
	close(release)
	for range 2 {
		if r := <-held; r.err != nil || r.res.StatusCode != http.StatusOK {
			t.Fatalf("request after a slot freed: %v %v", r.res, r.err)
		}
	}
	eventually(t, func() bool {
		c := costCounts(t, l, "chat", "/llm.Chat/Complete")
		return c.InFlight == 0 && c.Offered == 4
	},
		func() string {
			return fmt.Sprintf("counts %+v, want 4 offered, 0 in flight", costCounts(t, l, "chat", "/llm.Chat/Complete"))
		})
}

func waitFor(t *testing.T, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal("timed out waiting for the handler")
	}
}

// TestCostResponseHTTP checks the middleware reads the app's reported cost
// from its response header and from an undeclared trailer.
func TestCostResponseHTTP(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	l.SetPolicy(costPolicy(&CostPolicy{Default: 1, ResponseHeader: "x-sluice-cost", Max: 1000}, 0))
	s := l.Service("llm")
	h := s.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("trailer") != "" {
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush() // the wrappers of today still flush
			w.Header().Set(http.TrailerPrefix+"X-Sluice-Cost", "7")
			return
		}
		w.Header().Set("X-Sluice-Cost", "30")
	}), HTTPOptions{})
	srv := httptest.NewServer(h)
	defer srv.Close()
	for _, q := range []string{"", "?trailer=1"} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/llm.Chat/Embed"+q, nil)
		req.Header.Set(DefaultCallerHeader, "chat")
		res, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
	}
	// Done runs as the handler returns, which the client may beat.
	eventually(t, func() bool { return costCounts(t, l, "chat", "/llm.Chat/Embed").AdmittedCost == 37000 },
		func() string {
			return fmt.Sprintf("admitted cost %d, want 37 units", costCounts(t, l, "chat", "/llm.Chat/Embed").AdmittedCost)
		})
}

// trailerHealth reports a cost in its trailer: 7.5 per Check, 2 per Watch.
type trailerHealth struct {
	healthpb.UnimplementedHealthServer
}

func (trailerHealth) Check(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if err := grpc.SetTrailer(ctx, metadata.Pairs("x-sluice-cost", "7.5")); err != nil {
		return nil, err
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

func (trailerHealth) Watch(_ *healthpb.HealthCheckRequest, ss grpc.ServerStreamingServer[healthpb.HealthCheckResponse]) error {
	ss.SetTrailer(metadata.Pairs("x-sluice-cost", "2"))
	return ss.Send(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING})
}

// TestCostResponseGRPC runs a real loopback gRPC server whose handlers set
// their cost as trailer metadata, and checks the interceptors count it.
func TestCostResponseGRPC(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	p := costPolicy(&CostPolicy{Default: 1, ResponseHeader: "x-sluice-cost", Max: 1000}, 0)
	p.Procedures = []string{"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"}
	for i := range p.Peers {
		p.Peers[i].Procedure = p.Procedures[i]
	}
	l.SetPolicy(p)
	s := l.Service("llm")
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(s.UnaryServerInterceptor(GRPCOptions{})), grpc.StreamInterceptor(s.StreamServerInterceptor(GRPCOptions{})))
	healthpb.RegisterHealthServer(srv, trailerHealth{})
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(context.Background(), DefaultCallerHeader, "chat"), 10*time.Second)
	defer cancel()
	c := healthpb.NewHealthClient(conn)
	var tr metadata.MD
	if _, err := c.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Trailer(&tr)); err != nil {
		t.Fatal(err)
	}
	if got := tr.Get("x-sluice-cost"); len(got) != 1 || got[0] != "7.5" {
		t.Fatalf("client trailer %v: the app's trailer must still reach the client", tr)
	}
	st, err := c.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := st.Recv(); err != nil {
			break
		}
	}
	eventually(t, func() bool { return costCounts(t, l, "chat", "/grpc.health.v1.Health/Check").AdmittedCost == 7500 },
		func() string { return "Check admitted cost, want 7.5 units" })
	// The stream's Done runs as its handler returns, which the client's
	// last Recv may beat.
	eventually(t, func() bool { return costCounts(t, l, "chat", "/grpc.health.v1.Health/Watch").AdmittedCost == 2000 },
		func() string { return "Watch admitted cost, want 2 units" })
}

// eventually waits, bounded, for cond: for what a server does after its
// client has its answer.
func eventually(t *testing.T, cond func() bool, msg func() string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal(msg())
		}
		time.Sleep(time.Millisecond)
	}
}

// TestConcurrencyRefusalGRPC checks a call over its share fails with
// RESOURCE_EXHAUSTED, as the interceptors' other refusals.
func TestConcurrencyRefusalGRPC(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	p := costPolicy(&CostPolicy{Default: 1, Max: 10}, 1)
	l.SetPolicy(p)
	s := l.Service("llm")
	in := s.UnaryServerInterceptor(GRPCOptions{})
	ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs(DefaultCallerHeader, "chat"))
	info := &grpc.UnaryServerInfo{FullMethod: "/llm.Chat/Complete"}
	_, err := in(ctx, nil, info, func(ctx context.Context, req any) (any, error) {
		_, err := in(ctx, nil, info, func(context.Context, any) (any, error) { return nil, nil })
		return nil, err
	})
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(status.Convert(err).Message(), "concurrency") {
		t.Fatalf("nested call: %v, want RESOURCE_EXHAUSTED naming concurrency", err)
	}
	if c := costCounts(t, l, "chat", "/llm.Chat/Complete"); c.InFlight != 0 || c.Dropped != 1 {
		t.Fatalf("counts %+v, want every slot back and one drop", c)
	}
	// A panicking handler gives its slot back too.
	func() {
		defer func() { _ = recover() }()
		_, _ = in(ctx, nil, info, func(context.Context, any) (any, error) { panic(errors.New("boom")) })
	}()
	if c := costCounts(t, l, "chat", "/llm.Chat/Complete"); c.InFlight != 0 {
		t.Fatalf("in flight %d after a panic, want 0", c.InFlight)
	}
}

func TestCostThrottledHeaders(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	p := costPolicy(&CostPolicy{Default: 1, Procedures: []ProcedureCost{{"/llm.Chat/Complete", 10}}, RequestHeader: "x-cost", Max: 100}, 0)
	p.Peers[0].DropRatio = 0.99
	l.SetPolicy(p)
	h := l.Service("llm").Middleware(http.NotFoundHandler(), HTTPOptions{})
	for _, tc := range []struct{ header, want string }{{"", "10"}, {"3", "3"}} {
		var res *http.Response
		for range 5 { // the first is dropped at 0.99, but be sure
			req := httptest.NewRequest(http.MethodPost, "/llm.Chat/Complete", nil)
			req.Header.Set(DefaultCallerHeader, "chat")
			if tc.header != "" {
				req.Header.Set("x-cost", tc.header)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			if res = w.Result(); res.StatusCode == http.StatusTooManyRequests {
				break
			}
		}
		if res.StatusCode != http.StatusTooManyRequests {
			t.Fatal("never dropped")
		}
		if got := res.Header.Get("X-Sluice-Cost"); got != tc.want {
			t.Errorf("x-sluice-cost %q, want %q", got, tc.want)
		}
		if got := res.Header.Get("X-Sluice-Restore-Rate"); got != "5000" {
			t.Errorf("x-sluice-restore-rate %q, want 5000", got)
		}
		if got := res.Header.Get("RateLimit-Policy"); !strings.Contains(got, ";q=5000") {
			t.Errorf("RateLimit-Policy %q, want the quota in units", got)
		}
	}
}

func TestDecideDoneAllocatesNothing(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	l.SetPolicy(costPolicy(&CostPolicy{Default: 1, RequestHeader: "x-cost", ResponseHeader: "x-sluice-cost", Max: 100}, 1000))
	s := l.Service("llm")
	method := strings.Clone("/llm.Chat/Complete")
	s.DecideGRPCCost("chat", method, "", "2.5").Done(3, true)
	if n := testing.AllocsPerRun(1000, func() {
		d := s.DecideGRPCCost("chat", method, "", "2.5")
		d.Done(3, true)
		s.Decide(names.Unknown).Done(0, false)
	}); n != 0 {
		t.Fatalf("Decide + Done of a priced, capped request: %v allocs, want 0", n)
	}
	// Priced by its header alone: counted in a packed word, which the
	// request path folds every packFoldEvery requests.
	l.SetPolicy(costPolicy(&CostPolicy{Default: 1, RequestHeader: "x-cost", Max: 100}, 0))
	if n := testing.AllocsPerRun(2*packFoldEvery+1, func() {
		s.DecideGRPCCost("chat", method, "", "2.5").Done(0, false)
	}); n != 0 {
		t.Fatalf("Decide + Done of a request priced by its header: %v allocs, want 0", n)
	}
}
