package sidecar

import (
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/quick"
	"time"

	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/names"
)

// policy builds a valid inbound policy for service from rules.
// unlimited is a rule for peer that neither drops nor announces anything:
// observed only (a Rule's zero LimitRPS is a limit, 0 rps).
func unlimited(peer string) Rule {
	return Rule{Peer: peer, LimitRPS: math.Inf(1), AllowedRPS: math.Inf(1)}
}

func policy(service string, rules ...Rule) *Policy {
	slices.SortFunc(rules, func(a, b Rule) int { return strings.Compare(a.Peer, b.Peer) })
	return &Policy{Name: names.Callee(service), Service: service, Direction: Inbound, Peers: rules}
}

// counts returns service's counters of peer, without their incarnation;
// zero if it has none.
func counts(l *Limiter, service, peer string) PeerCounts {
	for _, c := range l.AppendCounts(service, nil) {
		if c.Peer == peer {
			c.Incarnation = 0
			return c
		}
	}
	return PeerCounts{Peer: peer}
}

// waitTimeout waits for wg, failing the test after a generous timeout.
func waitTimeout(t *testing.T, wg *sync.WaitGroup) {
	t.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("timed out waiting for goroutines")
	}
}

func TestDecideWithoutPolicyAdmitsAndCounts(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	for range 10 {
		if d := l.Decide("checkout", "cart"); d.Drop || d.Shadow || d.Rule() != nil {
			t.Fatalf("Decide = %+v, want a plain admit", d)
		}
	}
	if got, want := counts(l, "checkout", "cart"), (PeerCounts{Peer: "cart", Offered: 10}); got != want {
		t.Errorf("counts = %+v, want %+v", got, want)
	}
	if l.Policy("checkout") != nil || l.Policy("nothing") != nil {
		t.Error("Policy is not nil without SetPolicy")
	}
}

func TestDecideUnlistedPeerAdmitted(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	p := policy("checkout", Rule{Peer: "greedy", DropRatio: 0.9})
	l.SetPolicy(p)
	if l.Policy("checkout") != p {
		t.Fatal("Policy does not return the policy set")
	}
	s := l.Service("checkout")
	for range 1000 {
		if d := s.Decide("polite"); d.Drop || d.Shadow || d.Rule() != nil {
			t.Fatalf("unlisted peer: Decide = %+v", d)
		}
	}
	if d := s.Decide("greedy"); d.Rule() != &p.Peers[0] {
		t.Errorf("listed peer: Rule() = %p, want %p", d.Rule(), &p.Peers[0])
	}
}

func TestDiffuseIsExact(t *testing.T) {
	for _, ratio := range []float64{0, 0.001, 0.1, 0.5, 0.8, 0.99} {
		l := NewLimiter(LimiterOptions{Strategy: Diffuse})
		l.SetPolicy(policy("checkout", Rule{Peer: "greedy", DropRatio: ratio}))
		s := l.Service("checkout")
		const n = 1000
		drops := 0
		for range n {
			d := s.Decide("greedy")
			if d.Shadow {
				t.Fatal("enforced rule gave a shadow decision")
			}
			if d.Drop {
				drops++
			}
		}
		// Each stripe rounds k·p, off by at most one half.
		want := ratio * n
		if math.Abs(float64(drops)-want) > nStripes/2 {
			t.Errorf("ratio %v: %d of %d dropped, want %v ± %d", ratio, drops, n, want, nStripes/2)
		}
		if c := counts(l, "checkout", "greedy"); c != (PeerCounts{Peer: "greedy", Offered: n, Dropped: uint64(drops)}) {
			t.Errorf("ratio %v: counts %+v, %d drops seen", ratio, c, drops)
		}
	}
}

