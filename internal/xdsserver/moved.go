package xdsserver

import (
	"errors"
	"strings"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/names"
)

// maxMoved bounds the "moved" answers one shard holds: one per callee a
// client asked it for and another shard owns. A real fleet asks for its
// callees, a few thousand. Past the bound a request for another such name
// ends its stream (ErrMovedFull, counted): answered with nothing, a delta
// client that resumes naming the version it holds would be told the
// policy was removed; refused, it keeps its policy and tries again.
const maxMoved = 100_000

// ErrMovedFull ends a stream that asks for another shard's callee once the
// moved answers are at maxMoved.
var ErrMovedFull = errors.New("xds: too many callees of other shards asked of this one; try another controller")

// answerMoved gives every callee policy requested here that another shard
// owns an answer that says so: owner false, and the shard count, so that
// the client moves to the owner (sidecar/xdsclient) instead of waiting for
// a policy this shard will never publish, which after a reshard would
// expire the policy it holds. Nothing happens on an unsharded server.
// Safe for concurrent use: go-control-plane calls it from every stream.
func (s *Server) answerMoved(typeURL string, requested []string) error {
	if !s.shard.Sharded() || typeURL != names.DropPolicyType {
		return nil
	}
	for _, name := range requested {
		svc, ok := strings.CutPrefix(name, names.CalleePrefix)
		if !ok || !names.Valid(svc) || s.shard.Owns(svc) {
			continue
		}
		s.movedMu.Lock()
		known, full := s.moved[name], len(s.moved) >= maxMoved
		if !known && !full {
			s.moved[name] = true
		}
		s.movedMu.Unlock()
		if known {
			continue
		}
		if full {
			s.m.movedFull.Inc()
			return ErrMovedFull
		}
		// No direction: a sidecar of a release before sharding, which
		// does not read Shard, refuses the answer (NACK) and keeps the
		// policy it holds, instead of applying an empty policy.
		p := &sluicev1.DropPolicy{
			Name:    name,
			Service: svc,
			Shard:   &sluicev1.ShardInfo{Index: uint32(s.shard.Index), Count: uint32(s.shard.Count)},
		}
		if err := s.cache.UpdateResource(name, p); err != nil {
			s.log.Warn("answer a subscription for another shard's callee", "resource", name, "err", err)
		}
		s.m.moved.Inc()
	}
	return nil
}
