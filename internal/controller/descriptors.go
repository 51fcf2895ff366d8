package controller

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/limits"
	"github.com/sluicehq/sluice/pkg/descriptor"
	"github.com/sluicehq/sluice/pkg/dropratio"
	"github.com/sluicehq/sluice/pkg/uplink"
)

// Descriptors (issue #15): per (service, descriptor, value), the global
// offered rate is the sum over live zones of what each zone's aggregator
// reported of the value, and its ratio is the control law's for a single
// bucket with the value's limit, run in a Law of its own (descLaw) so that
// fast attack, slow release, MinRate and PMax are the callers'. No state is
// kept per value beyond the zone loads themselves (each bounded by
// MaxDescriptorValues per descriptor), the law's ratios above zero, which
// only values that were in those loads can have, and the compliant values
// listed at the last tick (State.held, as bounded as the list).

// DefaultMaxDescriptorValues is the default of StateConfig's
// MaxDescriptorValues, the figure.
const DefaultMaxDescriptorValues = 1024

// MaxDescriptorValuesBound is the highest MaxDescriptorValues may be: every
// sidecar of the service holds each value of each of its descriptors.
const MaxDescriptorValuesBound = 65536

// maxDescriptorHold bounds StateConfig's DescriptorHold: a value held
// longer is more likely gone than flapping.
const maxDescriptorHold = time.Hour

// The reasons a descriptor entry, or a value of one, is left out of a zone
// load; metric labels.
const (
	// ReasonDescriptorOutbound: descriptors are decided inbound only.
	ReasonDescriptorOutbound = "outbound"
	// ReasonDescriptorName: the name fails descriptor.CheckName.
	ReasonDescriptorName = "bad_name"
	// ReasonDescriptorDuplicate: the service entry lists the name twice.
	ReasonDescriptorDuplicate = "duplicate_descriptor"
	// ReasonDescriptorTooMany: beyond descriptor.MaxPerService.
	ReasonDescriptorTooMany = "too_many_descriptors"
	// ReasonDescriptorRate: offered or dropped is not a rate, or dropped is
	// above offered.
	ReasonDescriptorRate = "bad_rate"
	// ReasonValue: a value no sidecar would report (descriptor.Value(v) !=
	// v, and not reserved).
	ReasonValue = "bad_value"
	// ReasonValueRate: a value's offered rate is not a rate.
	ReasonValueRate = "bad_value_rate"
	// ReasonValueDuplicate: the descriptor lists the value twice.
	ReasonValueDuplicate = "duplicate_value"
	// ReasonValueTooMany: beyond MaxDescriptorValues; the largest are kept.
	ReasonValueTooMany = "too_many_values"
)

// maxDescriptorValues is StateConfig's MaxDescriptorValues, its default
// when 0.
func (cfg StateConfig) maxDescriptorValues() int {
	if n := cfg.MaxDescriptorValues; n > 0 {
		return min(n, MaxDescriptorValuesBound)
	}
	return DefaultMaxDescriptorValues
}

