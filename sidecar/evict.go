package sidecar

import (
	"maps"
	"time"

	"github.com/sluicehq/sluice/pkg/names"
)

// Idle leaves: the table's observed leaves (for a service without
// procedures, its observed peers) come and go with the callers that
// name them, so that a flood of made-up names, once over, does not hold the
// table full for ever (every new caller judged as names.Overflow).

// sweepsPerIdle is how many sweeps for idle peers a PeerIdle holds: a peer
// is evicted between PeerIdle and PeerIdle·(1 + 1/sweepsPerIdle) after its
// last request.
const sweepsPerIdle = 8

// observed reports whether the leaf k, with slot sl, is an observed leaf:
// one that the table's limit bounds. The reserved peers' leaves are not,
// and neither are the leaves the policy limits (Rule.Limited), which
// always keep their counters, nor stale leaves (see table.leaves).
func (t *table) observed(k leaf, sl slot) bool {
	if k.peer == names.Unknown || k.peer == names.Overflow {
		return false
	}
	if !t.current(k) {
		return false
	}
	return sl.v == nil || sl.v.rule == nil || !sl.v.rule.Limited()
}

// evictable reports whether evictIdle may evict the leaf k once idle: an
// observed leaf, or a stale one, whatever its peer.
func (t *table) evictable(k leaf, sl slot) bool {
	if !t.current(k) {
		return true
	}
	return t.observed(k, sl)
}

// offered sums e's offered counters: every request that reached e, so a
// change means a request.
func (e *entry) offered() (n uint64) {
	for i := range e.stripes {
		n += e.stripes[i].offered.Load()
	}
	if m := e.meter.Load(); m != nil {
		p, _, _ := m.fold()
		n += p
	}
	return n
}

// evictIdle evicts the evictable leaves that had no request for s.peerIdle, as
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
	var idle []leaf
	for k, sl := range t.leaves {
		e := sl.e
		if n := e.offered(); n != e.seen || e.activeAt.IsZero() {
			e.seen, e.activeAt = n, now
			continue
		}
		if now.Sub(e.activeAt) >= s.peerIdle && t.evictable(k, sl) {
			idle = append(idle, k)
		}
	}
	if len(idle) == 0 {
		return
	}
	nt := *t
	nt.leaves = maps.Clone(t.leaves)
	for _, k := range idle {
		if t.observed(k, t.leaves[k]) {
			nt.counted--
		}
		delete(nt.leaves, k)
	}
	nt.index = newPeerTable(nt.leaves, nt.procs, nt.crit)
	s.table.Store(&nt)
	s.evicted.Add(uint64(len(idle)))
}

// observedCount returns the number of observed peers in the table.
func (s *ServiceLimiter) observedCount() int { return s.table.Load().counted }
