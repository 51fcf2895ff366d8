package sidecar

import (
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/dropratio"
)

// The callee side of a bucket enforced upstream: it never drops, and counts
// each arrival as 1/(1−p) offered, p/(1−p) dropped upstream.

// wantUpstream is what n arrivals at ratio p must report, computed the slow
// way: the weight in fixed point, summed, cut to whole requests.
func wantUpstream(n uint64, p float64) (offered, dropped uint64) {
	w := uint64(math.Round(upstreamOne/(1-min(p, maxUpstreamRatio)))) - upstreamOne
	inferred := n * w / upstreamOne
	return n + inferred, inferred
}

func TestUpstreamCountsOfferedBeforeUpstreamDrops(t *testing.T) {
	for _, strategy := range []Strategy{Diffuse, Random} {
		for _, p := range []float64{0, 0.1, 0.3, 1.0 / 3, 0.5, 0.75, 0.9, 0.99, 0.9999, math.Nextafter(1, 0)} {
			l := NewLimiter(LimiterOptions{Strategy: strategy})
			l.SetPolicy(policy("checkout", Rule{Peer: "web", DropRatio: p, Enforcement: dataplane.EnforceUpstream}))
			s := l.Service("checkout")
			const n = 100_000
			for range n {
				if d := s.Decide("web"); d.Drop || d.Shadow || d.Rule() == nil || !d.Rule().upstream() {
					t.Fatalf("%v p=%v: Decide = %+v, want an admit under the upstream rule", strategy, p, d)
				}
			}
			c := counts(l, "checkout", "web")
			off, drop := wantUpstream(n, p)
			if c.Offered != off || c.Dropped != drop || c.ShadowDropped != 0 {
				t.Errorf("%v p=%v: counts %+v, want offered %d, dropped %d", strategy, p, c, off, drop)
			}
			// Within rounding of the exact offered load n/(1−p): the
			// weight is off by at most 2^-17 per arrival, and the
			// snapshot cuts less than one request.
			exact := n / (1 - min(p, maxUpstreamRatio))
			if d := math.Abs(float64(c.Offered) - exact); d > n/(2*upstreamOne)+1 {
				t.Errorf("%v p=%v: offered %d, exact %.2f: off by %.2f", strategy, p, c.Offered, exact, d)
			}
		}
	}
}

// The fraction of a request that a snapshot cuts off is not lost: it
// carries over, so snapshots taken after every request sum to the same.
func TestUpstreamFractionCarriesOver(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	l.SetPolicy(policy("checkout", Rule{Peer: "web", DropRatio: 0.1, Enforcement: dataplane.EnforceUpstream})) // 1/9 of a request per arrival
	s := l.Service("checkout")
	var prev PeerCounts
	var sumDropped uint64
	for i := range 900 {
		s.Decide("web")
		c := counts(l, "checkout", "web")
		if c.Offered < prev.Offered || c.Dropped < prev.Dropped {
			t.Fatalf("after %d: counts went back from %+v to %+v", i+1, prev, c)
		}
		sumDropped += c.Dropped - prev.Dropped
		prev = c
	}
	if _, want := wantUpstream(900, 0.1); sumDropped != want || want != 100 {
		t.Errorf("dropped %d over 900 snapshots, want %d (= 100)", sumDropped, want)
	}
}

// A ratio change changes the weight of later arrivals only.
func TestUpstreamWeightFollowsThePolicy(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	s := l.Service("checkout")
	l.SetPolicy(policy("checkout", Rule{Peer: "web", DropRatio: 0.5, Enforcement: dataplane.EnforceUpstream}))
	decideN(s, "web", 1000) // 1,000 dropped upstream
	l.SetPolicy(policy("checkout", Rule{Peer: "web", DropRatio: 0.2, Enforcement: dataplane.EnforceUpstream}))
	decideN(s, "web", 1000) // 250 more
	l.SetPolicy(policy("checkout", Rule{Peer: "web", DropRatio: 0.2}))
	drops, _ := decideN(s, "web", 1000) // enforced here again: 200 dropped by this side
	if drops != 200 {
		t.Fatalf("enforced at 0.2: %d dropped of 1000, want 200", drops)
	}
	if c, want := counts(l, "checkout", "web"), (PeerCounts{Peer: "web", Offered: 3000 + 1250, Dropped: 1250 + 200}); c != want {
		t.Errorf("counts %+v, want %+v", c, want)
	}
}

