package scale

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/sidecar"
	"github.com/sluicehq/sluice/sidecar/reporter"
)

// mesh is the simulated fleet: who calls whom at what rate, under which
// limit, and which sidecar reports to which aggregator. It also holds what
// the sidecars hold: the ratios of the last policy pushed to their service.
type mesh struct {
	services  []service
	sidecars  []sidecarInfo // grouped by service: services[i].sidecars indexes them
	aggs      []aggInfo
	byPolicy  map[string]int // policy resource name → service index
	byService map[string]int // service name → index
	set       *limits.Set
	probe     bucketRef // the largest surging bucket, followed second by second
	surging   int       // how many buckets surge
}

type service struct {
	name, policy string
	callers      []string       // sorted by name, as policies list them
	callerIdx    map[string]int // caller name → index into callers
	// procs are the service's procedures, one "" when it declares none;
	// procIdx indexes them. A leaf is a (caller, procedure) pair: leaf l
	// is caller l / len(procs), procedure l % len(procs), so a caller's
	// leaves are adjacent, in the order policies list them.
	procs   []string
	procIdx map[string]int
	base    []float64 // rps per leaf before surge and noise
	limit   []float64 // rps per leaf
	surge   []bool
	// ratio and shadow are what the service's sidecars hold, per leaf,
	// from the last policy pushed to them.
	ratio  []float64
	shadow []bool
	// sidecars indexes mesh.sidecars. perAgg counts them per aggregator,
	// and relayFanout is how many aggregators hold at least one: the
	// recipients of the policy when aggregators relay xDS to their zone.
	sidecars    []int32
	perAgg      []int32
	relayFanout int
}

type sidecarInfo struct {
	hdr reporter.Header
	agg int32
}

type aggInfo struct{ zone, id string }

type bucketRef struct{ svc, leaf int }

// leaf is the index of the (caller j, procedure p) leaf.
func (s *service) leaf(j, p int) int { return j*len(s.procs) + p }

// caller and proc name leaf l's caller and procedure.
func (s *service) caller(l int) string { return s.callers[l/len(s.procs)] }
func (s *service) proc(l int) string   { return s.procs[l%len(s.procs)] }

// procedureName is procedure k of every service: a gRPC full method, as a
// sidecar sees it.
func procedureName(k int) string { return fmt.Sprintf("/sim.Service/Method%02d", k) }

// serviceName is the name of service i. Twelve characters: names are on
// the wire in every report entry and policy entry, so their length is part
// of the bytes counted; real Kubernetes service names are often longer.
func serviceName(i int) string { return fmt.Sprintf("service-%04d", i) }

