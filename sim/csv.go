package sim

import (
	"encoding/csv"
	"io"
	"math"
	"strconv"

	"github.com/sluicehq/sluice/pkg/adaptive"
)

// CSVHeader names WriteCSV's columns. Rates are requests per second over the
// second starting at t (seconds since the start); limit and allowed are
// "inf" when unbounded; ratio is the mean drop ratio the callee's sidecars
// held at the end of the second; procedure is the leaf's procedure at a
// callee that declares procedures, empty for a whole (callee, caller)
// pair. It comes last so that the columns before it stay where they were
// before procedures, and so do knee and estimate after it: at a modelled
// callee (Service.Knee), the fleet's knee and the capacity the controller
// estimated from its objective at its last tick in the second (0 before
// its first), in rps; empty elsewhere, estimate also at a callee without
// an objective.
var CSVHeader = []string{"scenario", "seed", "t", "callee", "caller", "nominal", "offered", "retries", "admitted", "dropped", "limit", "allowed", "ratio", "procedure", "knee", "estimate"}

// WriteCSV writes r's time series, one row per second and bucket, with the
// scenario and the seed on every row so that a file speaks for itself.
func WriteCSV(w io.Writer, r *Result) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(CSVHeader); err != nil {
		return err
	}
	seed := strconv.FormatUint(r.Seed, 10)
	row := make([]string, len(CSVHeader))
	n := int(r.Scenario.Duration / Bin)
	capacities := map[string]*CapacitySeries{}
	for i := range r.Capacities {
		capacities[r.Capacities[i].Callee] = &r.Capacities[i]
	}
	for i := range n {
		for _, b := range r.Buckets {
			knee, estimate := "", ""
			if c := capacities[b.Callee]; c != nil {
				knee = num3(c.Knee[i])
				if c.Objective != (adaptive.Objective{}) {
					estimate = num3(c.Estimate[i])
				}
			}
			row = append(row[:0], r.Scenario.Name, seed, strconv.Itoa(i), b.Callee, b.Caller,
				num3(b.Nominal[i]), num3(b.Offered[i]), num3(b.Retries[i]), num3(b.Admitted[i]), num3(b.Dropped[i]),
				num3(b.Limit), num3(b.Allowed[i]), strconv.FormatFloat(b.Ratio[i], 'f', 4, 64), b.Procedure, knee, estimate)
			if err := cw.Write(row); err != nil {
				return err
			}
		}
	}
	cw.Flush()
	return cw.Error()
}

// num3 formats a rate with at most three decimals and no trailing zeros.
func num3(v float64) string {
	if math.IsInf(v, 1) {
		return "inf"
	}
	return strconv.FormatFloat(math.Round(v*1000)/1000, 'f', -1, 64)
}
