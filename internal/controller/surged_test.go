package controller

import (
	"math/rand/v2"
	"slices"
	"testing"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/dropratio"
)

// surgedOracle is zoneSurged as it was first written: every bucket of
// both loads in a map, compared key by key. The merge must agree with it.
func surgedOracle(before, after *sluicev1.ZoneLoad) bool {
	type bucket struct {
		service, peer, procedure string
		tier                     sluicev1.Criticality
		dir                      sluicev1.Direction
	}
	rates := func(z *sluicev1.ZoneLoad) map[bucket]float64 {
		m := map[bucket]float64{}
		for _, svc := range z.GetServices() {
			for _, p := range svc.GetPeers() {
				m[bucket{svc.GetService(), p.GetPeer(), p.GetProcedure(), p.GetCriticality(), svc.GetDirection()}] = p.GetOfferedRps()
			}
		}
		return m
	}
	old, cur := rates(before), rates(after)
	for b, r := range cur {
		if dropratio.Jumped(old[b], r) {
			return true
		}
	}
	for b, r := range old {
		if _, ok := cur[b]; !ok && dropratio.Jumped(r, 0) {
			return true
		}
	}
	return false
}

// TestZoneSurgedAgreesWithTheOracle: over thousands of random pairs of
// valid zone loads (services and buckets that come and go, rates that
// move a little or jump, in both directions), the merge reports a surge
// exactly when comparing every bucket by key does.
func TestZoneSurgedAgreesWithTheOracle(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	services := []string{"api", "checkout", "search"}
	peers := []string{"batch", "mobile", "web"}
	procs := []string{"", "/a.B/C", "create-charge"}
	load := func(base map[string]float64, jump bool) (*sluicev1.ZoneLoad, map[string]float64) {
		z := &sluicev1.ZoneLoad{AggregatorId: "agg", Zone: "zone-a"}
		rates := map[string]float64{}
		for _, name := range services {
			for _, dir := range []sluicev1.Direction{sluicev1.Direction_DIRECTION_INBOUND, sluicev1.Direction_DIRECTION_OUTBOUND} {
				if base == nil && rng.IntN(4) == 0 || base != nil && rng.IntN(50) == 0 {
					continue // the service is absent from this load
				}
				svc := &sluicev1.ServiceLoad{Service: name, Direction: dir}
				for _, p := range peers {
					for _, q := range procs {
						for _, tier := range []sluicev1.Criticality{0, 2} {
							key := name + dir.String() + p + q + tier.String()
							r, ok := base[key]
							// The first load has two buckets in three; the
							// second keeps the first's but for a few, and
							// adds a few.
							if base == nil && rng.IntN(3) == 0 || base != nil && ok == (rng.IntN(100) == 0) {
								continue
							}
							switch {
							case !ok:
								r = float64(rng.IntN(200))
							case jump && rng.IntN(40) == 0:
								r *= 1 + 4*rng.Float64()
							default:
								r *= 0.9 + 0.2*rng.Float64()
							}
							rates[key] = r
							svc.Peers = append(svc.Peers, &sluicev1.PeerRate{Peer: p, Procedure: q, Criticality: tier, OfferedRps: r})
						}
					}
				}
				rng.Shuffle(len(svc.Peers), func(i, j int) { svc.Peers[i], svc.Peers[j] = svc.Peers[j], svc.Peers[i] })
				z.Services = append(z.Services, svc)
			}
		}
		rng.Shuffle(len(z.Services), func(i, j int) { z.Services[i], z.Services[j] = z.Services[j], z.Services[i] })
		for _, svc := range z.Services {
			slices.SortFunc(svc.Peers, comparePeerRates) // as validation leaves them
		}
		return z, rates
	}
	surged, calm := 0, 0
	for range 5000 {
		before, rates := load(nil, false)
		after, _ := load(rates, rng.IntN(2) == 0)
		want := surgedOracle(before, after)
		if got := zoneSurged(before, after); got != want {
			t.Fatalf("zoneSurged = %v, the oracle says %v\nbefore %v\nafter %v", got, want, before, after)
		}
		if want {
			surged++
		} else {
			calm++
		}
	}
	t.Logf("%d surged and %d calm pairs", surged, calm)
	if surged < 500 || calm < 500 {
		t.Errorf("%d surged and %d calm pairs: the generator does not cover both", surged, calm)
	}
}
