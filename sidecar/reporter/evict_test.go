package reporter

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/sidecar"
)

// A peer the Limiter evicts and sees again within one report window starts
// fresh counters, below or above the count the window's start snapshot
// holds: the report counts the new incarnation's requests, neither their
// difference (short by the old count) nor a negative number.
func TestEvictedPeerSeenAgainInOneWindow(t *testing.T) {
	const idle = 3 * time.Second
	start := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return start.Add(d) }
	l := sidecar.NewLimiter(sidecar.LimiterOptions{PeerIdle: idle})
	s := l.Service("checkout")
	w := NewWindow(WindowConfig{Header: Header{SidecarID: "s-1", Service: "checkout"}, Interval: time.Second}, start, l)
	decide := func(peer string, n int) {
		for range n {
			s.Decide(peer)
		}
	}
	decide("mobile", 5)
	l.Expire(at(500 * time.Millisecond))
	if got := describe(w.Tick(at(time.Second), l), start); got != "0–1000 mobile=5" {
		t.Fatalf("first report %q", got)
	}
	// Evicted between 3.5s and 3.9s, seen again before the tick at 4s: the
	// window's start snapshot, at 3s, holds the old incarnation's 5.
	for d := time.Second; d < 4*time.Second; d += 100 * time.Millisecond {
		l.Expire(at(d))
		if d%time.Second == 0 && d > time.Second {
			if rep := w.Tick(at(d), l); rep != nil && len(rep.GetPeers()) > 0 {
				t.Fatalf("report at %v: %q", d, describe(rep, start))
			}
		}
	}
	if peers := l.AppendCounts("checkout", nil); len(peers) != 2 {
		t.Fatalf("mobile not evicted after %v idle: %+v", idle, peers)
	}
	decide("mobile", 12)
	if got := describe(w.Tick(at(4*time.Second), l), start); got != "3000–4000 mobile=12" {
		t.Errorf("report after mobile came back %q, want its 12 requests", got)
	}
}

// TestEvictionLosesNoReportedCount drives a Limiter that evicts idle peers
// and a Window that reports its counters on one virtual clock, with peers
// that come and go over periods around the idle time, and checks that every
// request decided is reported exactly once. (Without surge checks: a surge
// report covers the check window alone, on purpose, so counts do not add
// up over reports with them.)
func TestEvictionLosesNoReportedCount(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { evictionRun(t, seed, false) })
	}
}

// TestEvictionLosesNoReportedCountPerLeaf is TestEvictionLosesNoReportedCount
// for a callee with procedures: each caller sends two gRPC methods, whose
// leaves are evicted and come back on their own.
func TestEvictionLosesNoReportedCountPerLeaf(t *testing.T) {
	for seed := range uint64(20) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) { evictionRun(t, seed, true) })
	}
}

func evictionRun(t *testing.T, seed uint64, procedures bool) {
	const (
		interval = time.Second
		idle     = 2 * interval // the least the agent accepts
		step     = sidecar.ExpiryPeriod
	)
	rng := rand.New(rand.NewPCG(seed, 13))
	start := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	l := sidecar.NewLimiter(sidecar.LimiterOptions{PeerIdle: idle, MaxPeers: 64, MaxLeaves: 64})
	s := l.Service("checkout")
	methods := []string{""}
	if procedures {
		methods = []string{"/shop.Checkout/Pay", "/shop.Checkout/Get"}
		l.SetPolicy(&sidecar.Policy{Name: "callee/checkout", Service: "checkout", Procedures: methods})
	}
	w := NewWindow(WindowConfig{Header: Header{SidecarID: "s-1", Service: "checkout"}, Interval: interval}, start, l)

	// Each peer is on for a while, then off for a while, at random: off
	// periods from well under to well over the idle time.
	type peer struct {
		name  string
		proc  string
		until time.Duration // the current phase ends
		on    bool
		inc   uint64 // its incarnation at the last look
	}
	peers := make([]*peer, 8)
	for i := range peers {
		peers[i] = &peer{name: fmt.Sprintf("caller-%d", i/len(methods)), proc: methods[i%len(methods)]}
	}
	decided := map[string]uint64{}
	reported := map[string]uint64{}
	add := func(rep *sluicev1.LoadReport) {
		for _, p := range rep.GetPeers() {
			reported[p.GetPeer()+p.GetProcedure()] += p.GetOffered()
		}
	}
	var now time.Duration
	reincarnated := 0
	for ; now < 60*time.Second; now += step {
		for _, p := range peers {
			if now >= p.until {
				p.on = !p.on
				p.until = now + time.Duration(rng.Int64N(int64(3*idle)))
			}
			if p.on {
				n := rng.IntN(20)
				for range n {
					s.DecideGRPC(p.name, p.proc)
				}
				decided[p.name+p.proc] += uint64(n)
			}
		}
		for _, c := range l.AppendCounts("checkout", nil) {
			for _, p := range peers {
				if p.name == c.Peer && p.proc == c.Procedure && p.inc != c.Incarnation {
					if p.inc != 0 {
						reincarnated++
					}
					p.inc = c.Incarnation
				}
			}
		}
		at := start.Add(now)
		l.Expire(at)
		if rep := w.Check(at, l); rep != nil {
			add(rep)
		}
		if now%interval == 0 {
			if rep := w.Tick(at, l); rep != nil {
				add(rep)
			}
		}
	}
	// A last interval without requests reports what is left.
	if rep := w.Tick(start.Add(now+interval), l); rep != nil {
		add(rep)
	}
	for name, n := range decided {
		if reported[name] != n {
			t.Errorf("%s: %d decided, %d reported", name, n, reported[name])
		}
	}
	if reincarnated == 0 {
		t.Error("no peer was evicted and seen again: the test tests nothing")
	}
	t.Logf("%d peers evicted and seen again", reincarnated)
}
