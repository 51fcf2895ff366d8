//go:build unix

package e2e

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testkit"
	"github.com/sluicehq/sluice/pkg/shard"
)

// The callees of the sharded test, chosen by their owners (pkg/shard pins
// them): foxtrot is shard 0's of 2 and moves to shard 2 of 3; echo is shard
// 1's of 2 and of 3.
const (
	movingCallee  = "foxtrot"
	stayingCallee = "echo"
)

// TestShardedControllersAsProcesses: two controller shards as real
// processes split two callees between them, one aggregator sends each its
// own, and the sidecars of each callee take their policy from its owner.
// A surge on each callee is held; shard 1 is killed and restarted, and
// shard 0's callee never notices; then the controllers reshard from 2 to 3
// (a StatefulSet scaled up: the new shard starts, the others restart one by
// one with the new count), moving foxtrot to shard 2, and no sidecar's
// policy expires at any moment of the run.
func TestShardedControllersAsProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("sharded controllers with processes: about 90 s")
	}
	const (
		runFor      = 75
		settleFrom  = 6  // the surges are held from here
		killAt      = 15 // shard 1 is killed
		reshardAt   = 35 // shard 2 starts; shards 1 and 0 restart with 3
		settleAgain = 62 // both surges held again from here
	)
	if owner := func(c string, n int) int { return shard.Owner(c, n) }; owner(movingCallee, 2) != 0 || owner(movingCallee, 3) != 2 ||
		owner(stayingCallee, 2) != 1 || owner(stayingCallee, 3) != 1 {
		t.Fatal("the callees' owners changed; pick callees that move as the test says")
	}
	base := takeBaseline(t)
	port := testkit.ShardPort(t, 3)
	tmpl := fmt.Sprintf("127.0.0.1%s:%d", shard.Placeholder, port)
	addr := func(i int) string { return fmt.Sprintf("127.0.0.1%d:%d", i, port) }

	limitsFile := filepath.Join(t.TempDir(), "limits.yaml")
	var doc strings.Builder
	doc.WriteString("services:\n")
	for _, c := range []string{movingCallee, stayingCallee} {
		fmt.Fprintf(&doc, "  %s:\n    callers:\n      web: {limit: %v}\n      batch: {limit: %v}\n", c, faultLimit, faultLimit)
	}
	if err := os.WriteFile(limitsFile, []byte(doc.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	startShard := func(i, count int, warmup string) *node {
		p := start(t, fmt.Sprintf("controller-%d-of-%d", i, count), "controller", "--id="+fmt.Sprintf("controller-%d", i),
			"--limits="+limitsFile, "--grpc-addr="+addr(i), "--admin-addr=127.0.0.1:0", "--warmup="+warmup,
			fmt.Sprintf("--shard=%d", i), fmt.Sprintf("--shards=%d", count))
		n := &node{proc: p, admin: p.addr(t, "admin"), addr: p.addr(t, "grpc")}
		waitReady(t, p, n.admin)
		return n
	}
	ctls := []*node{startShard(0, 2, "1s"), startShard(1, 2, "1s")}
	agg := start(t, "aggregator-zone-a", "aggregator", "--id=aggregator-zone-a", "--zone=zone-a",
		"--controllers="+tmpl, "--controller-shards=2", "--grpc-addr=127.0.0.1:0", "--admin-addr=127.0.0.1:0")
	aggNode := &node{proc: agg, admin: agg.addr(t, "admin"), addr: agg.addr(t, "grpc")}
	waitReady(t, agg, aggNode.admin)

	ups := map[string]*upstream{}
	sidecars := map[string][]*node{}
	var all []*node
	for _, c := range []string{movingCallee, stayingCallee} {
		ups[c] = newUpstream(t, runFor)
		for i := range 2 {
			id := fmt.Sprintf("sidecar-%s-%d", c, i+1)
			// The sidecars start with the default count, 1: shard 0's
			// answer sends echo's to shard 1.
			p := start(t, id, "sidecar", "--id="+id, "--service="+c, "--zone=zone-a", "--upstream="+ups[c].srv.URL,
				"--aggregators="+aggNode.addr, "--controllers="+tmpl, "--listen=127.0.0.1:0", "--admin-addr=127.0.0.1:0")
			n := &node{proc: p, admin: p.addr(t, "admin"), addr: p.addr(t, "http")}
			sidecars[c] = append(sidecars[c], n)
			all = append(all, n)
		}
	}
	for c, ns := range sidecars {
		for _, n := range ns {
			waitReady(t, n.proc, n.admin)
			testkit.WaitFor(t, startTimeout, n.Name()+" holds "+c+"'s policy from its owner", func() bool {
				_, ok := metric(t, n.admin, "sluice_sidecar_drop_ratio", `peer="web"`)
				return ok
			})
		}
	}
	// Each shard published its own callee only.
	for i, own := range []string{movingCallee, stayingCallee} {
		other := []string{stayingCallee, movingCallee}[i]
		if policy(t, ctls[i].admin, "callee/"+own) == nil || policy(t, ctls[i].admin, "callee/"+other) != nil {
			t.Fatalf("shard %d of 2 must publish callee/%s and not callee/%s", i, own, other)
		}
	}

	loads := map[string]*faultLoad{}
	for c, ns := range sidecars {
		loads[c] = runLoad(t, runFor, targets(ns), ups[c])
	}
	begin := loads[movingCallee].begin
	// Every second: how many sidecars hold an expired policy.
	expired := make([]float64, runFor)
	sm := loads[movingCallee].sample(t, func(s int) error {
		for _, n := range all {
			v, err := scrape(n.admin, "sluice_sidecar_policy_state", `state="expired"`)
			if err != nil {
				return err
			}
			if !math.IsNaN(v) {
				expired[s] += v
			}
		}
		return nil
	})

	// Shard 1 dies and comes back with the same count.
	loads[movingCallee].at(killAt)
	kill9(t, ctls[1])
	ctls[1] = startShard(1, 2, "5s")
	t.Logf("shard 1 restarted at t=%.1fs", time.Since(begin).Seconds())

	// The reshard: as a StatefulSet scaled from 2 to 3 with the count in
	// its pods' arguments does it, the new pod first, then the others
	// from the highest ordinal down, each after the last is ready.
	loads[movingCallee].at(reshardAt)
	ctls = append(ctls, startShard(2, 3, "5s"))
	for _, i := range []int{1, 0} {
		ctls[i].stop(t)
		ctls[i] = startShard(i, 3, "5s")
	}
	t.Logf("resharded to 3 by t=%.1fs", time.Since(begin).Seconds())
	testkit.WaitFor(t, startTimeout, movingCallee+"'s sidecars subscribe at shard 2", func() bool {
		streams, _ := metric(t, ctls[2].admin, "sluice_controller_xds_streams")
		return streams == float64(len(sidecars[movingCallee]))
	})
	if p := policy(t, ctls[0].admin, "callee/"+movingCallee); p != nil {
		t.Errorf("shard 0 of 3 still publishes callee/%s", movingCallee)
	}

	sm.check(t)
	for c, l := range loads {
		l.wait(t, func(s int) string {
			if c != movingCallee {
				return ""
			}
			return fmt.Sprintf("%s | sidecars expired: %v", c, expired[s])
		})
	}
	for _, c := range []string{movingCallee, stayingCallee} {
		l := loads[c]
		l.checkSteady(t, c+", both shards up", settleFrom, killAt)
		l.checkBatch(t)
	}
	loads[movingCallee].checkSteady(t, movingCallee+" (shard 0) while shard 1 was killed and restarted", killAt, reshardAt)
	for _, c := range []string{movingCallee, stayingCallee} {
		loads[c].checkSteady(t, c+" after the reshard to 3", settleAgain, runFor)
	}
	// Through the kill and the reshard no second strays far: the callee
	// that moved was computed by a new shard from its first load there.
	for _, c := range []string{movingCallee, stayingCallee} {
		for s := killAt; s < runFor; s++ {
			if n := float64(loads[c].web(s)); n < 0.5*faultLimit || n > 2*faultLimit {
				t.Errorf("%s, t=%ds: web admitted %v, want within 0.5..2 × the limit %v", c, s, n, faultLimit)
			}
		}
		t.Logf("FIGURE sharded controllers: %s's worst second from the kill on admitted %d (limit %v)", c, loads[c].peak(killAt, runFor), faultLimit)
	}
	for s, n := range expired {
		if n > 0 {
			t.Errorf("t=%ds: %v sidecars held an expired policy; a shard's restart or a reshard must expire none", s, n)
		}
	}
	for _, n := range sidecars[movingCallee] {
		if moves, _ := metric(t, n.admin, "sluice_sidecar_xds_shard_moves_total"); !(moves >= 1) {
			t.Errorf("%s: sluice_sidecar_xds_shard_moves_total = %v, want ≥ 1 (it moved to shard 2)", n.Name(), moves)
		}
	}
	if n, _ := metric(t, aggNode.admin, "sluice_aggregator_controller_connected"); n != 3 {
		t.Errorf("aggregator: connected to %v controller shards, want 3", n)
	}

	for _, n := range all {
		n.stop(t)
	}
	aggNode.stop(t)
	for _, c := range ctls {
		c.stop(t)
	}
	for _, u := range ups {
		u.srv.Close()
	}
	base.check(t)
}
