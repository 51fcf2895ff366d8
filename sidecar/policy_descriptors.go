package sidecar

import (
	"math"
	"strconv"

	sluicev1 "github.com/sluicehq/sluice/api/sluice/v1"
	"github.com/sluicehq/sluice/pkg/allowance"
	"github.com/sluicehq/sluice/pkg/descriptor"
)

// MaxPolicyDescriptorValues bounds the listed values, and separately the
// overrides, of one descriptor that PolicyFromProto accepts. The
// controller lists at most its --max-descriptor-values (default 1024); this
// is the sidecar's own bound on hostile input: each listed value costs a
// slot of the policy's value table (about 64 bytes and the value itself).
const MaxPolicyDescriptorValues = 1 << 16

// descriptorsFromProto converts and checks a policy's descriptors, each
// problem reported through bad naming its field ("descriptors[1].values[3]
// .drop_ratio"). Descriptors are inbound only: the caller side does not
// limit a callee's tenants.
func descriptorsFromProto(ds []*sluicev1.DescriptorPolicy, dir Direction, bad func(field, format string, args ...any)) []DescriptorPolicy {
	if len(ds) == 0 {
		return nil
	}
	if dir == Outbound {
		bad("descriptors", "set in an outbound policy")
	}
	if len(ds) > descriptor.MaxPerService {
		bad("descriptors", "%d descriptors, more than the %d a service may declare", len(ds), descriptor.MaxPerService)
		return nil
	}
	out := make([]DescriptorPolicy, 0, len(ds))
	seen := make(map[string]int, len(ds))
	for i, dp := range ds {
		f := func(name string) string { return "descriptors[" + strconv.Itoa(i) + "]." + name }
		d := DescriptorPolicy{
			Name:            dp.GetName(),
			LimitRPS:        dp.GetLimitRps(),
			MissingLimitRPS: dp.GetMissingLimitRps(),
			Quantile:        dp.GetQuantile(),
		}
		if err := descriptor.CheckName(d.Name); err != nil {
			bad(f("name"), "%v", err)
		} else if j, dup := seen[d.Name]; dup {
			bad(f("name"), "%q is declared again, first at descriptors[%d]", d.Name, j)
		} else {
			seen[d.Name] = i
		}
		var err error
		if d.Source, err = descriptor.ParseSource(dp.GetSource()); err != nil {
			bad(f("source"), "%.160v", err)
		}
		checkRate(f("limit_rps"), d.LimitRPS, bad)
		checkRate(f("missing_limit_rps"), d.MissingLimitRPS, bad)
		if err := allowance.CheckQuantile(d.Quantile); err != nil {
			bad(f("quantile"), "%v", err)
		}
		d.Overrides = overridesFromProto(f("overrides"), dp.GetOverrides(), bad)
		d.Values = valuesFromProto(f("values"), dp.GetValues(), bad)
		out = append(out, d)
	}
	return out
}

// checkRate reports a rate that is not a finite number ≥ 0.
func checkRate(field string, v float64, bad func(field, format string, args ...any)) {
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0):
		bad(field, "%v is not a finite number", v)
	case v < 0:
		bad(field, "%v is negative", v)
	}
}

// overridesFromProto converts a descriptor's overrides: sorted by value,
// each at most once, values that configuration may name (descriptor
// .CheckValue: descriptor.Missing included, descriptor.Invalid not).
func overridesFromProto(field string, vs []*sluicev1.ValueLimit, bad func(field, format string, args ...any)) []ValueLimit {
	if len(vs) == 0 {
		return nil
	}
	if len(vs) > MaxPolicyDescriptorValues {
		bad(field, "%d overrides, more than the %d a sidecar accepts", len(vs), MaxPolicyDescriptorValues)
		return nil
	}
	out := make([]ValueLimit, 0, len(vs))
	for i, v := range vs {
		f := field + "[" + strconv.Itoa(i) + "]"
		o := ValueLimit{Value: v.GetValue(), LimitRPS: v.GetLimitRps()}
		if err := descriptor.CheckValue(o.Value); err != nil {
			bad(f+".value", "%.80v", err)
		} else if i > 0 && o.Value <= vs[i-1].GetValue() {
			bad(f+".value", "%.64q is not after %.64q: overrides must be sorted, each value once", o.Value, vs[i-1].GetValue())
		}
		checkRate(f+".limit_rps", o.LimitRPS, bad)
		out = append(out, o)
	}
	return out
}

// valuesFromProto converts a descriptor's listed values: sorted by value,
// each at most once, a value a request may carry or a reserved one (the
// controller lists descriptor.Missing and descriptor.Invalid like any
// other heavy value), ratios in [0, 1) and rates finite ≥ 0.
func valuesFromProto(field string, vs []*sluicev1.ValuePolicy, bad func(field, format string, args ...any)) []ValueRule {
	if len(vs) == 0 {
		return nil
	}
	if len(vs) > MaxPolicyDescriptorValues {
		bad(field, "%d values, more than the %d a sidecar accepts", len(vs), MaxPolicyDescriptorValues)
		return nil
	}
	out := make([]ValueRule, 0, len(vs))
	for i, v := range vs {
		f := field + "[" + strconv.Itoa(i) + "]"
		r := ValueRule{Value: v.GetValue(), DropRatio: v.GetDropRatio(), LimitRPS: v.GetLimitRps(), OfferedRPS: v.GetOfferedRps()}
		if err := descriptor.CheckValue(r.Value); err != nil && !descriptor.Reserved(r.Value) {
			bad(f+".value", "%.80v", err)
		} else if i > 0 && r.Value <= vs[i-1].GetValue() {
			bad(f+".value", "%.64q is not after %.64q: values must be sorted, each value once", r.Value, vs[i-1].GetValue())
		}
		if !(r.DropRatio >= 0 && r.DropRatio < 1) { // also NaN
			bad(f+".drop_ratio", "%v is outside [0, 1)", r.DropRatio)
		}
		checkRate(f+".limit_rps", r.LimitRPS, bad)
		checkRate(f+".offered_rps", r.OfferedRPS, bad)
		out = append(out, r)
	}
	return out
}

// descriptorsProto is the inverse of descriptorsFromProto.
func descriptorsProto(ds []DescriptorPolicy) []*sluicev1.DescriptorPolicy {
	if len(ds) == 0 {
		return nil
	}
	out := make([]*sluicev1.DescriptorPolicy, 0, len(ds))
	for _, d := range ds {
		m := &sluicev1.DescriptorPolicy{
			Name:            d.Name,
			Source:          d.Source.String(),
			LimitRps:        d.LimitRPS,
			MissingLimitRps: d.MissingLimitRPS,
			Quantile:        d.Quantile,
		}
		for _, o := range d.Overrides {
			m.Overrides = append(m.Overrides, &sluicev1.ValueLimit{Value: o.Value, LimitRps: o.LimitRPS})
		}
		for _, v := range d.Values {
			m.Values = append(m.Values, &sluicev1.ValuePolicy{Value: v.Value, DropRatio: v.DropRatio, LimitRps: v.LimitRPS, OfferedRps: v.OfferedRPS})
		}
		out = append(out, m)
	}
	return out
}