// keepValidDescriptors removes from svc, in place, its bad descriptor
// entries and the bad values of the others, and counts each by reason in
// d. A duplicated name or value is removed every time it appears: neither
// copy is known to be right (as keepValidServices does). Of more than max
// values, the reserved ones are kept, then the largest by offered rate,
// ties by value, as rankValues would list them, so that an aggregator with
// a larger bound than this controller loses its least values only.
func keepValidDescriptors(svc *sluicev1.ServiceLoad, max int, d *Dropped) {
	ds := svc.GetDescriptors()
	if len(ds) == 0 {
		return
	}
	if svc.GetDirection() != sluicev1.Direction_DIRECTION_INBOUND {
		d.addDescriptor(ReasonDescriptorOutbound, len(ds), "%s: descriptors on an outbound entry", uplink.Truncate(svc.GetService()))
		svc.Descriptors = nil
		return
	}
	count := make(map[string]int, len(ds))
	for _, dr := range ds {
		count[dr.GetDescriptor_()]++
	}
	kept := ds[:0]
	for _, dr := range ds {
		name := dr.GetDescriptor_()
		off, drop := dr.GetOfferedRps(), dr.GetDroppedRps()
		switch {
		case descriptor.CheckName(name) != nil:
			d.addDescriptor(ReasonDescriptorName, 1, "%s: descriptor %q", uplink.Truncate(svc.GetService()), uplink.Truncate(name))
		case count[name] > 1:
			d.addDescriptor(ReasonDescriptorDuplicate, 1, "%s: descriptor %s listed %d times", uplink.Truncate(svc.GetService()), name, count[name])
		case len(kept) == descriptor.MaxPerService:
			d.addDescriptor(ReasonDescriptorTooMany, 1, "%s: descriptor %s beyond %d", uplink.Truncate(svc.GetService()), name, descriptor.MaxPerService)
		case !isRate(off) || !isRate(drop) || drop > off*(1+dropSlack)+dropSlack:
			d.addDescriptor(ReasonDescriptorRate, 1, "%s: descriptor %s: offered_rps %v, dropped_rps %v", uplink.Truncate(svc.GetService()), name, off, drop)
		default:
			keepValidValues(dr, max, d)
			kept = append(kept, dr)
		}
	}
	clear(ds[len(kept):])
	svc.Descriptors = kept
}

// keepValidValues removes the bad values of dr, in place, counting them
// in d, and keeps at most max of the others.
func keepValidValues(dr *sluicev1.DescriptorRates, max int, d *Dropped) {
	vs := dr.GetValues()
	count := make(map[string]int, len(vs))
	for _, v := range vs {
		count[v.GetValue()]++
	}
	kept := vs[:0]
	for _, v := range vs {
		val := v.GetValue()
		switch {
		case descriptor.Value(val) != val && !descriptor.Reserved(val):
			d.addDescriptor(ReasonValue, 1, "descriptor %s: value %q", dr.GetDescriptor_(), uplink.Truncate(val))
		case !isRate(v.GetOfferedRps()):
			d.addDescriptor(ReasonValueRate, 1, "descriptor %s: value %q: offered_rps %v", dr.GetDescriptor_(), uplink.Truncate(val), v.GetOfferedRps())
		case count[val] > 1:
			d.addDescriptor(ReasonValueDuplicate, 1, "descriptor %s: value %q listed %d times", dr.GetDescriptor_(), uplink.Truncate(val), count[val])
		default:
			kept = append(kept, v)
		}
	}
	if n := len(kept) - max; n > 0 {
		reserved := func(v *sluicev1.ValueRate) int {
			if descriptor.Reserved(v.GetValue()) {
				return 0
			}
			return 1
		}
		slices.SortFunc(kept, func(a, b *sluicev1.ValueRate) int {
			return cmp.Or(cmp.Compare(reserved(a), reserved(b)), cmp.Compare(b.GetOfferedRps(), a.GetOfferedRps()), strings.Compare(a.GetValue(), b.GetValue()))
		})
		d.addDescriptor(ReasonValueTooMany, n, "descriptor %s: %d values, at most %d", dr.GetDescriptor_(), len(kept), max)
		kept = kept[:max]
	}
	clear(vs[len(kept):])
	dr.Values = kept
}

// isRate reports whether v is a rate a zone load may carry.
func isRate(v float64) bool { return v >= 0 && v <= maxRate } // NaN fails

// addDescriptor counts n descriptor entries or values left out for reason,
// and keeps the first one's detail for a log line.
func (d *Dropped) addDescriptor(reason string, n int, format string, args ...any) {
	if d.BadDescriptors == nil {
		d.BadDescriptors = map[string]int{}
		d.FirstDescriptor = fmt.Sprintf(reason+": "+format, args...)
	}
	d.BadDescriptors[reason] += n
}

// descriptorKey names one descriptor of one service.
type descriptorKey struct{ service, descriptor string }

// lawName is the descriptor's service name in descLaw: a descriptor name
// has no '/', so it can not be mistaken for another pair's.
func (k descriptorKey) lawName() string { return k.service + "/" + k.descriptor }

// descriptorLoad is one descriptor's global load during a tick.
type descriptorLoad struct {
	offered, dropped float64
	zoneCut          uint64             // values the aggregators left out, summed
	values           map[string]float64 // offered rps per value, summed over zones
}

