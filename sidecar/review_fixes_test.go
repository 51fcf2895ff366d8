package sidecar

import (
	"math"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/criticality"
)

// A callee that counts cost or caps concurrency decides every request
// itself: a caller's "decided" mark can price nothing and hold no slot,
// so the sidecar does not trust it (TrustDecided or not).
func TestDecidedMarkDoesNotSkipCostOrCap(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	p := policy("llm", Rule{Peer: "chat", LimitRPS: math.Inf(1), AllowedRPS: math.Inf(1), MaxConcurrency: 1})
	p.Unit, p.Cost = UnitCost, &CostPolicy{Default: 7, Max: 100}
	p.LiveInstances = 1
	l.SetPolicy(p)
	s := l.Service("llm")
	entered, release := make(chan struct{}, 3), make(chan struct{})
	srv := httptest.NewServer(s.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		<-release
	}), HTTPOptions{TrustDecided: true}))
	defer srv.Close()
	get := func(codes chan<- int) {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/", nil)
		req.Header.Set(DefaultCallerHeader, "chat")
		req.Header.Set(DecidedHeader, "chat")
		res, err := srv.Client().Do(req)
		if err != nil {
			codes <- -1
			return
		}
		res.Body.Close()
		codes <- res.StatusCode
	}
	first, second := make(chan int, 1), make(chan int, 1)
	go get(first)
	waitFor(t, entered) // the first holds the one slot
	go get(second)
	if c := <-second; c != http.StatusTooManyRequests {
		t.Errorf("a second marked call while the first holds the cap of 1: %d, want 429", c)
	}
	close(release)
	if c := <-first; c != http.StatusOK {
		t.Errorf("the first call: %d, want 200", c)
	}
	if c := counts(l, "llm", "chat"); c.Offered != 2 || c.OfferedCost != 2*7000 {
		t.Errorf("counts %+v: want both calls counted and priced at 7", c)
	}
}

// A caller's cap holds across its tiers: they share one pool of slots.
func TestCapSharedByTiers(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	var rules []Rule
	for _, tier := range criticality.Tiers {
		rules = append(rules, Rule{Peer: "chat", Tier: tier, LimitRPS: math.Inf(1), AllowedRPS: math.Inf(1), MaxConcurrency: 2})
	}
	p := policy("llm", rules...)
	p.Criticality = &CriticalityPolicy{Header: criticality.DefaultHeader, Default: criticality.Critical, Max: criticality.CriticalPlus}
	p.LiveInstances = 1
	l.SetPolicy(p)
	s := l.Service("llm")
	var held []Decision
	for _, tier := range []string{"CRITICAL", "SHEDDABLE", "CRITICAL_PLUS", "SHEDDABLE_PLUS"} {
		if d := s.DecideHTTPCost("chat", "GET", "/", tier, ""); !d.Drop {
			held = append(held, d)
		}
	}
	if len(held) != 2 {
		t.Errorf("%d of four requests in four tiers admitted at once, want the cap of 2", len(held))
	}
	for _, d := range held {
		d.Done(0, false)
	}
	if d := s.DecideHTTPCost("chat", "GET", "/", "SHEDDABLE", ""); d.Drop {
		t.Error("a slot given back is not free again")
	} else {
		d.Done(0, false)
	}
}

