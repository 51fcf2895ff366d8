package controller

import (
	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/pkg/shard"
)

// Sharding (pkg/shard): a controller shard computes and publishes the
// buckets of the callees it owns, and only those. A callee's buckets never
// span two shards, so the law's capacity split, which needs every caller of
// a callee at once, is computed whole on one shard.

// keepOwned removes from load what belongs to other shards and returns how
// many service entries (inbound) and peer entries (outbound, whose peers
// are the callees) it removed. Aggregators send each shard its own callees,
// under every shard count the shards announce while a reshard is under
// way, so a shard is sent some callees it does not own; they are not an
// error, and not the shard's to count.
func keepOwned(load *sluicev1.ZoneLoad, m shard.Map) int {
	if !m.Sharded() {
		return 0
	}
	removed := 0
	kept := load.Services[:0]
	for _, sl := range load.GetServices() {
		if sl.GetDirection() != sluicev1.Direction_DIRECTION_OUTBOUND {
			if !m.Owns(sl.GetService()) {
				removed++
				continue
			}
			kept = append(kept, sl)
			continue
		}
		peers := sl.Peers[:0]
		for _, p := range sl.GetPeers() {
			if m.Owns(p.GetPeer()) {
				peers = append(peers, p)
			} else {
				removed++
			}
		}
		clear(sl.Peers[len(peers):])
		sl.Peers = peers
		kept = append(kept, sl)
	}
	clear(load.Services[len(kept):])
	load.Services = kept
	return removed
}

// ownedSet is set without the callees other shards own, computed once per
// limits set: every shard reads the same limits, and must run the law for
// its own callees only, or two shards would publish the same callee.
func (s *State) ownedSet(set *limits.Set) *limits.Set {
	if !s.cfg.Shard.Sharded() || set == nil {
		return set
	}
	if s.ownedFrom == set {
		return s.owned
	}
	own := make(map[string]*limits.Service, set.Len())
	for _, name := range set.Services() {
		if s.cfg.Shard.Owns(name) {
			own[name] = set.Service(name)
		}
	}
	s.ownedFrom, s.owned = set, limits.NewSet(own)
	return s.owned
}

// ShardInfo renders m for the wire, in the policies and zone-load answers
// of a shard; nil when m is not sharded, so that an unsharded
// controller's stay as they were.
func ShardInfo(m shard.Map, owner bool) *sluicev1.ShardInfo {
	if !m.Sharded() {
		return nil
	}
	return &sluicev1.ShardInfo{Index: uint32(m.Index), Count: uint32(m.Count), Owner: owner}
}
