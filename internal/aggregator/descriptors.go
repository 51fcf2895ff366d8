package aggregator

import (
	"cmp"
	"maps"
	"slices"
	"strings"
	"time"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/internal/zoneload"
	"github.com/sluicehq/sluice/pkg/descriptor"
)

// Descriptors (DESIGN.md, "The bucket, widened"; pkg/descriptor): a
// sidecar reports, per descriptor of its policy, its totals and the heavy
// values of its sketch; the aggregator keeps each live sidecar's latest
// ones as it keeps its peers, and the zone load carries their sums per
// (service, descriptor), cut to the largest Bounds.MaxDescriptorValues.
// The aggregator keeps no state per value beyond the sidecars' reports.

// Reasons a descriptor entry, or a value of one, is left out of an
// accepted report, the rest kept. Metric label values, as
// EntryBadProcedure. A value's rate left out is lost to the zone's value
// sums but stays in its descriptor's offered rate.
const (
	EntryBadDescriptor       = "bad_descriptor"        // its name fails descriptor.CheckName
	EntryBadDescriptorCounts = "bad_descriptor_counts" // dropped above offered, or an offered rate above MaxRate
	EntryDuplicateDescriptor = "duplicate_descriptor"  // a name listed again: the first is kept
	EntryTooManyDescriptors  = "too_many_descriptors"  // beyond descriptor.MaxPerService good ones
	EntryOutboundDescriptor  = "outbound_descriptor"   // in an outbound report: descriptors limit callees' inbound requests only
	EntryBadValue            = "bad_value"             // not what a sidecar sends: descriptor.Value(v) != v
	EntryDuplicateValue      = "duplicate_value"       // a value listed again in one descriptor: the first is kept
	EntryTooManyValues       = "too_many_values"       // beyond MaxReportValues in one descriptor
	EntryQuotaValues         = "quota_values"          // beyond its identity's MaxValuesPerIdentity: the smallest of the report
)

// maxZoneDescriptors bounds the descriptors of one (service, direction) in
// a zone load: its sidecars report the names of their policy, at most
// descriptor.MaxPerService, and for a while after a policy change the old
// names beside the new. More are made up; the largest by offered rate
// are kept (State.DescriptorsCut counts the rest), so that a service's
// part of the zone load stays bounded whatever its sidecars claim.
const maxZoneDescriptors = 2 * descriptor.MaxPerService

// maxValuesBound bounds MaxReportValues and MaxDescriptorValues: far
// above a sidecar's heavy set (pkg/heavy's default K is 256), low enough
// that a report and a zone load stay a few megabytes (see size.go).
const maxValuesBound = 1 << 16

// descriptorRate is one descriptor of a sidecar's latest report, as rates.
type descriptorRate struct {
	name             string
	offered, dropped float64     // requests per second, every value's
	values           []valueRate // sorted by value, each once
}

type valueRate struct {
	value   string
	offered float64 // requests per second
}

// checkDescriptors checks r's descriptors entry by entry and returns the
// good ones as rates, in the report's order, counting in bad what it left
// out. It never rejects the report: a bad entry costs only itself.
func (s *State) checkDescriptors(r *sluicev1.LoadReport, bad *RejectedEntries) []descriptorRate {
	ds := r.GetDescriptors()
	if len(ds) == 0 {
		return nil
	}
	if r.GetDirection() != sluicev1.Direction_DIRECTION_INBOUND {
		bad.OutboundDescriptor += len(ds)
		return nil
	}
	secs := r.GetWindow().AsDuration().Seconds()
	if dw := r.GetDescriptorWindow(); dw != nil {
		// The sketch's window, which a surge report does not cut short:
		// at least the report's, at most the longest window taken.
		w := dw.AsDuration()
		if dw.CheckValid() != nil || w < r.GetWindow().AsDuration() || w > s.bounds.MaxWindow {
			bad.BadDescriptorCounts += len(ds)
			return nil
		}
		secs = w.Seconds()
	}
	out := make([]descriptorRate, 0, min(len(ds), descriptor.MaxPerService))
	for _, d := range ds {
		name := d.GetDescriptor_()
		switch {
		case descriptor.CheckName(name) != nil:
			bad.BadDescriptor++
			continue
		case slices.ContainsFunc(out, func(o descriptorRate) bool { return o.name == name }):
			bad.DuplicateDescriptor++
			continue
		case len(out) == descriptor.MaxPerService:
			bad.TooManyDescriptors++
			continue
		}
		o, dr := d.GetOffered(), d.GetDropped()
		if dr > o || float64(o)/secs > s.bounds.MaxRate {
			bad.BadDescriptorCounts++
			continue
		}
		out = append(out, descriptorRate{
			name:    name,
			offered: float64(o) / secs,
			dropped: float64(dr) / secs,
			values:  s.checkValues(d.GetValues(), o, secs, bad),
		})
	}
	return out
}

