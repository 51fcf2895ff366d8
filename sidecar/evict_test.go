package sidecar

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/names"
)

// peersOf returns the names of service's peers with counters, sorted.
func peersOf(l *Limiter, service string) []string {
	var out []string
	for _, c := range l.AppendCounts(service, nil) {
		out = append(out, c.Peer)
	}
	return out
}

func TestEvictIdlePeers(t *testing.T) {
	const idle = 8 * time.Second // sweeps every second
	l := NewLimiter(LimiterOptions{MaxPeers: 2, PeerIdle: idle})
	l.SetPolicy(policy("checkout", Rule{Peer: "limited", LimitRPS: 10, AllowedRPS: 10}, unlimited("listed")))
	s := l.Service("checkout")
	s.Decide("busy")
	s.Decide("quiet")
	s.Decide("flood-1") // no room: _overflow
	at := func(d time.Duration) time.Time { return t0.Add(d) }

	// busy keeps sending; quiet, limited and the reserved peers do not.
	for d := time.Duration(0); d < idle; d += ExpiryPeriod {
		s.Decide("busy")
		l.Expire(at(d))
	}
	want := []string{names.Overflow, "busy", "limited", "quiet", names.Unknown}
	if got := peersOf(l, "checkout"); !slices.Equal(got, want) {
		t.Fatalf("peers before quiet was idle for %v: %v, want %v", idle, got, want)
	}
	l.Expire(at(idle))
	want = []string{names.Overflow, "busy", "limited", names.Unknown}
	if got := peersOf(l, "checkout"); !slices.Equal(got, want) {
		t.Fatalf("peers after quiet was idle for %v: %v, want %v", idle, got, want)
	}
	if n := s.evicted.Load(); n != 1 {
		t.Errorf("%d evicted, want 1", n)
	}

	// quiet's place is free for the next caller; quiet comes back as a
	// new incarnation, only once there is room again.
	old := counts(l, "checkout", names.Overflow).Offered
	s.Decide("flood-2")
	s.Decide("quiet")
	if got := peersOf(l, "checkout"); !slices.Contains(got, "flood-2") || slices.Contains(got, "quiet") {
		t.Errorf("peers %v: want flood-2 in quiet's place", got)
	}
	if n := counts(l, "checkout", names.Overflow).Offered; n != old+1 {
		t.Errorf("_overflow offered %d, want %d: quiet's request", n, old+1)
	}

	// A policy that stops limiting a peer makes it observed: evictable.
	l.SetPolicy(policy("checkout", unlimited("listed")))
	for d := idle; d <= 3*idle; d += ExpiryPeriod {
		s.Decide("busy")
		l.Expire(at(d))
	}
	want = []string{names.Overflow, "busy", names.Unknown}
	if got := peersOf(l, "checkout"); !slices.Equal(got, want) {
		t.Errorf("peers after the limit went: %v, want %v", got, want)
	}
}

// Evicting never takes a limited peer, however many observed peers come
// and go; and never evicts with a negative PeerIdle.
func TestEvictKeepsLimitedPeers(t *testing.T) {
	for _, idle := range []time.Duration{time.Second, -1} {
		l := NewLimiter(LimiterOptions{MaxPeers: 4, PeerIdle: idle})
		l.SetPolicy(policy("checkout", Rule{Peer: "web", DropRatio: 0.5}, Rule{Peer: "victim", LimitRPS: 100, AllowedRPS: 100}))
		s := l.Service("checkout")
		for i := range 100 {
			s.Decide(fmt.Sprintf("flood-%d", i))
			l.Expire(t0.Add(time.Duration(i) * time.Second))
		}
		got := peersOf(l, "checkout")
		for _, peer := range []string{"web", "victim"} {
			if !slices.Contains(got, peer) {
				t.Errorf("PeerIdle %v: %s evicted: %v", idle, peer, got)
			}
		}
		evicted := s.evicted.Load()
		if (idle > 0) != (evicted > 0) {
			t.Errorf("PeerIdle %v: %d evicted", idle, evicted)
		}
		if n := s.observedCount(); n > 4 {
			t.Errorf("PeerIdle %v: %d observed peers, MaxPeers 4", idle, n)
		}
	}
}

// A policy pins the peers it limits (a ratio, a limit, enforcement
// upstream), never a peer with only a share of the callee's capacity: once a
// callee is over its capacity every caller has one, made-up names included.
// Such a peer is observed, like an unlisted one.
func TestCapacityShareAloneIsNotPinned(t *testing.T) {
	l := NewLimiter(LimiterOptions{MaxPeers: 1})
	share := unlimited("share")
	share.AllowedRPS = 30
	up := unlimited("up")
	up.Enforcement = dataplane.EnforceUpstream
	shadow := unlimited("shadow")
	shadow.DropRatio, shadow.Mode = 0.2, dropratio.Shadow
	l.SetPolicy(policy("checkout", share, up, shadow))
	want := []string{names.Overflow, "shadow", names.Unknown, "up"}
	if got := peersOf(l, "checkout"); !slices.Equal(got, want) {
		t.Errorf("peers at install %v, want %v", got, want)
	}
	s := l.Service("checkout")
	s.Decide("share")
	if n := s.observedCount(); n != 1 {
		t.Errorf("%d observed peers after share's request, want 1: share", n)
	}
}