// sumDescriptors adds up, for every descriptor the limits give a service,
// the zone loads of the live aggregators in sorted aggregator order, so
// that replicas agree to the bit. A descriptor the limits do not give (a
// sidecar still on an older policy) is left out. Every configured
// descriptor has an entry, traffic or not, so that its policy carries its
// limits from the start.
func (s *State) sumDescriptors(set *limits.Set) map[descriptorKey]*descriptorLoad {
	out := map[descriptorKey]*descriptorLoad{}
	for _, name := range set.Services() {
		for _, d := range set.Service(name).Descriptors {
			out[descriptorKey{name, d.Name}] = &descriptorLoad{values: map[string]float64{}}
		}
	}
	if len(out) == 0 {
		return out
	}
	for _, id := range slices.Sorted(maps.Keys(s.aggs)) {
		for _, svc := range s.aggs[id].load.GetServices() {
			if svc.GetDirection() != sluicev1.Direction_DIRECTION_INBOUND {
				continue
			}
			for _, dr := range svc.GetDescriptors() {
				l := out[descriptorKey{svc.GetService(), dr.GetDescriptor_()}]
				if l == nil {
					continue
				}
				l.offered += dr.GetOfferedRps()
				l.dropped += dr.GetDroppedRps()
				l.zoneCut += uint64(dr.GetValuesCut())
				for _, v := range dr.GetValues() {
					l.values[v.GetValue()] += v.GetOfferedRps()
				}
			}
		}
	}
	return out
}

// valueLimit is the limit of value under d: its override, the missing
// limit for descriptor.Missing, else the descriptor's. descriptor.Invalid
// has none of its own.
func valueLimit(d *limits.Descriptor, value string) float64 {
	if l, ok := d.Overrides[value]; ok {
		return l
	}
	if value == descriptor.Missing {
		return d.Missing
	}
	return d.Limit
}

// DescriptorStat is what one tick listed of one descriptor, for metrics.
type DescriptorStat struct {
	Service, Descriptor string
	Listed              int     // values in the policy
	Cut                 int     // values with a verdict left out of it (MaxDescriptorValues)
	Abusive             int     // values with a ratio above 0, listed or not
	Held                int     // compliant values listed though no zone reported them (DescriptorHold)
	ZoneCut             uint64  // values the aggregators left out, summed over zones
	Offered, Dropped    float64 // over all values
}

// stepDescriptors runs descLaw over every configured descriptor at now, dt
// after the last tick, and renders each service's DescriptorPolicy list,
// sorted by name as the limits are.
func (s *State) stepDescriptors(now time.Time, dt time.Duration, set *limits.Set) (map[string][]*sluicev1.DescriptorPolicy, []DescriptorStat) {
	loads := s.sumDescriptors(set)
	keys := slices.SortedFunc(maps.Keys(loads), func(a, b descriptorKey) int {
		return cmp.Or(strings.Compare(a.service, b.service), strings.Compare(a.descriptor, b.descriptor))
	})
	input := make([]dropratio.Service, 0, len(keys))
	for _, k := range keys {
		d := findDescriptor(set.Service(k.service), k.descriptor)
		l := loads[k]
		svc := dropratio.Service{Name: k.lawName(), Capacity: math.Inf(1), Callers: make([]dropratio.Caller, 0, len(l.values))}
		for v, off := range l.values {
			svc.Callers = append(svc.Callers, dropratio.Caller{Name: v, Offered: off, Limit: valueLimit(d, v), Mode: dropratio.Enforce})
		}
		input = append(input, svc)
	}
	verdicts := map[string][]dropratio.Verdict{}
	for _, sv := range s.descLaw.Step(dt, input) {
		verdicts[sv.Service] = sv.Verdicts
	}
	policies := map[string][]*sluicev1.DescriptorPolicy{}
	stats := make([]DescriptorStat, 0, len(keys))
	var held map[descriptorKey]map[string]heldValue
	if s.cfg.DescriptorHold > 0 {
		held = make(map[descriptorKey]map[string]heldValue, len(keys))
	}
	for _, k := range keys {
		d := findDescriptor(set.Service(k.service), k.descriptor)
		vs := verdicts[k.lawName()]
		st := DescriptorStat{Service: k.service, Descriptor: k.descriptor,
			ZoneCut: loads[k].zoneCut, Offered: loads[k].offered, Dropped: loads[k].dropped}
		for _, v := range vs {
			if v.Ratio > 0 {
				st.Abusive++
			}
		}
		vs, holding := s.withHeld(k, d, vs, now)
		kept, cut := rankValues(vs, holding, s.cfg.maxDescriptorValues())
		st.Listed, st.Cut = len(kept), cut
		if held != nil {
			held[k] = s.nextHeld(k, d, kept, loads[k].values, holding, now)
			for _, v := range kept {
				if holding[v.Caller] {
					st.Held++
				}
			}
		}
		stats = append(stats, st)
		policies[k.service] = append(policies[k.service], descriptorPolicy(d, kept))
	}
	s.held = held
	return policies, stats
}

