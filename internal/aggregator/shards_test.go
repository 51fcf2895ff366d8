package aggregator

import (
	"slices"
	"testing"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
)

// Every entry reaches its owner under each count in force, and no other
// shard; an outbound entry is cut by its peers; every shard gets a zone
// load, empty or not.
func TestSplitZoneLoad(t *testing.T) {
	// Owners at 2 and 3 shards (pkg/shard pins them): charlie 0 → 0,
	// foxtrot 0 → 2, bravo 1 → 2, echo 1 → 1.
	in := func(svc string) *sluicev1.ServiceLoad {
		return &sluicev1.ServiceLoad{Service: svc, Direction: sluicev1.Direction_DIRECTION_INBOUND, Peers: []*sluicev1.PeerRate{{Peer: "web"}}}
	}
	zl := &sluicev1.ZoneLoad{AggregatorId: "a", Zone: "z", Services: []*sluicev1.ServiceLoad{
		in("charlie"), in("foxtrot"), in("bravo"), in("echo"),
		{Service: "web", Direction: sluicev1.Direction_DIRECTION_OUTBOUND, Peers: []*sluicev1.PeerRate{{Peer: "charlie"}, {Peer: "echo"}}},
	}}
	names := func(z *sluicev1.ZoneLoad) (out []string) {
		for _, s := range z.GetServices() {
			n := s.GetService()
			if s.GetDirection() == sluicev1.Direction_DIRECTION_OUTBOUND {
				n += "→"
				for _, p := range s.GetPeers() {
					n += p.GetPeer() + ","
				}
			}
			out = append(out, n)
		}
		return out
	}
	for _, c := range []struct {
		counts []int
		want   [3][]string
	}{
		{[]int{2}, [3][]string{{"charlie", "foxtrot", "web→charlie,"}, {"bravo", "echo", "web→echo,"}, nil}},
		{[]int{3}, [3][]string{{"charlie", "web→charlie,"}, {"echo", "web→echo,"}, {"foxtrot", "bravo"}}},
		// A reshard under way: each callee to its owner under both.
		{[]int{2, 3}, [3][]string{{"charlie", "foxtrot", "web→charlie,"}, {"bravo", "echo", "web→echo,"}, {"foxtrot", "bravo"}}},
	} {
		parts := SplitZoneLoad(zl, 3, c.counts)
		for i, p := range parts {
			if p.GetAggregatorId() != "a" || p.GetZone() != "z" {
				t.Fatalf("counts %v: part %d lost the envelope", c.counts, i)
			}
			got := names(p)
			if len(got) != len(c.want[i]) {
				t.Errorf("counts %v: shard %d got %v, want %v", c.counts, i, got, c.want[i])
				continue
			}
			for j := range got {
				if got[j] != c.want[i][j] {
					t.Errorf("counts %v: shard %d got %v, want %v", c.counts, i, got, c.want[i])
					break
				}
			}
		}
	}
	if len(zl.GetServices()[4].GetPeers()) != 2 {
		t.Error("splitting changed the zone load it split")
	}
}

// The counts routed by are what the shards last said, for a while after
// they went quiet (a restart), and the configured one until any answered.
func TestLinksCounts(t *testing.T) {
	now := time.Now()
	var l links
	l.all = []*shardLink{{index: 0}, {index: 1}, {index: 2}}
	if got := l.counts(2, now); !slices.Equal(got, []int{2}) {
		t.Errorf("before any answer: %v, want the configured [2]", got)
	}
	say := func(i, n int, at time.Time) {
		l.all[i].announced.Store(int32(n))
		l.all[i].answered.Store(at.UnixNano())
	}
	say(0, 2, now.Add(-time.Second))
	say(1, 3, now.Add(-10*time.Second))
	if got := l.counts(2, now); !slices.Equal(got, []int{2, 3}) {
		t.Errorf("a reshard under way: %v, want [2 3]", got)
	}
	say(2, 3, now)
	say(1, 2, now.Add(-countMemory-time.Second)) // shard 1 said 2 long ago, and went
	if got := l.counts(9, now); !slices.Equal(got, []int{2, 3}) {
		t.Errorf("%v, want [2 3]: shard 0's 2 is recent", got)
	}
	say(0, 3, now)
	if got := l.counts(9, now); !slices.Equal(got, []int{3}) {
		t.Errorf("%v, want [3]: what shard 1 said is past countMemory", got)
	}
}
