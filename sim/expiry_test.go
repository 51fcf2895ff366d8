package sim

import (
	"math"
	"testing"
	"time"
)

// TestControllerOutage checks what controller-outage is there to show: with
// the controller down for longer than the policies' TTL, each callee's
// sidecars expire their policy about a TTL after the last tick before the
// stop and follow its fail mode — open decays the ratio linearly to 0 over
// 30 s, hold keeps it, local admits limit ÷ live instances at each sidecar —
// until the restarted controller's first policies, after which the limit
// holds again.
func TestControllerOutage(t *testing.T) {
	t.Parallel()
	sc := loadBuiltin(t, "controller-outage")
	var stop, down time.Duration
	for _, ev := range sc.Events {
		if ev.Kind == RestartController {
			stop, down = ev.At, ev.Down
		}
	}
	ttl, warmup := sc.Loop.Controller.PolicyTTL, sc.Loop.Controller.Warmup
	if down <= ttl {
		t.Fatalf("the scenario's controller is down %v, not longer than the %v TTL", down, ttl)
	}
	const decay = 30 * time.Second // sidecar.DefaultFailOpenDecay, which the controller publishes
	for _, seed := range []uint64{1, 2} {
		r := run(t, sc, seed)
		modes := map[string]Expiry{}
		for _, x := range r.Expiries {
			if _, dup := modes[x.Callee]; dup {
				t.Fatalf("seed %d: %s expired twice: %+v", seed, x.Callee, r.Expiries)
			}
			modes[x.Callee] = x
		}
		for _, b := range r.Buckets {
			x, ok := modes[b.Callee]
			if !ok {
				t.Fatalf("seed %d: %s: no expiry in %+v", seed, b.Callee, r.Expiries)
			}
			if want := b.Callee[len("svc-"):]; x.FailMode != want {
				t.Errorf("seed %d: %s: fail mode %s, want %s", seed, b.Callee, x.FailMode, want)
			}
			// The last policy came from one of the last ticks before the
			// stop (a tick whose change was under the republish
			// threshold sends none), and expires a TTL after it.
			if x.From < stop+ttl-3*time.Second || x.From > stop+ttl {
				t.Errorf("seed %d: %s expired at %v, want within 3s before %v", seed, b.Callee, x.From, stop+ttl)
			}
			// The restarted controller publishes after its warm-up, on
			// one of the next ticks.
			back := stop + down + warmup
			if x.To < back || x.To > back+2*time.Second {
				t.Errorf("seed %d: %s fresh again at %v, want within 2s after %v", seed, b.Callee, x.To, back)
			}
			first, last := int((x.From+Bin-1)/Bin), int(x.To/Bin)-1
			before := b.Ratio[first-2] // fresh, the ratio the sidecars enforced
			for i := first; i <= last; i++ {
				end := time.Duration(i+1) * Bin // the ratio is sampled at the end of the second
				switch x.FailMode {
				case "open":
					want := before * (1 - float64(end-x.From)/float64(decay))
					if math.Abs(b.Ratio[i]-want) > 0.01 {
						t.Errorf("seed %d: %s second %d: ratio %.3f, want the linear decay's %.3f", seed, b.Callee, i, b.Ratio[i], want)
					}
				case "hold":
					if b.Ratio[i] != before {
						t.Errorf("seed %d: %s second %d: ratio %v, want the %v held", seed, b.Callee, i, b.Ratio[i], before)
					}
				case "local":
					if b.Ratio[i] != 0 {
						t.Errorf("seed %d: %s second %d: ratio %v, want none (token buckets)", seed, b.Callee, i, b.Ratio[i])
					}
				}
			}
			if x.FailMode == "local" {
				// limit ÷ live instances per sidecar, every sidecar alike:
				// the limit, give or take the noise of the arrivals.
				if x.LiveInstances != 20 {
					t.Errorf("seed %d: %s: %d live instances in the expired policy, want its 20 sidecars", seed, b.Callee, x.LiveInstances)
				}
				mean := 0.0
				for i := first; i <= last; i++ {
					mean += b.Admitted[i]
				}
				mean /= float64(last - first + 1)
				if math.Abs(mean/b.Limit-1) > 0.01 {
					t.Errorf("seed %d: %s admitted %.0f rps while expired, want its limit %v within 1%%", seed, b.Callee, mean, b.Limit)
				}
			}
			// Enforced once the climb is over (the ratio follows a climb
			// of 2 % a second some 2 s late, 5–7 % over), until the
			// policy expires, and again from the second after the fresh
			// policy arrived.
			for i := range len(b.Admitted) {
				start := time.Duration(i) * Bin
				settled := start >= 18*time.Second && start+Bin <= x.From || start >= x.To+Bin
				if settled && math.Abs(b.Admitted[i]/b.Limit-1) > 0.05 {
					t.Errorf("seed %d: %s second %d: admitted %.0f rps, want its limit %v within 5%%", seed, b.Callee, i, b.Admitted[i], b.Limit)
				}
			}
		}
	}
}
