package xdsserver

import (
	"strings"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/pkg/shard"
)

// maxMoved bounds the "moved" answers one shard holds: one per callee a
// client asked it for and another shard owns. A real fleet asks for its
// callees, a few thousand; a client that asks for a million made-up names
// gets nothing past the bound (it waits, as it would at any server that
// lacks the name), and the table stays bounded.
const maxMoved = 100_000

// answerMoved gives every callee policy requested here that another shard
// owns an answer that says so: owner false, and the shard count, so that
// the client moves to the owner (sidecar/xdsclient) instead of waiting for
// a policy this shard will never publish, which after a reshard would
// expire the policy it holds. Nothing happens on an unsharded server.
// Safe for concurrent use: go-control-plane calls it from every stream.
func (s *Server) answerMoved(typeURL string, requested []string) {
	if !s.shard.Sharded() || typeURL != names.DropPolicyType {
		return
	}
	for _, name := range requested {
		svc, ok := strings.CutPrefix(name, names.CalleePrefix)
		if !ok || !names.Valid(svc) || s.shard.Owns(svc) {
			continue
		}
		s.movedMu.Lock()
		fresh := !s.moved[name] && len(s.moved) < maxMoved
		if fresh {
			s.moved[name] = true
		}
		s.movedMu.Unlock()
		if !fresh {
			continue
		}
		p := &sluicev1.DropPolicy{
			Name:      name,
			Service:   svc,
			Direction: sluicev1.Direction_DIRECTION_INBOUND,
			Shard:     &sluicev1.ShardInfo{Index: uint32(s.shard.Index), Count: uint32(s.shard.Count)},
		}
		if err := s.cache.UpdateResource(name, p); err != nil {
			s.log.Warn("answer a subscription for another shard's callee", "resource", name, "err", err)
		}
		s.m.moved.Inc()
	}
}

// Shard is the server's shard.
func (s *Server) Shard() shard.Map { return s.shard }
