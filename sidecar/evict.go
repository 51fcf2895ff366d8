package sidecar

import (
	"maps"
	"time"

	"github.com/sluicehq/sluice/pkg/names"
)

// Idle peers: the table's observed peers come and go with the callers that
// name them, so that a flood of made-up names, once over, does not hold the
// table full for ever (every new caller judged as names.Overflow).

// sweepsPerIdle is how many sweeps for idle peers a PeerIdle holds: a peer
// is evicted between PeerIdle and PeerIdle·(1 + 1/sweepsPerIdle) after its
// last request.
const sweepsPerIdle = 8

// observed reports whether peer, with slot sl, is an observed peer: one that
// MaxPeers bounds and evictIdle may evict. The reserved peers are not, and
// neither are the peers the policy limits (Rule.Limited), which always keep
// their counters.
func observed(peer string, sl slot) bool {
	if peer == names.Unknown || peer == names.Overflow {
		return false
	}
	return sl.v == nil || sl.v.rule == nil || !sl.v.rule.Limited()
}

// offered sums e's offered counters: every request that reached e, so a
// change means a request.
func (e *entry) offered() (n uint64) {
	for i := range e.stripes {
		n += e.stripes[i].offered.Load()
	}
	return n
}

// evictIdle evicts the observed peers that had no request for s.peerIdle, as
// of now. Expire calls it: off the request path, a sweep at most every
// peerIdle/sweepsPerIdle reads each peer's offered counters once, under mu,
// and a sweep that evicts builds one new table, copy on write as addPeer
// does, so that Decide goes on reading the old one until the swap.
//
// A peer's counters that have not moved since the sweep that first saw them
// at their value, peerIdle ago, had no request since: its counts were all
// read by a holder that reads them more often (the reporter), so nothing
// unreported is lost. A request that loaded the old table just before the
// swap still counts in the evicted entry, and that one count may go
// unreported. A request after the swap adds the peer again, with fresh
// counters and a new incarnation, which the reporter tells apart from the
// old ones (PeerCounts.Incarnation): no negative or doubled counts.
func (s *ServiceLimiter) evictIdle(now time.Time) {
	if s.peerIdle <= 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.sweptAt.IsZero() && now.Sub(s.sweptAt) < s.peerIdle/sweepsPerIdle {
		return
	}
	s.sweptAt = now
	t := s.table.Load()
	var idle []string
	for peer, sl := range t.peers {
		e := sl.e
		if n := e.offered(); n != e.seen || e.activeAt.IsZero() {
			e.seen, e.activeAt = n, now
			continue
		}
		if now.Sub(e.activeAt) >= s.peerIdle && observed(peer, sl) {
			idle = append(idle, peer)
		}
	}
	if len(idle) == 0 {
		return
	}
	nt := *t
	nt.peers = maps.Clone(t.peers)
	for _, peer := range idle {
		delete(nt.peers, peer)
	}
	nt.index = newPeerTable(nt.peers)
	nt.counted -= len(idle)
	s.table.Store(&nt)
	s.evicted.Add(uint64(len(idle)))
}

// observedCount returns the number of observed peers in the table.
func (s *ServiceLimiter) observedCount() int { return s.table.Load().counted }