// checkValues checks a descriptor's values, whose offered total is total
// over secs, and returns the good ones as rates, sorted by value. Only the
// first MaxReportValues entries are looked at: the work a report costs is
// bounded by the bound, not by what it lists. A value counting more than
// its descriptor's total (a sketch over-counts only by what the values
// sharing its line counted, never past the window's requests) is clamped
// to the total.
func (s *State) checkValues(vs []*sluicev1.ValueCounts, total uint64, secs float64, bad *RejectedEntries) []valueRate {
	if n := len(vs) - s.bounds.MaxReportValues; n > 0 {
		bad.TooManyValues += n
		vs = vs[:s.bounds.MaxReportValues]
	}
	out := make([]valueRate, 0, len(vs))
	for _, v := range vs {
		val := v.GetValue()
		if descriptor.Value(val) != val { // empty, too long, not UTF-8 (reserved values map to themselves)
			bad.BadValue++
			continue
		}
		o := v.GetOffered()
		if o > total {
			o = total
			bad.ValueClamped++
		}
		out = append(out, valueRate{value: val, offered: float64(o) / secs})
	}
	// Stable: of a value listed twice, the first is kept.
	slices.SortStableFunc(out, func(a, b valueRate) int { return strings.Compare(a.value, b.value) })
	kept := out[:0]
	for _, v := range out {
		if len(kept) > 0 && kept[len(kept)-1].value == v.value {
			bad.DuplicateValue++
			continue
		}
		kept = append(kept, v)
	}
	if len(kept) < cap(out) {
		// The sidecar holds what it keeps: its share of MaxValuesPerIdentity
		// counts values, so no room for the ones left out stays behind.
		return slices.Clone(kept)
	}
	return kept
}

// capValues makes descs, a report's checked descriptors, fit the values
// its identity (il, nil for none yet) may hold once they replace its
// sidecar's old ones (old, nil for a new sidecar), and returns them. It
// never rejects: the values beyond MaxValuesPerIdentity are left out and
// counted in bad (EntryQuotaValues), their rates staying in their
// descriptors' totals. The reserved values are always kept, then the
// report's values by largerRanked: the largest, whichever descriptor they
// belong to, since a value that matters to a limit is a heavy one, and a
// flood of made-up values spreads thin. Only the report's own values
// compete: what the identity's other sidecars hold stays theirs, so a
// flood costs the sidecars that came last and only their identity.
func (s *State) capValues(il *identityLoad, old *sidecarLoad, descs []descriptorRate, bad *RejectedEntries) []descriptorRate {
	n := heldValues(descs)
	others := 0
	if il != nil {
		others = il.values
	}
	if old != nil {
		others -= heldValues(old.descriptors)
	}
	room := max(0, s.bounds.MaxValuesPerIdentity-others)
	if n <= room {
		return descs
	}
	bad.QuotaValues += n - room
	var cut rankedValue // the last value kept, if room > 0
	if room > 0 {
		ranked := make([]rankedValue, 0, n)
		for _, d := range descs {
			for _, v := range d.values {
				if !descriptor.Reserved(v.value) {
					ranked = append(ranked, rankedValue{d.name, v})
				}
			}
		}
		slices.SortFunc(ranked, largerRanked)
		cut = ranked[room-1]
	}
	for i := range descs {
		d := &descs[i]
		d.values = slices.Clone(slices.DeleteFunc(d.values, func(v valueRate) bool {
			return !descriptor.Reserved(v.value) && (room == 0 || largerRanked(rankedValue{d.name, v}, cut) > 0)
		}))
	}
	return descs
}