func TestDiffuseIsExactConcurrently(t *testing.T) {
	// Goroutines share stripes or not (see stackStripe); either way each
	// stripe is its own sequence, so the bound of TestDiffuseIsExact holds.
	const (
		goroutines = 8
		each       = 1000
		ratio      = 0.3
	)
	l := NewLimiter(LimiterOptions{Strategy: Diffuse})
	l.SetPolicy(policy("checkout", Rule{Peer: "greedy", DropRatio: ratio}))
	s := l.Service("checkout")
	var drops atomic.Uint64
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for range each {
				if s.Decide("greedy").Drop {
					drops.Add(1)
				}
			}
		})
	}
	waitTimeout(t, &wg)
	const n = goroutines * each
	if got, want := float64(drops.Load()), ratio*n; math.Abs(got-want) > nStripes/2 {
		t.Errorf("%v of %d dropped, want %v ± %d", got, n, want, nStripes/2)
	}
	if c := counts(l, "checkout", "greedy"); c != (PeerCounts{Peer: "greedy", Offered: n, Dropped: drops.Load()}) {
		t.Errorf("counts %+v, %d drops seen", c, drops.Load())
	}
}

func TestStackStripeSpreadsGoroutines(t *testing.T) {
	// Goroutines alive at the same time have their own stacks and should
	// spread over the stripes like random choices: 64 of them all landing
	// on at most half the stripes would take a broken hash (or odds of
	// under 2^-57).
	const goroutines = 64
	var used [nStripes]atomic.Bool
	var started, wg sync.WaitGroup
	release := make(chan struct{})
	started.Add(goroutines)
	for range goroutines {
		wg.Go(func() {
			used[stackStripe()].Store(true)
			started.Done()
			<-release // stay alive, keeping this stack, until all have run
		})
	}
	waitTimeout(t, &started)
	close(release)
	waitTimeout(t, &wg)
	n := 0
	for i := range used {
		if used[i].Load() {
			n++
		}
	}
	if n <= nStripes/2 {
		t.Errorf("%d goroutines used %d of %d stripes", goroutines, n, nStripes)
	}
}

func TestDiffuseDropsFirstRequestAtHighRatio(t *testing.T) {
	// The accumulator starts at one half, so a high ratio bites at once;
	// the HTTP and gRPC tests rely on it.
	l := NewLimiter(LimiterOptions{})
	l.SetPolicy(policy("checkout", Rule{Peer: "greedy", DropRatio: 0.99}))
	for i := range 40 {
		if !l.Decide("checkout", "greedy").Drop {
			t.Fatalf("request %d admitted at ratio 0.99", i)
		}
	}
}

func TestRandomWithinBinomialBound(t *testing.T) {
	const (
		n = 100_000
		p = 0.3
	)
	l := NewLimiter(LimiterOptions{Strategy: Random})
	l.SetPolicy(policy("checkout", Rule{Peer: "greedy", DropRatio: p}))
	s := l.Service("checkout")
	drops := 0
	for range n {
		if s.Decide("greedy").Drop {
			drops++
		}
	}
	mean, sigma := n*p, math.Sqrt(n*p*(1-p))
	if math.Abs(float64(drops)-mean) > 5*sigma {
		t.Errorf("%d of %d dropped, want %v ± %.0f (5σ)", drops, n, mean, 5*sigma)
	}
	if c := counts(l, "checkout", "greedy"); c.Offered != n || c.Dropped != uint64(drops) {
		t.Errorf("counts %+v, %d drops seen", c, drops)
	}
}

func TestShadowCountsAndAdmits(t *testing.T) {
	for _, strategy := range []Strategy{Diffuse, Random} {
		l := NewLimiter(LimiterOptions{Strategy: strategy})
		l.SetPolicy(policy("checkout", Rule{Peer: "greedy", DropRatio: 0.5, Mode: dropratio.Shadow}))
		const n = 10_000
		shadows := 0
		for range n {
			d := l.Decide("checkout", "greedy")
			if d.Drop {
				t.Fatalf("%v: shadow rule dropped a request", strategy)
			}
			if d.Shadow {
				shadows++
			}
		}
		if shadows < n/4 || shadows > 3*n/4 {
			t.Errorf("%v: %d shadow drops of %d at ratio 0.5", strategy, shadows, n)
		}
		if c := counts(l, "checkout", "greedy"); c != (PeerCounts{Peer: "greedy", Offered: n, ShadowDropped: uint64(shadows)}) {
			t.Errorf("%v: counts %+v, %d shadow drops seen", strategy, c, shadows)
		}
	}
}

