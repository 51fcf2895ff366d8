package history

import (
	"fmt"
	"strconv"
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

// renderLimit: "120 rps, enforce, manual".
func renderLimit(l BucketLimit) string {
	return fmt.Sprintf("%s, %s, %s", renderRate(l.Limit), l.Mode, l.Source)
}

// renderService: "default 100 rps, capacity none, mode enforce, fail open".
func renderService(s ServiceLimits) string {
	return fmt.Sprintf("default %s, capacity %s, mode %s, fail %s",
		renderOptRate(s.DefaultLimit), renderOptRate(s.Capacity), s.Mode, s.FailMode)
}

// renderProposal: "proposal 7: 150 rps".
func renderProposal(p Proposal) string {
	return fmt.Sprintf("proposal %d: %s", p.ID, renderRate(p.Proposed))
}