// rankedValue is a value of a report's descriptor, as capValues ranks it.
type rankedValue struct {
	descriptor string
	valueRate
}

// largerRanked orders values by offered rate, largest first, then by
// descriptor and value: a total order over a report's values, so that the
// same report and state keep the same ones.
func largerRanked(a, b rankedValue) int {
	return cmp.Or(cmp.Compare(b.offered, a.offered), strings.Compare(a.descriptor, b.descriptor), strings.Compare(a.value, b.value))
}

// heldValues counts the values of descs that MaxValuesPerIdentity counts:
// all but the reserved ones.
func heldValues(descs []descriptorRate) int {
	n := 0
	for _, d := range descs {
		n += len(d.values)
		for _, v := range d.values {
			if descriptor.Reserved(v.value) {
				n--
			}
		}
	}
	return n
}

// keepDescriptors returns the descriptors a sidecar keeps after report r
// replaced old (nil for a new sidecar), checked as descs, and when they
// were reported. An urgent report (a surge, sent before the interval was
// up) carries no descriptors when the sidecar's sketches have counted for
// less than half an interval since they were last reported (they count per
// report interval, and a surge window is a fraction of one). Such a report
// keeps the descriptors of the sidecar's last report that carried them,
// which stay in the sums as long as they are not stale by their own report
// time (descriptorsLive): a sidecar that only surges does not pin old
// values. Any other report replaces them, an empty list included, and so
// does an urgent one that carries descriptors (reporter.Window.sendUrgent).
func keepDescriptors(old *sidecarLoad, r *sluicev1.LoadReport, descs []descriptorRate, now time.Time) ([]descriptorRate, time.Time) {
	if r.GetUrgent() && len(r.GetDescriptors()) == 0 && old != nil &&
		old.service == r.GetService() && old.direction == r.GetDirection() {
		return old.descriptors, old.descriptorsSeen
	}
	return descs, now
}

// descriptorsLive reports whether sc's descriptors count at now: the
// sidecar's staleness, measured from their own report.
func (s *State) descriptorsLive(sc *sidecarLoad, now time.Time) bool {
	return len(sc.descriptors) > 0 && now.Sub(sc.descriptorsSeen) <= time.Duration(s.staleAfter)*sc.interval
}

// descriptorScratch is what Flush reuses from one flush to the next to sum
// the descriptors of one (service, direction): its cost is O(values the
// sidecars reported), with no allocation per value once warm. Flush's
// output is fresh each time (the uplinks keep it).
type descriptorScratch struct {
	totals map[string]*descriptorTotal // by name, one service's
	index  map[string]int              // value → its place in sums, one descriptor's
	sums   []valueRate
	names  []string
}

type descriptorTotal struct{ offered, dropped float64 }

// sumDescriptors returns the DescriptorRates of the sidecars scs, all of
// one (service, direction) and in Flush's order, sorted by name: per
// descriptor, their totals summed and their values summed, cut to the
// MaxDescriptorValues largest by offered rate. It counts the sums it
// capped at zoneload.MaxRate in s.capped and the descriptors beyond
// maxZoneDescriptors in s.descriptorsCut.
func (s *State) sumDescriptors(scs []*sidecarLoad) []*sluicev1.DescriptorRates {
	sc := &s.scratch
	if sc.totals == nil {
		sc.totals, sc.index = make(map[string]*descriptorTotal), make(map[string]int)
	}
	clear(sc.totals)
	for _, l := range scs {
		for _, d := range l.descriptors {
			t := sc.totals[d.name]
			if t == nil {
				t = &descriptorTotal{}
				sc.totals[d.name] = t
			}
			t.offered += d.offered
			t.dropped += d.dropped
		}
	}
	if len(sc.totals) == 0 {
		return nil
	}
	sc.names = slices.AppendSeq(sc.names[:0], maps.Keys(sc.totals))
	if len(sc.names) > maxZoneDescriptors {
		slices.SortFunc(sc.names, func(a, b string) int {
			return cmp.Or(cmp.Compare(sc.totals[b].offered, sc.totals[a].offered), strings.Compare(a, b))
		})
		s.descriptorsCut += len(sc.names) - maxZoneDescriptors
		sc.names = sc.names[:maxZoneDescriptors]
	}
	slices.Sort(sc.names)
	out := make([]*sluicev1.DescriptorRates, 0, len(sc.names))
	for _, name := range sc.names {
		t := sc.totals[name]
		dr := &sluicev1.DescriptorRates{Descriptor_: name, OfferedRps: t.offered, DroppedRps: t.dropped}
		if dr.OfferedRps > zoneload.MaxRate {
			dr.DroppedRps = min(dr.DroppedRps*zoneload.MaxRate/dr.OfferedRps, zoneload.MaxRate)
			dr.OfferedRps = zoneload.MaxRate
			s.capped++
		}
		s.sumValues(scs, name, dr)
		out = append(out, dr)
	}
	return out
}

