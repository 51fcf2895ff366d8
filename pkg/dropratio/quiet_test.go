package dropratio

import (
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestQuietIsStep runs two laws side by side over random meshes with
// procedures, tiers, capacities and surges, round after round: one steps
// every service, the other asks Quiet first and steps only the rest, as
// the controller does. Their verdicts must be the same to the bit, every
// round, and so must what they hold.
func TestQuietIsStep(t *testing.T) {
	quiet, stepped := 0, 0
	for seed := range uint64(60) {
		r := rand.New(rand.NewPCG(seed, 20))
		full, incr := mustNew(t, DefaultConfig()), mustNew(t, DefaultConfig())
		base := randomHierarchy(r, 12, 10)
		if seed%2 == 0 {
			for i := range base {
				for j := range base[i].Callers {
					base[i].Callers[j].Tier = uint8(r.IntN(5))
				}
			}
		}
		for round := range 8 {
			in := onePerName(jitter(r, base, round))
			dt := time.Second
			if round == 0 {
				dt = 0
			}
			want := full.Step(dt, in)

			var got []ServiceVerdict
			var rest []Service
			for i := range in {
				v, ok := incr.Quiet(&in[i], nil)
				if !ok {
					rest = append(rest, in[i])
					stepped++
					continue
				}
				quiet++
				got = append(got, ServiceVerdict{Service: in[i].Name, Verdicts: v})
			}
			got = append(got, incr.Step(dt, rest)...)
			slices.SortFunc(got, func(a, b ServiceVerdict) int { return strings.Compare(a.Service, b.Service) })
			// Step lists every service of its input, Quiet only those it
			// drops nothing of; both list every one of in.
			if !reflect.DeepEqual(nonEmpty(got), nonEmpty(want)) {
				t.Fatalf("seed %d round %d: with Quiet\n%+v\nwithout\n%+v", seed, round, got, want)
			}
			if full.Len() != incr.Len() {
				t.Fatalf("seed %d round %d: holding %d buckets with Quiet, %d without", seed, round, incr.Len(), full.Len())
			}
		}
	}
	if quiet < 100 || stepped < 100 {
		t.Fatalf("%d quiet and %d stepped services: the meshes do not exercise both", quiet, stepped)
	}
}

// jitter is base with every offered rate scaled: in round 2 some
// services surge, in round 5 most calm down, otherwise a few per cent of
// noise, so that services go from quiet to dropping and back.
func jitter(r *rand.Rand, base []Service, round int) []Service {
	out := slices.Clone(base)
	for i := range out {
		out[i].Callers = slices.Clone(out[i].Callers)
		f := 0.3 + 0.1*r.Float64()
		switch {
		case round == 2 && r.IntN(3) == 0:
			f = 5
		case round >= 5:
			f = 0.05
		}
		for j := range out[i].Callers {
			out[i].Callers[j].Offered *= f * (0.98 + 0.04*r.Float64())
		}
	}
	return out
}

// onePerName keeps the first service of each name: Quiet takes a
// service whole, as the controller gives it.
func onePerName(in []Service) []Service {
	seen := map[string]bool{}
	var out []Service
	for _, s := range in {
		if !seen[s.Name] {
			seen[s.Name] = true
			out = append(out, s)
		}
	}
	return out
}

// nonEmpty drops services without verdicts, which Step lists and Quiet
// has no reason to.
func nonEmpty(in []ServiceVerdict) []ServiceVerdict {
	var out []ServiceVerdict
	for _, s := range in {
		if len(s.Verdicts) > 0 {
			out = append(out, s)
		}
	}
	return out
}