func TestSetPolicyClampsHandBuiltRatios(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	l.SetPolicy(policy("checkout",
		Rule{Peer: "above", DropRatio: 1.5},
		Rule{Peer: "nan", DropRatio: math.NaN()},
		Rule{Peer: "negative", DropRatio: -1},
		Rule{Peer: "bad name", DropRatio: 0.9}, // never matches: Decide maps it to unknown
	))
	for range 100 {
		if !l.Decide("checkout", "above").Drop {
			t.Fatal("ratio 1.5 admitted a request")
		}
		for _, peer := range []string{"nan", "negative", "bad name"} {
			if l.Decide("checkout", peer).Drop {
				t.Fatalf("peer %q dropped", peer)
			}
		}
	}
}

func TestRemovePolicy(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	l.SetPolicy(policy("checkout", Rule{Peer: "greedy", DropRatio: 0.99}))
	l.Decide("checkout", "greedy")
	l.RemovePolicy("checkout")
	l.RemovePolicy("never-seen")
	if l.Policy("checkout") != nil {
		t.Error("policy still set")
	}
	for range 100 {
		if d := l.Decide("checkout", "greedy"); d.Drop || d.Rule() != nil {
			t.Fatalf("Decide after RemovePolicy = %+v", d)
		}
	}
	if c := counts(l, "checkout", "greedy"); c.Offered != 101 || c.Dropped != 1 {
		t.Errorf("counters lost: %+v", c)
	}
}

func TestPolicySwapConcurrentWithDecide(t *testing.T) {
	const (
		deciders = 8
		swaps    = 500
	)
	peers := []string{"a", "b", "c", "", "new-1", "new-2", "new-3"}
	policies := []*Policy{
		policy("checkout", Rule{Peer: "a", DropRatio: 0.5}, Rule{Peer: "b", DropRatio: 0.2, Mode: dropratio.Shadow}),
		policy("checkout", Rule{Peer: "a", DropRatio: 0.1, Mode: dropratio.Shadow}, Rule{Peer: "c", DropRatio: 0.7}, Rule{Peer: names.Unknown, DropRatio: 0.3}),
		nil, // RemovePolicy
	}
	l := NewLimiter(LimiterOptions{MaxPeers: 4})
	s := l.Service("checkout")
	// Listed peers get counters when a policy arrives, as far as MaxPeers
	// allows. Without this, deciders that start first could fill the table
	// with c and new-*, and a and b, the shadow rules' peers, would be
	// _overflow for ever: no shadow drop, and the test would time out.
	l.SetPolicy(policies[0])

	// Deciders run until the swapper has done all its swaps, so every swap
	// overlaps with decisions.
	var calls, drops, shadows atomic.Uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range deciders {
		wg.Go(func() {
			for i := g; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				d := s.Decide(peers[i%len(peers)])
				calls.Add(1)
				if d.Drop {
					drops.Add(1)
					if r := d.Rule(); r == nil || r.Mode != dropratio.Enforce || r.upstream() || r.DropRatio == 0 {
						t.Errorf("drop under rule %+v", r)
						return
					}
				}
				if d.Shadow {
					shadows.Add(1)
					if r := d.Rule(); r == nil || r.Mode != dropratio.Shadow {
						t.Errorf("shadow drop under rule %+v", r)
						return
					}
				}
			}
		})
	}
	// Swap at least swaps times, and on until the deciders have seen both
	// kinds of drop, so that the test can not pass without exercising them.
	deadline := time.Now().Add(time.Minute)
	n := 0
	for ; n < swaps || drops.Load() == 0 || shadows.Load() == 0 || calls.Load() < 10_000; n++ {
		if time.Now().After(deadline) {
			close(stop)
			t.Fatalf("after %d swaps: %d calls, %d drops, %d shadow drops", n, calls.Load(), drops.Load(), shadows.Load())
		}
		if p := policies[n%len(policies)]; p != nil {
			l.SetPolicy(p)
		} else {
			l.RemovePolicy("checkout")
		}
	}
	close(stop)
	waitTimeout(t, &wg)

	var total PeerCounts
	for _, c := range l.AppendCounts("checkout", nil) {
		total.Offered += c.Offered
		total.Dropped += c.Dropped
		total.ShadowDropped += c.ShadowDropped
	}
	want := PeerCounts{Offered: calls.Load(), Dropped: drops.Load(), ShadowDropped: shadows.Load()}
	if total != want {
		t.Errorf("counters sum to %+v, decisions were %+v", total, want)
	}
	t.Logf("%d decisions across %d swaps", want.Offered, n)
}

