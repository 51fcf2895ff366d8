package shard

import (
	"fmt"
	"math"
	"testing"
)

// The owner of a callee is part of the protocol: aggregators, sidecars and
// controllers of different releases must agree on it. These values pin it.
func TestOwnerIsStable(t *testing.T) {
	golden := map[string][3]int{ // callee → owner at 2, 3, 8 shards
		"checkout": {0, 0, 0},
		"payments": {0, 0, 7},
		"search":   {1, 1, 1},
		"svc-0001": {1, 1, 1},
	}
	for n, want := range golden {
		if got := [3]int{Owner(n, 2), Owner(n, 3), Owner(n, 8)}; got != want {
			t.Errorf("owners of %q at 2, 3, 8 shards = %v, want %v: the owner function changed, and mixed releases would disagree", n, got, want)
		}
	}
	if Owner("checkout", 1) != 0 || Owner("checkout", 0) != 0 {
		t.Error("one shard (or none) must own everything")
	}
}

// Shards share the callees evenly: within 5 standard deviations of a
// binomial count over 110,000 names.
func TestOwnerIsBalanced(t *testing.T) {
	const names = 110_000
	for _, n := range []int{2, 3, 7, 16} {
		counts := make([]int, n)
		for i := range names {
			counts[Owner(fmt.Sprintf("svc-%d", i), n)]++
		}
		mean := float64(names) / float64(n)
		sd := math.Sqrt(mean * (1 - 1/float64(n)))
		for s, c := range counts {
			if math.Abs(float64(c)-mean) > 5*sd {
				t.Errorf("%d shards: shard %d owns %d callees, mean %.0f ± %.0f", n, s, c, mean, sd)
			}
		}
	}
}

// Growing from n to n+1 shards moves callees only to the new shard, about
// 1/(n+1) of them: a reshard moves what it must and nothing else.
func TestGrowingMovesOnlyToTheNewShard(t *testing.T) {
	const names = 30_000
	for n := 1; n < 10; n++ {
		moved := 0
		for i := range names {
			name := fmt.Sprintf("callee-%d", i)
			before, after := Owner(name, n), Owner(name, n+1)
			if before != after {
				moved++
				if after != n {
					t.Fatalf("%q moved from shard %d to %d going %d → %d shards", name, before, after, n, n+1)
				}
			}
		}
		want := float64(names) / float64(n+1)
		if math.Abs(float64(moved)-want) > 5*math.Sqrt(want) {
			t.Errorf("%d → %d shards moved %d callees, want about %.0f", n, n+1, moved, want)
		}
	}
}

func TestMap(t *testing.T) {
	for _, bad := range []Map{{}, {Index: 0, Count: 0}, {Index: 2, Count: 2}, {Index: -1, Count: 2}, {Index: 0, Count: MaxCount + 1}} {
		if bad.Validate() == nil {
			t.Errorf("%+v validated", bad)
		}
	}
	if err := Single.Validate(); err != nil {
		t.Fatal(err)
	}
	if !Single.Owns("anything") || Single.Sharded() {
		t.Error("the single shard must own every callee and not be sharded")
	}
	owners := 0
	for i := range 3 {
		if (Map{Index: i, Count: 3}).Owns("checkout") {
			owners++
		}
	}
	if owners != 1 {
		t.Errorf("%d of 3 shards own checkout, want exactly 1", owners)
	}
}

func TestAddrs(t *testing.T) {
	got := Addrs([]string{"ctl-a-{shard}.ctl:18000", "127.0.0.1:18000"}, 2)
	if got[0] != "ctl-a-2.ctl:18000" || got[1] != "127.0.0.1:18000" {
		t.Errorf("Addrs = %v", got)
	}
	if !Templated([]string{"x:1", "ctl-{shard}:1"}) || Templated([]string{"x:1"}) {
		t.Error("Templated")
	}
}

func BenchmarkOwner(b *testing.B) {
	for b.Loop() {
		Owner("checkout-service", 16)
	}
}