// heldValue is a compliant value listed at the last tick.
type heldValue struct {
	offered float64   // its offered rps at its last report, listed while held
	limit   float64   // its limit then; held only while it stays the same
	seen    time.Time // the last tick a zone reported it
}

// withHeld returns vs, the law's verdicts of k, with a verdict at ratio 0
// added for every value held for k that no zone reported and the law does
// not hold (it was compliant when last reported), and the set of those
// values: a value whose per-sidecar count hovers around the report
// threshold is reported in some windows and not in others, and a
// compliant one pinned to a sidecar (sticky routing) would lose requests
// to the local allowance in each of the others. A held value is one last
// reported less than DescriptorHold before now, under the limit it has now;
// its entry is the one listed when last reported (ratio 0, that offered
// rate), so holding it changes no policy and pushes none, while its expiry
// does. vs is sorted by value, as the law returns it.
func (s *State) withHeld(k descriptorKey, d *limits.Descriptor, vs []dropratio.Verdict, now time.Time) ([]dropratio.Verdict, map[string]bool) {
	prev := s.held[k]
	if len(prev) == 0 {
		return vs, nil
	}
	in := make(map[string]bool, len(vs))
	for _, v := range vs {
		in[v.Caller] = true
	}
	var holding map[string]bool
	out := vs
	for value, h := range prev {
		if in[value] || now.Sub(h.seen) >= s.cfg.DescriptorHold || valueLimit(d, value) != h.limit {
			continue
		}
		if holding == nil {
			holding = map[string]bool{}
			out = slices.Clip(vs) // never append into the law's array
		}
		holding[value] = true
		out = append(out, dropratio.Verdict{Caller: value, Offered: h.offered, Limit: h.limit, Mode: dropratio.Enforce})
	}
	if holding != nil {
		slices.SortFunc(out, func(a, b dropratio.Verdict) int { return strings.Compare(a.Caller, b.Caller) })
	}
	return out, holding
}

// nextHeld returns what to hold of k after this tick: the compliant values
// kept in its list that a zone reported (reported, their offered rps),
// seen now, and those held (holding), as they were. A value listed with a
// ratio above 0 is the law's to release, as any dropped value, and is not
// held; nor is a value the law lists at 0 on its way down without a report.
// Taken from the list, it is bounded by it.
func (s *State) nextHeld(k descriptorKey, d *limits.Descriptor, kept []dropratio.Verdict, reported map[string]float64, holding map[string]bool, now time.Time) map[string]heldValue {
	next := map[string]heldValue{}
	for _, v := range kept {
		switch {
		case v.Ratio > 0:
		case holding[v.Caller]:
			next[v.Caller] = s.held[k][v.Caller]
		default:
			if _, ok := reported[v.Caller]; ok {
				next[v.Caller] = heldValue{offered: v.Offered, limit: valueLimit(d, v.Caller), seen: now}
			}
		}
	}
	return next
}

func findDescriptor(lim *limits.Service, name string) *limits.Descriptor {
	for i := range lim.Descriptors {
		if lim.Descriptors[i].Name == name {
			return &lim.Descriptors[i]
		}
	}
	return nil // sumDescriptors keys only configured ones
}