func TestCountsConsistentWhileDeciding(t *testing.T) {
	// A reporter reads while requests are decided: every counter grows and
	// drops never exceed offered.
	l := NewLimiter(LimiterOptions{})
	l.SetPolicy(policy("checkout", Rule{Peer: "a", DropRatio: 0.5}, Rule{Peer: "b", DropRatio: 0.5, Mode: dropratio.Shadow}))
	s := l.Service("checkout")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, peer := range []string{"a", "b", "a", "b"} {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
					s.Decide(peer)
				}
			}
		})
	}
	prev := map[string]PeerCounts{}
	for range 2000 {
		for _, c := range s.AppendCounts(nil) {
			p := prev[c.Peer]
			if c.Dropped > c.Offered || c.ShadowDropped > c.Offered {
				t.Fatalf("inconsistent %+v", c)
			}
			if c.Offered < p.Offered || c.Dropped < p.Dropped || c.ShadowDropped < p.ShadowDropped {
				t.Fatalf("counters went back: %+v after %+v", c, p)
			}
			prev[c.Peer] = c
		}
	}
	close(stop)
	waitTimeout(t, &wg)
}

func TestMaxPeersOverflow(t *testing.T) {
	l := NewLimiter(LimiterOptions{MaxPeers: 3})
	// The limited peers (zz, zzz, with a ratio; yy, with a limit) get
	// entries at once, however many there are; the unlimited ones (p0, p1)
	// are observed, and get one when a request names them, while there
	// is room for MaxPeers observed peers.
	l.SetPolicy(policy("checkout",
		unlimited("p0"), unlimited("p1"), Rule{Peer: "zz", DropRatio: 0.99}, Rule{Peer: "zzz", DropRatio: 0.99},
		Rule{Peer: "yy", LimitRPS: 10, AllowedRPS: 10},
		Rule{Peer: names.Overflow, DropRatio: 0.99, Mode: dropratio.Shadow},
	))
	s := l.Service("checkout")
	for i := range 10 {
		s.Decide(fmt.Sprintf("p%d", i))
	}
	// "" and "unknown" are reserved and do not take a slot.
	s.Decide("")
	s.Decide(names.Unknown)
	var got []string
	for _, c := range s.AppendCounts(nil) {
		got = append(got, fmt.Sprintf("%s=%d/%d", c.Peer, c.Offered, c.ShadowDropped))
	}
	// p3..p9 are overflow, judged by the overflow rule (shadow, 0.99).
	want := []string{"_overflow=7/7", "p0=1/0", "p1=1/0", "p2=1/0", "unknown=2/0", "yy=0/0", "zz=0/0", "zzz=0/0"}
	if !slices.Equal(got, want) {
		t.Errorf("counts %v, want %v", got, want)
	}
	for _, peer := range []string{"zz", "zzz"} {
		if d := s.Decide(peer); !d.Drop || d.Rule().Peer != peer {
			t.Errorf("limited peer %s with the observed peers full: Decide = %+v", peer, d)
		}
	}
	if d := s.Decide("p9"); !d.Shadow || d.Rule().Peer != names.Overflow {
		t.Errorf("unlisted peer without room: Decide = %+v, rule %+v", d, d.Rule())
	}
	if n, o := s.peerCount(), s.observedCount(); n != 8 || o != 3 {
		t.Errorf("%d peers, %d observed; want 8, 3", n, o)
	}
}