// sumValues sums the values of descriptor name over scs into dr, cut to
// the largest MaxDescriptorValues.
func (s *State) sumValues(scs []*sidecarLoad, name string, dr *sluicev1.DescriptorRates) {
	sc := &s.scratch
	clear(sc.index)
	sc.sums = sc.sums[:0]
	for _, l := range scs {
		for _, d := range l.descriptors {
			if d.name != name {
				continue
			}
			for _, v := range d.values {
				i, ok := sc.index[v.value]
				if !ok {
					i = len(sc.sums)
					sc.index[v.value] = i
					sc.sums = append(sc.sums, valueRate{value: v.value})
				}
				sc.sums[i].offered += v.offered
			}
		}
	}
	top := topValues(sc.sums, s.bounds.MaxDescriptorValues)
	dr.ValuesCut = uint32(min(len(sc.sums)-len(top), 1<<32-1))
	slices.SortFunc(top, func(a, b valueRate) int { return strings.Compare(a.value, b.value) })
	dr.Values = make([]*sluicev1.ValueRate, len(top))
	for i, v := range top {
		if v.offered > zoneload.MaxRate {
			v.offered = zoneload.MaxRate
			s.capped++
		}
		dr.Values[i] = &sluicev1.ValueRate{Value: v.value, OfferedRps: v.offered}
	}
}

// largerValue orders values by offered rate, largest first, then by value:
// the order in which the zone keeps them. Deterministic, so that the same
// reports give the same cut.
func largerValue(a, b valueRate) int {
	return cmp.Or(cmp.Compare(b.offered, a.offered), strings.Compare(a.value, b.value))
}

// topValues returns the n first of vs by largerValue, in no particular
// order, reordering vs in place. It keeps a heap of the n best so far,
// whose root is the worst of them: O(len(vs) log n), and most values cost
// one comparison with the root once the heap holds the large ones.
func topValues(vs []valueRate, n int) []valueRate {
	if len(vs) <= n {
		return vs
	}
	if n <= 0 {
		return vs[:0]
	}
	h := vs[:n]
	// worse reports whether i ranks below j, for a heap with the worst on top.
	worse := func(i, j int) bool { return largerValue(h[i], h[j]) > 0 }
	down := func(i int) {
		for {
			l := 2*i + 1
			if l >= n {
				return
			}
			c := l
			if r := l + 1; r < n && worse(r, l) {
				c = r
			}
			if !worse(c, i) {
				return
			}
			h[i], h[c] = h[c], h[i]
			i = c
		}
	}
	for i := n/2 - 1; i >= 0; i-- {
		down(i)
	}
	for i := n; i < len(vs); i++ {
		if largerValue(vs[i], h[0]) < 0 {
			h[0], vs[i] = vs[i], h[0]
			down(0)
		}
	}
	return h
}

// DescriptorsCut returns how many (service, direction, descriptor) sums
// the last Flush left out beyond maxZoneDescriptors per service.
func (s *State) DescriptorsCut() int { return s.descriptorsCut }

// HealthCut returns how many (service, direction, procedure) health sums
// the last Flush left out beyond maxZoneHealth.
func (s *State) HealthCut() int { return s.healthCut }
