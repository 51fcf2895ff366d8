package history

import (
	"fmt"
	"strconv"
	"strings"

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
	return fmt.Sprintf("%s, %s, %s%s", renderRate(l.Limit), renderSetting(l.Mode), l.Source, renderUpstream(l.Enforcement))
}

// renderService: "default 100 rps, capacity none, mode enforce, fail open",
// and ", enforced upstream" when it is.
func renderService(s ServiceLimits) string {
	return fmt.Sprintf("default %s, capacity %s, mode %s, fail %s%s",
		renderOptRate(s.DefaultLimit), renderOptRate(s.Capacity), renderSetting(s.Mode), renderSetting(s.FailMode), renderUpstream(s.Enforcement))
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