// A flood of made-up names fills the observed peers; a limit added after it
// still gets its own slot (issue 13: mobile was judged as _overflow).
func TestLimitAfterFloodHasItsSlot(t *testing.T) {
	l := NewLimiter(LimiterOptions{MaxPeers: 16})
	s := l.Service("checkout")
	for i := range 1000 {
		s.Decide(fmt.Sprintf("flood-%04d", i))
	}
	l.SetPolicy(policy("checkout", Rule{Peer: "mobile", DropRatio: 0.5, LimitRPS: 20}))
	if d := s.Decide("mobile"); d.Rule() == nil || d.Rule().Peer != "mobile" {
		t.Fatalf("mobile after the flood: Decide = %+v, rule %+v", d, d.Rule())
	}
	if n := s.peerCount(); n != 2+16+1 {
		t.Errorf("%d peers, want the 2 reserved, 16 observed and mobile", n)
	}
}

// Names that sort before the real callers, listed in the policy, can not
// take the limited callers' slots: before, a policy pre-filled the table in
// name order as far as MaxPeers allowed (issue 13).
func TestSortedNamesDoNotSquatLimitedSlots(t *testing.T) {
	l := NewLimiter(LimiterOptions{MaxPeers: 8})
	rules := []Rule{{Peer: "web", DropRatio: 0.5, LimitRPS: 50}, {Peer: "victim", LimitRPS: 100, AllowedRPS: 100}}
	for i := range 100 {
		rules = append(rules, unlimited(fmt.Sprintf("aaa-%03d", i)))
	}
	l.SetPolicy(policy("checkout", rules...))
	s := l.Service("checkout")
	for i := range 100 {
		s.Decide(fmt.Sprintf("aaa-%03d", i))
	}
	for _, peer := range []string{"web", "victim"} {
		if d := s.Decide(peer); d.Rule() == nil || d.Rule().Peer != peer {
			t.Errorf("%s: Decide = %+v, rule %+v", peer, d, d.Rule())
		}
	}
	if n, o := s.peerCount(), s.observedCount(); n != 2+2+8 || o != 8 {
		t.Errorf("%d peers, %d observed; want 12, 8", n, o)
	}
}

func TestInvalidPeerNamesCountAsUnknown(t *testing.T) {
	l := NewLimiter(LimiterOptions{MaxPeers: 2})
	s := l.Service("checkout")
	bad := []string{"has space", "_private", "-dash", "a/b", strings.Repeat("x", names.MaxLen+1), "ünicode", "nul\x00"}
	for _, peer := range bad {
		s.Decide(peer)
	}
	s.Decide("")
	cs := s.AppendCounts(nil)
	if len(cs) != 2 || cs[1].Peer != names.Unknown || cs[1].Offered != uint64(len(bad))+1 {
		t.Errorf("counts %+v, want only the reserved peers with %d unknown", cs, len(bad)+1)
	}
	if got := s.invalidPeers.Load(); got != uint64(len(bad)) {
		t.Errorf("invalid peers = %d, want %d", got, len(bad))
	}
}

func TestAppendCounts(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	l.SetPolicy(policy("checkout", Rule{Peer: "b", DropRatio: 0.5}))
	for range 10 {
		l.Decide("checkout", "c")
	}
	for range 100 {
		l.Decide("checkout", "b")
	}
	l.Decide("other", "a")

	dst := []PeerCounts{{Peer: "kept"}}
	dst = l.AppendCounts("checkout", dst)
	var peers []string
	for _, c := range dst {
		peers = append(peers, c.Peer)
	}
	if want := []string{"kept", "_overflow", "b", "c", "unknown"}; !slices.Equal(peers, want) {
		t.Fatalf("peers %v, want %v", peers, want)
	}
	if dst[2].Offered != 100 || dst[2].Dropped < 46 || dst[2].Dropped > 54 || dst[3].Offered != 10 {
		t.Errorf("counts %+v", dst)
	}
	if got := l.AppendCounts("nothing", nil); got != nil {
		t.Errorf("unknown service: %v", got)
	}
	if got, want := l.Services(), []string{"checkout", "other"}; !slices.Equal(got, want) {
		t.Errorf("Services = %v, want %v", got, want)
	}
}

