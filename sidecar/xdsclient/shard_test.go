package xdsclient_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/testkit"
	"github.com/sluicehq/sluice/internal/xdsserver"
	"github.com/sluicehq/sluice/pkg/shard"
	"github.com/sluicehq/sluice/sidecar/xdsclient"
)

// owned is a policy as shard m publishes it for a callee it owns.
func owned(name string, ratio float64, m shard.Map) *sluicev1.DropPolicy {
	p := policy(name, ratio)
	p.Shard = &sluicev1.ShardInfo{Index: uint32(m.Index), Count: uint32(m.Count), Owner: true}
	return p
}

// A client that assumes one shard asks shard 0, which sends it to the
// owner; when the shards grow from 2 to 3 and its callee moves, the shard
// it was on sends it on, and it keeps its policy throughout: nothing is
// removed, nothing but the owners' policies reaches the handler.
func TestShardedServersRouteToTheOwner(t *testing.T) {
	// pkg/shard pins the owners: echo 1 of 2; foxtrot 0 of 2, 2 of 3.
	for _, p := range protocols {
		t.Run(p.String(), func(t *testing.T) {
			port := testkit.ShardPort(t, 3)
			tmpl := fmt.Sprintf("127.0.0.1%s:%d", shard.Placeholder, port)
			addr := func(i int) string { return fmt.Sprintf("127.0.0.1%d:%d", i, port) }
			two := func(i int) shard.Map { return shard.Map{Index: i, Count: 2} }
			s0 := startServerWith(t, addr(0), xdsserver.Options{Shard: two(0)}, owned("callee/foxtrot", 0.4, two(0)))
			s1 := startServerWith(t, addr(1), xdsserver.Options{Shard: two(1)}, owned("callee/echo", 0.3, two(1)))

			echo := newRecorder()
			reg := prometheus.NewRegistry()
			runClient(t, xdsclient.Config{Servers: []string{tmpl}, Resources: []string{"callee/echo"}, Protocol: p, Registerer: reg}, echo)
			echo.waitFor(t, "callee/echo", 0.3)
			if n := metric(reg, "sluice_sidecar_xds_shard_moves_total"); n != 1 {
				t.Errorf("moves = %v, want 1 (shard 0 → 1)", n)
			}
			if got, calls := echo.last("callee/echo"); got != 0.3 || calls != 1 {
				t.Errorf("the handler saw %d updates, the last %v; want only the owner's 0.3", calls, got)
			}
			if n := s1.metric("sluice_controller_xds_moved_answers_total"); n != 0 {
				t.Errorf("the owner answered %v moved, want 0", n)
			}
			if n := s0.metric("sluice_controller_xds_moved_answers_total"); n != 1 {
				t.Errorf("shard 0 answered %v moved, want 1", n)
			}

			fox := newRecorder()
			foxReg := prometheus.NewRegistry()
			runClient(t, xdsclient.Config{Servers: []string{tmpl}, ShardCount: 2, Resources: []string{"callee/foxtrot"}, Protocol: p, NodeID: "pod-2", Registerer: foxReg}, fox)
			fox.waitFor(t, "callee/foxtrot", 0.4)

			// The reshard: shard 2 starts with 3 and has not computed
			// foxtrot yet; shard 0 restarts with 3.
			three := func(i int) shard.Map { return shard.Map{Index: i, Count: 3} }
			s2 := startServerWith(t, addr(2), xdsserver.Options{Shard: three(2)})
			s0.close()
			startServerWith(t, addr(0), xdsserver.Options{Shard: three(0)})
			eventually(t, "the move to shard 2", func() bool {
				return metric(foxReg, "sluice_sidecar_xds_shard_moves_total") == 1 && s2.metric("sluice_controller_xds_streams") == 1
			})
			// A resuming delta client would be told "removed" of what
			// shard 2 lacks: the move subscribes without versions.
			time.Sleep(50 * time.Millisecond)
			if r := fox.removed(); len(r) != 0 {
				t.Errorf("the move removed %v; the policy must be held until the new owner's arrives", r)
			}
			s2.publish(t, owned("callee/foxtrot", 0.5, three(2)))
			fox.waitFor(t, "callee/foxtrot", 0.5)
			if _, calls := fox.last("callee/foxtrot"); calls != 2 {
				t.Errorf("the handler saw %d updates, want 2: shard 0's of 2 and shard 2's of 3", calls)
			}
		})
	}
}

// A client whose servers name no shard, in front of sharded controllers
// (a Service that spreads connections), never applies a moved answer.
func TestMovedAnswerIsNotApplied(t *testing.T) {
	srv := startServerWith(t, "127.0.0.1:0", xdsserver.Options{Shard: shard.Map{Index: 0, Count: 2}})
	rec := newRecorder()
	runClient(t, xdsclient.Config{Servers: []string{srv.addr}, Resources: []string{"callee/echo"}, Protocol: xdsclient.Delta}, rec)
	eventually(t, "the moved answer", func() bool { return srv.metric("sluice_controller_xds_moved_answers_total") == 1 })
	eventually(t, "a second attempt", func() bool { return len(srv.deltaRequests()) >= 3 })
	if _, calls := rec.last("callee/echo"); calls != 0 {
		t.Errorf("the handler saw %d updates from a shard that does not own echo, want 0", calls)
	}
}

// Scaled down from 3 shards to 2, a client whose owner (shard 2) is gone
// asks shard 0, which always exists, and follows it: it owns foxtrot under
// 2 (pkg/shard: foxtrot is 2 of 3, 0 of 2).
func TestShardGoneAsksShardZero(t *testing.T) {
	port := testkit.ShardPort(t, 3)
	tmpl := fmt.Sprintf("127.0.0.1%s:%d", shard.Placeholder, port)
	addr := func(i int) string { return fmt.Sprintf("127.0.0.1%d:%d", i, port) }
	three := func(i int) shard.Map { return shard.Map{Index: i, Count: 3} }
	s0 := startServerWith(t, addr(0), xdsserver.Options{Shard: three(0)})
	s2 := startServerWith(t, addr(2), xdsserver.Options{Shard: three(2)}, owned("callee/foxtrot", 0.5, three(2)))

	fox := newRecorder()
	runClient(t, xdsclient.Config{Servers: []string{tmpl}, ShardCount: 3, Resources: []string{"callee/foxtrot"}, Protocol: xdsclient.Delta}, fox)
	fox.waitFor(t, "callee/foxtrot", 0.5)
	if n := s0.metric("sluice_controller_xds_moved_answers_total"); n != 0 {
		t.Fatalf("a client that starts at the right count asked shard 0 (%v moved answers)", n)
	}

	s2.close()
	s0.close()
	two := shard.Map{Index: 0, Count: 2}
	startServerWith(t, addr(0), xdsserver.Options{Shard: two}, owned("callee/foxtrot", 0.6, two))
	fox.waitFor(t, "callee/foxtrot", 0.6)
	if r := fox.removed(); len(r) != 0 {
		t.Errorf("the scale-down removed %v", r)
	}
}