// newMesh builds the fleet for cfg. Everything random comes from rng, so a
// seed gives the same mesh.
func newMesh(cfg Config, rng *rand.Rand) *mesh {
	m := &mesh{byPolicy: make(map[string]int, cfg.Services), byService: make(map[string]int, cfg.Services)}
	for z := range cfg.Zones {
		for a := range cfg.AggregatorsPerZone {
			m.aggs = append(m.aggs, aggInfo{zone: fmt.Sprintf("zone-%d", z), id: fmt.Sprintf("agg-z%d-%d", z, a)})
		}
	}

	// Log-normal weights: a few big services and callers, many small
	// ones, as in real meshes.
	lognormal := func(n int) []float64 {
		w := make([]float64, n)
		var sum float64
		for i := range w {
			w[i] = math.Exp(cfg.Spread * rng.NormFloat64())
			sum += w[i]
		}
		for i := range w {
			w[i] /= sum
		}
		return w
	}
	svcWeight := lognormal(cfg.Services)
	pods := apportion(cfg.Sidecars, svcWeight)

	m.services = make([]service, cfg.Services)
	lim := make(map[string]*limits.Service, cfg.Services)
	for i := range m.services {
		s := &m.services[i]
		s.name = serviceName(i)
		s.policy = names.Callee(s.name)
		m.byPolicy[s.policy] = i
		m.byService[s.name] = i
		// The callers of service i are the next Callers services, sorted by
		// name (the order policies use), each with a log-normal share.
		callerWeight := lognormal(cfg.Callers)
		type caller struct {
			name string
			w    float64
		}
		cs := make([]caller, cfg.Callers)
		for j := range cs {
			cs[j] = caller{serviceName((i + 1 + j) % cfg.Services), callerWeight[j]}
		}
		slices.SortFunc(cs, func(a, b caller) int { return cmp.Compare(a.name, b.name) })
		n := cfg.Callers
		s.procs = []string{""}
		if cfg.Procedures > 0 {
			s.procs = make([]string, cfg.Procedures)
			for k := range s.procs {
				s.procs[k] = procedureName(k)
			}
		}
		s.procIdx = make(map[string]int, len(s.procs))
		for k, p := range s.procs {
			s.procIdx[p] = k
		}
		leaves := n * len(s.procs)
		s.callers, s.base, s.limit = make([]string, n), make([]float64, leaves), make([]float64, leaves)
		s.surge, s.ratio, s.shadow = make([]bool, leaves), make([]float64, leaves), make([]bool, leaves)
		s.callerIdx = make(map[string]int, n)
		ls := &limits.Service{
			Name: s.name, Capacity: math.Inf(1), DefaultLimit: math.Inf(1),
			Mode: dropratio.Enforce, FailMode: dataplane.FailOpen,
			Callers: make(map[string]limits.Bucket, n),
		}
		if cfg.Procedures > 0 {
			// Nested limits: each caller's limit across its procedures,
			// and each (caller, procedure) leaf's own, a share of it.
			ls.Declared = slices.Clone(s.procs)
			ls.Procedures = make(map[string]*limits.Procedure, len(s.procs))
			for _, p := range s.procs {
				ls.Procedures[p] = &limits.Procedure{Capacity: math.Inf(1), Callers: make(map[string]float64, n)}
			}
		}
		for j, c := range cs {
			s.callers[j] = c.name
			s.callerIdx[c.name] = j
			rate := cfg.RPS * svcWeight[i] * c.w
			ls.Callers[c.name] = limits.Bucket{Limit: rate * (1 + cfg.Headroom), Mode: dropratio.Enforce}
			for k, p := range s.procs {
				l := s.leaf(j, k)
				s.base[l] = rate / float64(len(s.procs))
				s.limit[l] = s.base[l] * (1 + cfg.Headroom)
				if cfg.Procedures > 0 {
					ls.Procedures[p].Callers[c.name] = s.limit[l]
				}
			}
		}
		lim[s.name] = ls
	}
	m.set = limits.NewSet(lim)

	// Sidecars: service i's pods are spread over the zones starting at zone
	// i mod Zones (so that one-pod services do not all land in zone 0), and
	// within a zone round-robin over its aggregators.
	next := make([]int, cfg.Zones)
	for i := range m.services {
		s := &m.services[i]
		s.perAgg = make([]int32, len(m.aggs))
		for k := range pods[i] {
			z := (i + k) % cfg.Zones
			a := z*cfg.AggregatorsPerZone + next[z]%cfg.AggregatorsPerZone
			next[z]++
			s.sidecars = append(s.sidecars, int32(len(m.sidecars)))
			m.sidecars = append(m.sidecars, sidecarInfo{
				hdr: reporter.Header{
					SidecarID: fmt.Sprintf("%s-%06d", s.name, k),
					Service:   s.name,
					Zone:      m.aggs[a].zone,
					Direction: sidecar.Inbound,
				},
				agg: int32(a),
			})
			if s.perAgg[a] == 0 {
				s.relayFanout++
			}
			s.perAgg[a]++
		}
	}

	// The surge: a random SurgeFraction of the buckets (at least one when
	// the fraction is above 0). The probe is the largest of them.
	nb := cfg.Buckets()
	k := int(math.Round(cfg.SurgeFraction * float64(nb)))
	if k == 0 && cfg.SurgeFraction > 0 {
		k = 1
	}
	m.surging = k
	m.probe = bucketRef{-1, -1}
	perSvc := nb / cfg.Services
	for _, b := range rng.Perm(nb)[:k] {
		ref := bucketRef{b / perSvc, b % perSvc}
		m.services[ref.svc].surge[ref.leaf] = true
		if m.probe.svc < 0 || m.base(ref) > m.base(m.probe) {
			m.probe = ref
		}
	}
	if m.probe.svc < 0 {
		// No surge: follow the largest bucket instead.
		m.probe = bucketRef{0, 0}
		for i := range m.services {
			for l := range m.services[i].base {
				if ref := (bucketRef{i, l}); m.base(ref) > m.base(m.probe) {
					m.probe = ref
				}
			}
		}
	}
	return m
}

// sidecarService returns the service of sidecar k.
func (m *mesh) sidecarService(k int) int {
	svc := m.sidecars[k].hdr.Service
	return m.byService[svc]
}

func (m *mesh) base(b bucketRef) float64 { return m.services[b.svc].base[b.leaf] }

// apportion splits total into len(w) integers of at least 1 each, the rest
// in proportion to w by largest remainder, so that they add up to total.
// Requires total >= len(w).
func apportion(total int, w []float64) []int {
	out := make([]int, len(w))
	rest := total - len(w)
	type rem struct {
		i int
		r float64
	}
	rems := make([]rem, len(w))
	given := 0
	for i, wi := range w {
		share := float64(rest) * wi
		out[i] = 1 + int(share)
		given += int(share)
		rems[i] = rem{i, share - math.Floor(share)}
	}
	// Largest remainders first; ties by index, so the result is fixed.
	slices.SortStableFunc(rems, func(a, b rem) int { return cmp.Compare(b.r, a.r) })
	for k := 0; given < rest; k++ {
		out[rems[k%len(rems)].i]++
		given++
	}
	return out
}