func TestLimiterDecideSharesServiceTable(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	s := l.Service("checkout")
	if l.Service("checkout") != s || s.Name() != "checkout" {
		t.Fatal("Service does not return the same handle")
	}
	l.Decide("checkout", "a")
	s.Decide("a")
	if c := counts(l, "checkout", "a"); c.Offered != 2 {
		t.Errorf("counts %+v", c)
	}
}

func TestDecideAllocatesNothing(t *testing.T) {
	l := NewLimiter(LimiterOptions{MaxPeers: 1})
	almostOne := math.Nextafter(1, 0) // Diffuse admits one request in 2^32
	l.SetPolicy(policy("checkout",
		Rule{Peer: "admitted", LimitRPS: 100},
		Rule{Peer: "dropped", DropRatio: almostOne},
		Rule{Peer: "shadow", DropRatio: almostOne, Mode: dropratio.Shadow},
	))
	s := l.Service("checkout")
	s.Decide("observed")
	// The table is full now; every new name is overflow.
	newNames := make([]string, 1000)
	for i := range newNames {
		newNames[i] = fmt.Sprintf("new-%d", i)
	}
	next := 0

	l2 := NewLimiter(LimiterOptions{})
	s2 := l2.Service("checkout")
	s2.Decide("seen-once") // first sighting may allocate

	for _, tc := range []struct {
		name string
		f    func() Decision
		want func(Decision) bool
	}{
		{"known peer admitted", func() Decision { return s.Decide("admitted") }, func(d Decision) bool { return !d.Drop && d.Rule() != nil }},
		{"known peer dropped", func() Decision { return s.Decide("dropped") }, func(d Decision) bool { return d.Drop }},
		{"shadow", func() Decision { return s.Decide("shadow") }, func(d Decision) bool { return d.Shadow }},
		{"unlisted peer after first sighting", func() Decision { return s2.Decide("seen-once") }, func(d Decision) bool { return !d.Drop }},
		{"overflow", func() Decision { next++; return s.Decide(newNames[next%len(newNames)]) }, func(d Decision) bool { return !d.Drop }},
		{"empty peer", func() Decision { return s.Decide("") }, func(d Decision) bool { return !d.Drop }},
		{"invalid peer", func() Decision { return s.Decide("bad name") }, func(d Decision) bool { return !d.Drop }},
		{"with service lookup", func() Decision { return l.Decide("checkout", "dropped") }, func(d Decision) bool { return d.Drop }},
	} {
		var last Decision
		if got := testing.AllocsPerRun(1000, func() { last = tc.f() }); got != 0 {
			t.Errorf("%s: %v allocations per Decide", tc.name, got)
		}
		if !tc.want(last) {
			t.Errorf("%s: unexpected decision %+v", tc.name, last)
		}
	}
	if n := s.peerCount(); n != 6 {
		t.Errorf("%d peers after the overflow run, want 6", n)
	}
}

func TestDiffuseHitMatchesOracle(t *testing.T) {
	// The oracle: drops among the first k requests are round(k·p) =
	// floor((k·step + 2^31) / 2^32), computed without overflow.
	drops := func(k, step uint64) *big.Int {
		n := new(big.Int).Mul(new(big.Int).SetUint64(k), new(big.Int).SetUint64(step))
		n.Add(n, big.NewInt(1<<31))
		return n.Rsh(n, 32)
	}
	oracle := func(k, step uint64) bool { return drops(k, step).Cmp(drops(k-1, step)) > 0 }
	f := func(k uint64, step uint32, near uint8) bool {
		switch near % 4 { // also probe where 32- and 64-bit arithmetic wrap
		case 1:
			k = 1<<32 + k%8
		case 2:
			k = math.MaxUint64 - k%8
		case 3:
			k = 1 + k%1000
		}
		if k == 0 {
			k = 1
		}
		return diffuseHit(k, uint64(step)) == oracle(k, uint64(step))
	}
	if err := quick.Check(f, &quick.Config{MaxCount: 50_000}); err != nil {
		t.Error(err)
	}
	// And the count itself: k requests at p see round(k·p) drops.
	for _, p := range []float64{0.001, 0.3, 0.5, 0.8, 0.99} {
		step := uint64(p * (1 << 32))
		n := 0
		for k := uint64(1); k <= 10_000; k++ {
			if diffuseHit(k, step) {
				n++
			}
		}
		if want := drops(10_000, step).Int64(); int64(n) != want || math.Abs(float64(n)-p*10_000) > 1 {
			t.Errorf("p=%v: %d drops in 10000, oracle %d", p, n, want)
		}
	}
}

