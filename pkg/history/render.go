package history

import (
	"cmp"
	"fmt"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/pkg/criticality"
	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/routes"
)

// The audit log keeps values as text for people. Both stores render them
// here, so that they read the same.

func renderRate(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) + " rps" }

func renderOptRate(v *float64) string {
	if v == nil {
		return "none"
	}
	return renderRate(*v)
}

// renderLimit: "120 rps, enforce, manual", and ", enforced upstream" when
// it is (sidecar, the default, is left out, as before the field existed).
func renderLimit(l BucketLimit) string {
	s := fmt.Sprintf("%s, %s, %s%s", renderRate(l.Limit), renderSetting(l.Mode), l.Source, renderUpstream(l.Enforcement))
	if l.Burst != nil && *l.Burst != 0 {
		s += ", burst " + strconv.FormatFloat(*l.Burst, 'g', -1, 64)
	}
	if l.Payback != nil && *l.Payback != 0 {
		s += ", payback " + l.Payback.String()
	}
	return s
}

// renderService: "default 100 rps, capacity none, mode enforce, fail open",
// and ", enforced upstream" when it is; a callee counting cost, with
// tiers or with an objective says so after (RenderDeclarations), one that
// declares none reads as before they existed.
func renderService(s ServiceLimits) string {
	return fmt.Sprintf("default %s, capacity %s, mode %s, fail %s%s",
		renderOptRate(s.DefaultLimit), renderOptRate(s.Capacity), renderSetting(s.Mode), renderSetting(s.FailMode), renderUpstream(s.Enforcement)) +
		s.RenderDeclarations(renderNumber)
}

// RenderDeclarations renders what a callee counting cost, with tiers or
// with an objective adds to its settings, for the audit log and the
// configurator alike: ", unit cost (default 1, max 1e+06, request header
// x-cost)", ", tiers (header x-sluice-criticality, default CRITICAL, max
// CRITICAL)", ", slo (latency_p99 200ms, errors 1%)"; "" for one that
// declares none. num renders a number, def when v is nil.
func (s ServiceLimits) RenderDeclarations(num func(v *float64, def float64) string) string {
	var out string
	if c := s.Cost; c != nil {
		out += fmt.Sprintf(", unit cost (default %s, max %s", num(c.Default, DefaultCost), num(c.Max, DefaultMaxCost))
		if c.RequestHeader != "" {
			out += ", request header " + c.RequestHeader
		}
		if c.ResponseHeader != "" {
			out += ", response header " + c.ResponseHeader
		}
		out += ")"
	}
	if c := s.Criticality; c != nil {
		out += fmt.Sprintf(", tiers (header %s, default %s, max %s)", cmp.Or(c.Header, criticality.DefaultHeader),
			cmp.Or(c.Default, criticality.Critical), cmp.Or(c.Max, criticality.Critical))
	}
	if o := s.SLO; o != nil {
		var parts []string
		if o.LatencyP99 > 0 {
			parts = append(parts, "latency_p99 "+o.LatencyP99.String())
		}
		if o.Errors > 0 {
			// Ten digits: 100 × 0.07 is 7.000000000000001.
			parts = append(parts, "errors "+strconv.FormatFloat(100*o.Errors, 'g', 10, 64)+"%")
		}
		out += ", slo (" + strings.Join(parts, ", ") + ")"
	}
	return out
}

func renderNumber(v *float64, def float64) string {
	if v == nil {
		v = &def
	}
	return strconv.FormatFloat(*v, 'g', -1, 64)
}

// renderSettings: "criticality SHEDDABLE, max criticality CRITICAL, max
// concurrency 40, cost 10", what is set of it; "" for nothing.
func renderSettings(s BucketSettings) string {
	var parts []string
	if s.Criticality != criticality.None {
		parts = append(parts, "criticality "+s.Criticality.String())
	}
	if s.MaxCriticality != criticality.None {
		parts = append(parts, "max criticality "+s.MaxCriticality.String())
	}
	if s.MaxConcurrency != 0 {
		parts = append(parts, "max concurrency "+strconv.FormatUint(uint64(s.MaxConcurrency), 10))
	}
	if s.Cost != nil {
		parts = append(parts, "cost "+strconv.FormatFloat(*s.Cost, 'g', -1, 64))
	}
	return strings.Join(parts, ", ")
}

// renderSetting: the setting's name; the stores render only settings in
// force, which are never nil.
func renderSetting[T fmt.Stringer](v *T) string {
	if v == nil {
		return ""
	}
	return (*v).String()
}

func renderUpstream(e *dataplane.Enforcement) string {
	if e != nil && *e == dataplane.EnforceUpstream {
		return ", enforced upstream"
	}
	return ""
}

// renderProposal: "proposal 7: 150 rps".
func renderProposal(p Proposal) string {
	return fmt.Sprintf("proposal %d: %s", p.ID, renderRate(p.Proposed))
}

// renderRoutes: "POST /v1/charges=create-charge, GET /v1/items/{id}=get-item",
// as the configurator takes them; "" for none.
func renderRoutes(rs []routes.Route) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = r.Pattern + "=" + r.Procedure
	}
	return strings.Join(parts, ", ")
}
