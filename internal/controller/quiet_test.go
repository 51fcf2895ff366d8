package controller

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/pkg/criticality"
)

// quietMeshLimits gives every kind of callee the tick treats apart: plain
// ones (per-caller limits, a default, a capacity, shadow and blocked
// callers, none at all), and ones whose policies are more than their
// verdicts (upstream enforcement, a cap in flight, a burst, procedures,
// tiers, cost, descriptors). The trickles' callers send under the law's
// MinRate, which spares them drops: over their capacities they are quiet
// with allowed rates and bounds that move with what the others send.
const quietMeshLimits = `
services:
  plain-a:
    capacity: 2400
    callers:
      c0: {limit: 300}
      c1: {limit: 300, mode: shadow}
      c2: {limit: 0}
  plain-b:
    default_limit: 400
    fail_mode: open
  plain-c:
    callers:
      c3: {limit: 250}
  upstream:
    enforcement: upstream
    default_limit: 300
  inflight:
    callers:
      c0: {limit: 300, max_concurrency: 20}
  burst:
    callers:
      c1: {limit: 300, burst: 600}
  procs:
    capacity: 1500
    default_limit: 400
    callers:
      c0: {limit: 300}
    procedures:
      /a.B/Get: {capacity: 600, callers: {c1: {limit: 100}}}
      /a.B/Put: {}
  tiers:
    capacity: 1200
    criticality: {default: CRITICAL}
    callers:
      c4: {limit: 400, criticality: SHEDDABLE}
  costly:
    unit: cost
    cost: {default: 2}
    callers:
      c5: {limit: 500}
  tenants:
    default_limit: 300
    descriptors:
      tenant: {from: header x-tenant, limit: 10}
  trickle:
    capacity: 2
    callers:
      c0: {limit: 0.6}
  trickle-procs:
    callers:
      c1: {limit: 0.7}
    procedures:
      /t.T/A: {capacity: 1.5, callers: {c2: {limit: 0.5}}}
      /t.T/B: {}
`

// quietMesh drives a mesh of every callee of quietMeshLimits plus unlisted
// ones, from two aggregators: each caller of each callee calm, surging or
// gone, switching now and then, with a few per cent of noise, so that
// callees go quiet, drop, release and go quiet again.
type quietMesh struct {
	r       *rand.Rand
	callees []string
	state   map[string]int // callee/caller: 0 calm, 1 surging, 2 gone, 3 drifting up a tenth
	base    map[string]float64
}

func newQuietMesh(seed uint64) *quietMesh {
	m := &quietMesh{r: rand.New(rand.NewPCG(seed, 20)), state: map[string]int{}, base: map[string]float64{}}
	m.callees = []string{"plain-a", "plain-b", "plain-c", "upstream", "inflight", "burst", "procs", "tiers", "costly", "tenants",
		"trickle", "trickle-procs", "unlisted-x", "unlisted-y"}
	for _, callee := range m.callees {
		for c := range 6 {
			m.base[fmt.Sprintf("%s/c%d", callee, c)] = 20 + 200*m.r.Float64()
		}
	}
	return m
}

// loads returns the two aggregators' zone loads of the next second.
func (m *quietMesh) loads() []*sluicev1.ZoneLoad {
	for k := range m.base {
		if m.r.IntN(12) == 0 {
			m.state[k] = m.r.IntN(4)
		}
	}
	var out []*sluicev1.ZoneLoad
	for a := range 2 {
		z := &sluicev1.ZoneLoad{AggregatorId: fmt.Sprintf("agg-%d", a), Zone: "z", Interval: durationpb.New(time.Second)}
		for _, callee := range m.callees {
			live := uint32(3)
			if m.r.IntN(40) == 0 {
				live = 4 // a sidecar comes and goes
			}
			sl := &sluicev1.ServiceLoad{Service: callee, Direction: sluicev1.Direction_DIRECTION_INBOUND, LiveSidecars: live}
			for c := range 6 {
				k := fmt.Sprintf("%s/c%d", callee, c)
				rate := m.base[k] * (0.97 + 0.06*m.r.Float64()) / 2
				switch m.state[k] {
				case 1:
					rate *= 6
				case 2:
					continue
				case 3:
					rate *= 1.12
				}
				p := &sluicev1.PeerRate{Peer: fmt.Sprintf("c%d", c), OfferedRps: rate}
				switch callee {
				case "trickle":
					p.OfferedRps = rate / 250
				case "procs", "trickle-procs":
					procs := []string{"/a.B/Get", "/a.B/Put"}
					if callee == "trickle-procs" {
						procs, rate = []string{"/t.T/A", "/t.T/B"}, rate/200
					}
					for _, proc := range procs {
						if leaf := k + proc; m.r.IntN(12) == 0 {
							m.state[leaf] = m.r.IntN(3)
						} else if m.state[leaf] == 2 {
							continue // a leaf without traffic, for a while
						}
						q := proto.Clone(p).(*sluicev1.PeerRate)
						q.Procedure, q.OfferedRps = proc, rate/2
						sl.Peers = append(sl.Peers, q)
					}
					continue
				case "tiers":
					// A caller's tier changes now and then, its count not.
					p.Criticality = sluicev1.Criticality(criticality.Critical)
					if m.state[k]%2 == 1 {
						p.Criticality = sluicev1.Criticality(criticality.Sheddable)
					}
				case "costly":
					p.OfferedCostRps, p.AdmittedCostRps = 2*rate, 2*rate
				}
				sl.Peers = append(sl.Peers, p)
			}
			if callee == "tenants" && m.r.IntN(3) == 0 {
				// Now and then a tenant worth listing, listed and then held.
				sl.Descriptors = []*sluicev1.DescriptorRates{{Descriptor_: "tenant", OfferedRps: 30,
					Values: []*sluicev1.ValueRate{{Value: "acme", OfferedRps: 20 + 10*m.r.Float64()}}}}
			}
			if len(sl.Peers) > 0 {
				z.Services = append(z.Services, sl)
			}
		}
		if a == 0 {
			// c1 enforces outbound toward two plain callees: its caller/
			// policy lists their buckets' verdicts, quiet ones included.
			z.Services = append(z.Services, &sluicev1.ServiceLoad{Service: "c1", Direction: sluicev1.Direction_DIRECTION_OUTBOUND, LiveSidecars: 2,
				Peers: []*sluicev1.PeerRate{{Peer: "plain-b", OfferedRps: 50 + 10*m.r.Float64()}, {Peer: "unlisted-x", OfferedRps: 30 + 10*m.r.Float64()}}})
		}
		out = append(out, z)
	}
	return out
}

