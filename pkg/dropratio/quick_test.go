package dropratio

import (
	"math"
	"math/rand"
	"reflect"
	"slices"
	"strconv"
	"testing"
	"testing/quick"
)

// oracleShares is the naive max-min fair split: every round gives each
// caller that still wants more an equal part of what is left, and callers
// that need less than that part take only what they need.
func oracleShares(demands []float64, capacity float64) []float64 {
	shares := make([]float64, len(demands))
	var want []int
	for i, d := range demands {
		if d > 0 {
			want = append(want, i)
		}
	}
	left := capacity
	for len(want) > 0 && left > 0 {
		part := left / float64(len(want))
		var next []int
		for _, i := range want {
			if need := demands[i] - shares[i]; need <= part {
				shares[i] = demands[i]
				left -= need
			} else {
				next = append(next, i)
			}
		}
		if len(next) == len(want) {
			// Nobody was satisfied: everyone left takes an equal part and
			// the capacity is used up.
			for _, i := range want {
				shares[i] += part
			}
			break
		}
		want = next
	}
	return shares
}

// fairInput is a split problem with ties, zeros, and a capacity that binds
// more often than not.
type fairInput struct {
	Demands  []float64
	Capacity float64
}

func (fairInput) Generate(r *rand.Rand, size int) reflect.Value {
	in := fairInput{Demands: make([]float64, r.Intn(size+1))}
	scale := math.Pow(10, float64(r.Intn(12)-3))
	sum := 0.0
	for i := range in.Demands {
		switch r.Intn(4) {
		case 0:
			in.Demands[i] = 0
		case 1:
			in.Demands[i] = float64(r.Intn(5)) * scale // ties
		default:
			in.Demands[i] = r.ExpFloat64() * scale
		}
		sum += in.Demands[i]
	}
	in.Capacity = r.Float64() * sum * 1.3
	if r.Intn(10) == 0 {
		in.Capacity = 0
	}
	return reflect.ValueOf(in)
}

func closeRel(a, b float64) bool {
	return math.Abs(a-b) <= 1e-9*math.Max(math.Abs(a), math.Abs(b))
}

func TestWaterLevelAgainstOracle(t *testing.T) {
	f := func(in fairInput) bool {
		want := oracleShares(in.Demands, in.Capacity)
		level := waterLevel(slices.Clone(in.Demands), in.Capacity)
		sum := 0.0
		for i, d := range in.Demands {
			got := min(d, level)
			sum += got
			if !closeRel(got, want[i]) {
				t.Logf("demand %v: share %v, oracle %v (level %v)", d, got, want[i], level)
				return false
			}
		}
		if !math.IsInf(level, 1) && !closeRel(sum, in.Capacity) {
			t.Logf("shares sum to %v, capacity %v", sum, in.Capacity)
			return false
		}
		return true
	}
	if err := quick.Check(f, &quick.Config{MaxCount: 5000}); err != nil {
		t.Error(err)
	}
}

// stepInput is one service for Step: offered rates and limits, some callers
// under their limit, some over, a capacity that often binds.
type stepInput struct {
	Callers  []Caller
	Capacity float64
}

func (stepInput) Generate(r *rand.Rand, size int) reflect.Value {
	in := stepInput{Callers: make([]Caller, 1+r.Intn(size+1))}
	sum := 0.0
	for i := range in.Callers {
		c := &in.Callers[i]
		c.Name = strconv.Itoa(i)
		c.Offered = r.ExpFloat64() * 100
		c.Limit = inf
		switch r.Intn(3) {
		case 0:
			c.Limit = r.Float64() * 150
		case 1:
			c.Limit = c.Offered * r.Float64() * 0.5
		}
		if r.Intn(4) == 0 {
			c.Mode = Shadow
		}
		sum += min(c.Offered, c.Limit)
	}
	in.Capacity = r.Float64() * sum * 1.3
	return reflect.ValueOf(in)
}

// Through Step: when capacity binds, what callers admit fits in it, and no
// caller at or under the fair level is dropped for capacity.
func TestStepCapacityInvariants(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MinRate = 0 // a caller spared by MinRate may admit more than its share
	f := func(in stepInput) bool {
		l := mustNew(t, cfg)
		out := l.Step(0, []Service{{Name: "api", Capacity: in.Capacity, Callers: in.Callers}})
		demands := make([]float64, len(in.Callers))
		sum := 0.0
		for i, c := range in.Callers {
			demands[i] = min(c.Offered, c.Limit)
			sum += demands[i]
		}
		level := math.Inf(1)
		if sum > in.Capacity {
			shares := oracleShares(demands, in.Capacity)
			level = slices.Max(shares)
		}
		admitted, pmaxHit := 0.0, false
		byName := make(map[string]Caller)
		for _, c := range in.Callers {
			byName[c.Name] = c
		}
		for _, v := range out[0].Verdicts {
			c := byName[v.Caller]
			checkVerdict(t, cfg, v)
			admitted += v.Offered * (1 - v.Target)
			pmaxHit = pmaxHit || v.Target == cfg.PMax
			d := min(c.Offered, c.Limit)
			if d <= level*(1-1e-9) && v.Reason == OverCapacity {
				t.Logf("%s with demand %v under level %v dropped for capacity: %+v", c.Name, d, level, v)
				return false
			}
			if d > level*(1+1e-9) && v.Reason != OverCapacity {
				t.Logf("%s with demand %v over level %v not dropped for capacity: %+v", c.Name, d, level, v)
				return false
			}
		}
		if !math.IsInf(level, 1) && !pmaxHit && admitted > in.Capacity*(1+1e-9) {
			t.Logf("admitted %v exceeds capacity %v", admitted, in.Capacity)
			return false
		}
		return true
	}
	if err := quick.Check(f, &quick.Config{MaxCount: 2000}); err != nil {
		t.Error(err)
	}
}
