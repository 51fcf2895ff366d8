package controller

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/shard"
)

// Two shards fed the same zone load and the same limits publish disjoint
// policies whose union is the unsharded controller's, each marked with its
// shard; the entries another shard owns are counted, not applied.
func TestShardsSplitTheCallees(t *testing.T) {
	// pkg/shard pins the owners at 2 shards: charlie and foxtrot 0, bravo
	// and echo 1.
	callees := []string{"bravo", "charlie", "echo", "foxtrot"}
	set := func() *limits.Set {
		m := map[string]*limits.Service{}
		for _, c := range append(callees, "golf") { // golf (1 of 2) has limits and no traffic
			m[c] = &limits.Service{Name: c, Capacity: math.Inf(1), DefaultLimit: math.Inf(1), FailMode: dataplane.FailOpen,
				Callers: map[string]limits.Bucket{"web": {Limit: 100, Mode: dropratio.Enforce}}}
		}
		return limits.NewSet(m)
	}()
	load := func() *sluicev1.ZoneLoad {
		rates := map[string]float64{}
		for i, c := range callees {
			rates[c+"/web"] = 150 + 50*float64(i)
		}
		z := zoneLoad("agg-a", "zone-a", 2, rates)
		// An outbound entry: web's calls to charlie (shard 0) and echo (1).
		z.Services = append(z.Services, &sluicev1.ServiceLoad{Service: "web", Direction: sluicev1.Direction_DIRECTION_OUTBOUND, LiveSidecars: 1,
			Peers: []*sluicev1.PeerRate{{Peer: "charlie", OfferedRps: 1}, {Peer: "echo", OfferedRps: 1}}})
		return z
	}
	run := func(m shard.Map) (map[string]*sluicev1.DropPolicy, Dropped) {
		cfg := testConfig()
		cfg.Shard = m
		s, err := NewState(cfg, t0)
		if err != nil {
			t.Fatal(err)
		}
		now := t0.Add(3 * time.Second)
		if err := s.Apply(load(), now); err != nil {
			t.Fatal(err)
		}
		d := s.TakeDropped()
		return s.Tick(now.Add(2*time.Second), set).Changed, d
	}

	whole, _ := run(shard.Map{})
	seen := map[string]int{}
	for i := range 2 {
		m := shard.Map{Index: i, Count: 2}
		got, dropped := run(m)
		var want []string
		for _, c := range append(callees, "golf") {
			if m.Owns(c) {
				want = append(want, "callee/"+c)
			}
		}
		if names := slices.Sorted(func(yield func(string) bool) {
			for n := range got {
				if !yield(n) {
					return
				}
			}
		}); !slices.Equal(names, want) {
			t.Errorf("shard %v published %v, want %v (no caller/ policies: those span shards)", m, names, want)
		}
		// 2 of the 4 inbound entries, 1 of the 2 outbound peers.
		if dropped.NotOwned != 3 {
			t.Errorf("shard %v: %d entries not owned, want 3", m, dropped.NotOwned)
		}
		for name, p := range got {
			seen[name]++
			if si := p.GetShard(); si.GetIndex() != uint32(i) || si.GetCount() != 2 || !si.GetOwner() {
				t.Errorf("shard %v: %s carries shard %v", m, name, si)
			}
			// Apart from the mark, the shard's policy is the unsharded one.
			w := proto.CloneOf(whole[name])
			p = proto.CloneOf(p)
			p.Shard, p.IssuedAt, w.IssuedAt = nil, nil, nil
			if !proto.Equal(p, w) {
				t.Errorf("shard %v: %s differs from the unsharded controller's:\n%v\nwant\n%v", m, name, p, w)
			}
		}
	}
	for name := range whole {
		if name == "caller/web" {
			continue
		}
		if seen[name] != 1 {
			t.Errorf("%s published by %d shards, want 1", name, seen[name])
		}
	}
	if whole["callee/foxtrot"].GetShard() != nil {
		t.Error("an unsharded controller marks its policies with a shard")
	}
}

// shard-of prints each callee's owner, as the shards compute it, and
// refuses a bad count or name.
func TestShardOfCommand(t *testing.T) {
	run := func(args ...string) (string, error) {
		cmd := ShardOfCommand()
		var out strings.Builder
		cmd.SetOut(&out)
		cmd.SetErr(io.Discard)
		cmd.SetArgs(args)
		err := cmd.Execute()
		return out.String(), err
	}
	out, err := run("--shards", "3", "foxtrot", "echo")
	if err != nil || out != fmt.Sprintf("foxtrot\t%d\necho\t%d\n", shard.Owner("foxtrot", 3), shard.Owner("echo", 3)) {
		t.Errorf("shard-of: %q, %v", out, err)
	}
	if _, err := run("--shards", "0", "x"); err == nil || !strings.Contains(err.Error(), "shards") {
		t.Errorf("--shards 0: %v, want an error naming shards", err)
	}
	if _, err := run("--shards", "2", "Not A Name"); err == nil {
		t.Error("an invalid callee name was accepted")
	}
}