// rankValues returns the values a policy lists, at most max, sorted by
// value, and how many it left out. First the reserved values (requests
// without the attribute or with an unusable one: few and often large),
// then the values being dropped, then compliant ones, then the held ones
// (withHeld), each by offered rate, largest first, ties by value. A
// compliant value listed at ratio 0 is exempt from the sidecars' local
// allowance, which protects a compliant value pinned to one sidecar
// (sticky routing) from being cut locally; a dropped value left out would
// be admitted up to the allowance, so those go before the compliant; a
// held value may be gone, so it goes last.
func rankValues(vs []dropratio.Verdict, held map[string]bool, max int) (kept []dropratio.Verdict, cut int) {
	if len(vs) <= max {
		return vs, 0 // sorted by value, as the law returns them
	}
	class := func(v *dropratio.Verdict) int {
		switch {
		case held[v.Caller]:
			return 3
		case descriptor.Reserved(v.Caller):
			return 0
		case v.Ratio > 0:
			return 1
		}
		return 2
	}
	order := slices.Clone(vs)
	slices.SortFunc(order, func(a, b dropratio.Verdict) int {
		return cmp.Or(cmp.Compare(class(&a), class(&b)), cmp.Compare(b.Offered, a.Offered), strings.Compare(a.Caller, b.Caller))
	})
	kept = order[:max]
	slices.SortFunc(kept, func(a, b dropratio.Verdict) int { return strings.Compare(a.Caller, b.Caller) })
	return kept, len(vs) - max
}

// descriptorPolicy renders d's limits and its listed values' verdicts.
func descriptorPolicy(d *limits.Descriptor, values []dropratio.Verdict) *sluicev1.DescriptorPolicy {
	p := &sluicev1.DescriptorPolicy{
		Name:            d.Name,
		Source:          d.Source.String(),
		LimitRps:        d.Limit,
		MissingLimitRps: d.Missing,
		Quantile:        d.Quantile,
		Values:          make([]*sluicev1.ValuePolicy, 0, len(values)),
	}
	for _, v := range slices.Sorted(maps.Keys(d.Overrides)) {
		p.Overrides = append(p.Overrides, &sluicev1.ValueLimit{Value: v, LimitRps: d.Overrides[v]})
	}
	for _, v := range values {
		p.Values = append(p.Values, &sluicev1.ValuePolicy{Value: v.Caller, DropRatio: v.Ratio, LimitRps: v.Limit, OfferedRps: v.Offered})
	}
	return p
}

// descriptorsDue reports whether a policy's descriptors changed enough
// from what was last published to push it now, by due's rules for peers:
// any change of the limits or of the values listed; a ratio that reaches
// or leaves zero; an admitted share that moves beyond th.
func descriptorsDue(old, cur []*sluicev1.DescriptorPolicy, th float64) bool {
	if len(old) != len(cur) {
		return true
	}
	for i, n := range cur {
		o := old[i]
		if o.GetName() != n.GetName() || o.GetSource() != n.GetSource() || o.GetLimitRps() != n.GetLimitRps() ||
			o.GetMissingLimitRps() != n.GetMissingLimitRps() || o.GetQuantile() != n.GetQuantile() ||
			!slices.EqualFunc(o.GetOverrides(), n.GetOverrides(), func(a, b *sluicev1.ValueLimit) bool {
				return a.GetValue() == b.GetValue() && a.GetLimitRps() == b.GetLimitRps()
			}) || len(o.GetValues()) != len(n.GetValues()) {
			return true
		}
		for j, nv := range n.GetValues() {
			ov := o.GetValues()[j]
			if ov.GetValue() != nv.GetValue() || ov.GetLimitRps() != nv.GetLimitRps() ||
				(ov.GetDropRatio() == 0) != (nv.GetDropRatio() == 0) {
				return true
			}
			oldAdmit, newAdmit := 1-ov.GetDropRatio(), 1-nv.GetDropRatio()
			if math.Abs(newAdmit-oldAdmit) > th*min(oldAdmit, newAdmit) {
				return true
			}
		}
	}
	return false
}