// An expired policy does not make this side drop an upstream peer, in any
// fail mode: the upstream data planes hold their last ratio.
func TestUpstreamUnderFailModes(t *testing.T) {
	for _, fm := range []dataplane.FailMode{dataplane.FailOpen, dataplane.FailHold, dataplane.FailLocal} {
		l := NewLimiter(LimiterOptions{})
		r := Rule{Peer: "web", DropRatio: 0.5, Enforcement: dataplane.EnforceUpstream, LimitRPS: 1, AllowedRPS: 1}
		t0 := time.Unix(1000, 0)
		l.SetPolicyAt(failPolicy(fm, r), t0)
		l.Expire(t0.Add(testTTL + testDecay/2))
		if st := l.Status("checkout"); st.State != Expired {
			t.Fatalf("%v: state %v, want expired", fm, st.State)
		}
		s := l.Service("checkout")
		if drops, shadows := decideN(s, "web", 1000); drops != 0 || shadows != 0 {
			t.Errorf("%v: %d dropped, %d shadow dropped of an upstream peer, want none", fm, drops, shadows)
		}
		if c := counts(l, "checkout", "web"); c.Offered != 2000 || c.Dropped != 1000 {
			t.Errorf("%v: counts %+v, want offered 2000, dropped 1000", fm, c)
		}
		if ratio, ok := s.Ratio("web"); !ok || ratio != 0.5 {
			t.Errorf("%v: Ratio = %v, %v; want 0.5 in force", fm, ratio, ok)
		}
	}
}

func TestUpstreamCountsConcurrently(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	l.SetPolicy(policy("checkout", Rule{Peer: "web", DropRatio: 0.3, Enforcement: dataplane.EnforceUpstream}))
	s := l.Service("checkout")
	const workers, each = 8, 20_000
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				if s.Decide("web").Drop {
					t.Error("an upstream peer dropped")
					return
				}
			}
		}()
	}
	waitTimeout(t, &wg)
	// Each stripe adds the same weight, so the sum is exact whatever the
	// spread over stripes.
	off, drop := wantUpstream(workers*each, 0.3)
	if c := counts(l, "checkout", "web"); c.Offered != off || c.Dropped != drop {
		t.Errorf("counts %+v, want offered %d, dropped %d", c, off, drop)
	}
}

func TestUpstreamDecideAllocatesNothing(t *testing.T) {
	for _, strategy := range []Strategy{Diffuse, Random} {
		l := NewLimiter(LimiterOptions{Strategy: strategy})
		l.SetPolicy(policy("checkout", Rule{Peer: "web", DropRatio: 0.3, Enforcement: dataplane.EnforceUpstream}))
		s := l.Service("checkout")
		if got := testing.AllocsPerRun(1000, func() { s.Decide("web") }); got != 0 {
			t.Errorf("%v: %v allocations per Decide of an upstream peer", strategy, got)
		}
	}
}

func TestPolicyFromProtoEnforcedUpstream(t *testing.T) {
	m := goodPolicy()
	// As the controller sends it: MODE_SHADOW and the mark.
	m.Peers[1].Mode, m.Peers[1].DropRatio, m.Peers[1].EnforcedUpstream = sluicev1.Mode_MODE_SHADOW, 0.3, true
	p, err := PolicyFromProto(m)
	if err != nil {
		t.Fatal(err)
	}
	if r := p.Rule("cart"); r == nil || r.Enforcement != dataplane.EnforceUpstream || r.Mode != dropratio.Enforce || r.DropRatio != 0.3 {
		t.Fatalf("Rule(cart) = %+v, want upstream at 0.3", r)
	}
	if r := p.Rule("search"); r.Mode != dropratio.Shadow || r.Enforcement != dataplane.EnforceSidecar {
		t.Errorf("a plain shadow peer became %v, %v", r.Mode, r.Enforcement)
	}
	if got := p.Proto(); !proto.Equal(got, m) {
		t.Errorf("round trip:\n got %v\nwant %v", got, m)
	}
	// The mark wins over an enforcing mode too: this side must not drop.
	m.Peers[1].Mode = sluicev1.Mode_MODE_ENFORCE
	if p, err := PolicyFromProto(m); err != nil || p.Rule("cart").Enforcement != dataplane.EnforceUpstream {
		t.Errorf("MODE_ENFORCE with the mark: %v, %v; want upstream", p, err)
	}
	// Outbound, nobody upstream of the caller's own limiter would drop.
	m.Name, m.Direction = "caller/checkout", sluicev1.Direction_DIRECTION_OUTBOUND
	if _, err := PolicyFromProto(m); err == nil || !strings.Contains(err.Error(), "peers[1].enforced_upstream: set in an outbound policy") {
		t.Errorf("outbound with the mark: %v, want an error naming peers[1].enforced_upstream", err)
	}
}