// TestIncrementalTickIsFull runs two states side by side over random
// meshes: one ticks as the controller does, stepping and rendering only
// what changed (quiet.go), the other steps every callee and renders every
// policy. Every tick, they must publish the same policies, delete the
// same, and report the same loads; and the incremental one must have
// skipped work, or the comparison proves nothing. Halfway, the limits
// change (a new set, some services' limits changed, some the same), and
// later change back; every other mesh caps the peers a policy lists.
func TestIncrementalTickIsFull(t *testing.T) {
	parse := func(doc string) *limits.Set {
		set, err := limits.Parse(strings.NewReader(doc))
		if err != nil {
			t.Fatal(err)
		}
		return set
	}
	first := parse(quietMeshLimits)
	changed := parse(strings.NewReplacer("c3: {limit: 250}", "c3: {limit: 90}", "capacity: 2\n", "capacity: 3\n", "fail_mode: open", "fail_mode: hold").Replace(quietMeshLimits))
	var quiet, skipped, published int
	for seed := range uint64(12) {
		cfg := testConfig()
		if seed%2 == 1 {
			cfg.MaxPolicyPeers = 4
		}
		var states [2]*State
		for i := range states {
			s, err := NewState(cfg, t0)
			if err != nil {
				t.Fatal(err)
			}
			states[i] = s
		}
		full, incr := states[0], states[1]
		full.full = true
		m := newQuietMesh(seed)
		now := t0
		for second := range 90 {
			now = now.Add(time.Second)
			set := first
			if second >= 40 && second < 65 {
				set = changed
			}
			for _, z := range m.loads() {
				for _, s := range []*State{full, incr} {
					if err := s.Apply(proto.Clone(z).(*sluicev1.ZoneLoad), now); err != nil {
						t.Fatal(err)
					}
				}
			}
			want, got := full.Tick(now, set), incr.Tick(now, set)
			if !got.Warm {
				continue
			}
			where := fmt.Sprintf("seed %d second %d", seed, second)
			if len(got.Changed) != len(want.Changed) {
				t.Fatalf("%s: incremental tick published %v, full tick %v", where, slices.Sorted(maps.Keys(got.Changed)), slices.Sorted(maps.Keys(want.Changed)))
			}
			for name, p := range want.Changed {
				if !proto.Equal(p, got.Changed[name]) {
					t.Fatalf("%s: %s published\n%v\nfull tick\n%v", where, name, got.Changed[name], p)
				}
			}
			published += len(got.Changed)
			if !slices.Equal(got.Deleted, want.Deleted) || got.Buckets != want.Buckets ||
				!reflect.DeepEqual(got.Loads, want.Loads) || !reflect.DeepEqual(got.Services, want.Services) ||
				!reflect.DeepEqual(got.Shed, want.Shed) || !reflect.DeepEqual(got.Debts, want.Debts) {
				t.Fatalf("%s: incremental tick %+v\nfull tick %+v", where, got, want)
			}
			if want.Quiet != 0 || want.Rendered != len(want.Services) {
				t.Fatalf("%s: the full tick skipped work: %d quiet, %d rendered of %d", where, want.Quiet, want.Rendered, len(want.Services))
			}
			quiet += got.Quiet
			skipped += want.Rendered - got.Rendered
		}
	}
	t.Logf("%d quiet callees, %d policies not built, %d published", quiet, skipped, published)
	if quiet < 1000 || skipped < 1000 || published < 1000 {
		t.Fatalf("%d quiet callees, %d policies not built, %d published: the meshes do not exercise the incremental tick", quiet, skipped, published)
	}
}