// A caller's max bounds the defaults it gets, not only what it claims: a
// procedure defaulting above it does not lift a caller that sends no
// header.
func TestCallerMaxBoundsDefaults(t *testing.T) {
	p, err := PolicyFromProto(tieredPolicy())
	if err != nil {
		t.Fatal(err)
	}
	for i := range p.Criticality.Procedures {
		if p.Criticality.Procedures[i].Procedure == "get-charge" {
			p.Criticality.Procedures[i].Default = criticality.CriticalPlus
		}
	}
	for i := range p.Criticality.Callers {
		if p.Criticality.Callers[i].Caller == "batch" {
			p.Criticality.Callers[i].Max = criticality.SheddablePlus
		}
	}
	l := NewLimiter(LimiterOptions{})
	l.SetPolicy(p)
	s := l.Service("payments")
	before := s.critLowered.Load()
	s.DecideHTTPTier("batch", "GET", "/v1/charges/1", "")
	s.DecideHTTPTier("batch", "GET", "/v1/charges/1", "garbage")
	c := tierCounts(l, "payments")
	if n := c["batch/get-charge/CRITICAL_PLUS"].Offered; n != 0 {
		t.Errorf("batch (max SHEDDABLE_PLUS) got the procedure's default CRITICAL_PLUS %d times", n)
	}
	if n := c["batch/get-charge/SHEDDABLE_PLUS"].Offered; n != 2 {
		t.Errorf("batch's requests in its max SHEDDABLE_PLUS: %d, want 2 (counts %v)", n, c)
	}
	if s.critLowered.Load() != before {
		t.Error("a default bounded by the max counted as a lowered claim")
	}
}

// A sidecar's share of a cap is its part of the bucket's global rate, from
// a rate window of at least shareWindow and from the same window whether
// a window ends or a policy is installed: the window before the last.
// Found under load in TestConcurrencyAsProcesses, where two sidecars held
// 11 slots of a cap of 10: a surge report's tenth of a second of bunched
// requests, or a policy installed between windows taking the last one,
// gave a sidecar more than its part.
func TestConcurrencyShareWindows(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	p := policy("llm", Rule{Peer: "chat", LimitRPS: math.Inf(1), AllowedRPS: math.Inf(1), OfferedRPS: 200, MaxConcurrency: 10})
	p.LiveInstances = 2
	l.SetPolicy(p)
	s := l.Service("llm")
	send := func(n int) {
		for range n {
			if d := s.DecideHTTPCost("chat", "GET", "/", "", ""); !d.Drop {
				d.Done(0, false)
			}
		}
	}
	held := func() int { // the slots the sidecar lets chat hold now
		var ds []Decision
		for range 20 {
			if d := s.DecideHTTPCost("chat", "GET", "/", "", ""); !d.Drop {
				ds = append(ds, d)
			}
		}
		for _, d := range ds {
			d.Done(0, false)
		}
		return len(ds)
	}
	if got := held(); got != 5 {
		t.Fatalf("before any rate: %d slots, want the cap over 2 live sidecars, 5", got)
	}
	send(80)
	l.EndWindow("llm", time.Second) // 100 rps, with held's 20
	if got := held(); got != 5 {
		t.Fatalf("one window: %d slots, want 5 still (no window before the last yet)", got)
	}
	send(80)
	l.EndWindow("llm", time.Second) // 100 rps again: half of 200
	if got := held(); got != 5 {
		t.Fatalf("two windows of half the global rate: %d slots, want 5", got)
	}
	// A surge report cuts a tenth of a second holding 30 requests (300
	// rps): too short for a rate; and a policy installed now shares by
	// the same window as the last window's end did.
	send(10)
	l.EndWindow("llm", 100*time.Millisecond)
	l.SetPolicy(p)
	if got := held(); got != 5 {
		t.Fatalf("after a short window and a policy: %d slots, want 5", got)
	}
	// The short window's requests count in the next rate window: 30 +
	// 20 + 150 over 1.1 s, 182 rps. A rise is taken once the window
	// before the last and the one before it both show it (the policy may
	// be a window older on a busy machine), a fall once the window before
	// the last does.
	// Each window also counts the 20 requests of the check before it.
	steps := []struct {
		n    int
		want int
	}{
		{150, 5}, // 182 last; 100 and 100 before
		{160, 5}, // 182 before the last; 100 before it
		{160, 9}, // 180 and 182: 10 × 180/200
		{60, 9},  // 180 and 180
		{60, 4},  // 80 before the last
	}
	for i, st := range steps {
		send(st.n)
		l.EndWindow("llm", time.Second)
		l.SetPolicy(p)
		if got := held(); got != st.want {
			t.Fatalf("window %d (%d requests): %d slots, want %d", i, st.n, got, st.want)
		}
	}
}