func TestValidNameMatchesCheck(t *testing.T) {
	check := func(s string) bool { return validName(s) == (names.Check(s) == nil) }
	for _, s := range []string{"", "a", names.Unknown, names.Overflow, "_overflowx", "_", "a_b.c-d", "9", ".a",
		strings.Repeat("a", names.MaxLen), strings.Repeat("a", names.MaxLen+1), "a\x00", "ü"} {
		if !check(s) {
			t.Errorf("validName(%q) = %v, names.Check = %v", s, validName(s), names.Check(s))
		}
	}
	// Random strings over an alphabet rich in the characters that matter.
	const alphabet = "aZ09._-/ _\x00\xff"
	cfg := &quick.Config{MaxCount: 20_000, Values: nil}
	if err := quick.Check(func(seed uint64) bool {
		r := rand.New(rand.NewPCG(seed, 0))
		b := make([]byte, r.IntN(8)+r.IntN(2)*(names.MaxLen-4))
		for i := range b {
			b[i] = alphabet[r.IntN(len(alphabet))]
		}
		if r.IntN(4) == 0 && len(b) > 0 {
			b[0] = 'a'
		}
		return check(string(b))
	}, cfg); err != nil {
		t.Error(err)
	}
}

func FuzzValidName(f *testing.F) {
	for _, s := range []string{"", "checkout", names.Overflow, "a b", strings.Repeat("a", names.MaxLen+1)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if validName(s) != (names.Check(s) == nil) {
			t.Errorf("validName(%q) = %v, names.Check = %v", s, validName(s), names.Check(s))
		}
	})
}

func TestDecideTakesNoLockInSteadyState(t *testing.T) {
	l := NewLimiter(LimiterOptions{MaxPeers: 1})
	l.SetPolicy(policy("checkout", Rule{Peer: "listed", DropRatio: 0.5}))
	s := l.Service("checkout")
	s.Decide("seen") // fills the table: listed is limited, seen is the one observed

	// With every writer's lock held, steady-state decisions still finish.
	l.mu.Lock()
	s.mu.Lock()
	defer l.mu.Unlock()
	defer s.mu.Unlock()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, peer := range []string{"listed", "seen", "", "bad name", "overflow-1", "overflow-2", names.Unknown, names.Overflow} {
			s.Decide(peer)
			l.Decide("checkout", peer)
		}
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("Decide blocked on a writer's lock")
	}
}

// With OneStripe, a single-threaded caller's k-th request is decided as the
// k-th of one sequence, wherever its goroutine's stack happens to be: the
// simulator's runs must not depend on addresses.
func TestOneStripeIsReproducible(t *testing.T) {
	l := NewLimiter(LimiterOptions{OneStripe: true})
	l.SetPolicy(policy("checkout", Rule{Peer: "web", DropRatio: 0.37, LimitRPS: inf, AllowedRPS: inf}))
	s := l.Service("checkout")
	ratio := 0.37
	step := uint64(ratio * (1 << 32))
	var decideAt func(depth int) bool
	decideAt = func(depth int) bool { // deeper calls move the stack
		var pad [512]byte
		_ = pad
		if depth > 0 {
			return decideAt(depth - 1)
		}
		return s.Decide("web").Drop
	}
	for k := uint64(1); k <= 2000; k++ {
		if got, want := decideAt(int(k%7)*40), diffuseHit(k, step); got != want {
			t.Fatalf("request %d: drop %v, want %v (the k-th of one sequence)", k, got, want)
		}
	}
}
