package sim

import (
	"encoding/csv"
	"io"
	"math"
	"strconv"
)

// CSVHeader names WriteCSV's columns. Rates are requests per second over the
// second starting at t (seconds since the start); limit and allowed are
// "inf" when unbounded; ratio is the mean drop ratio the callee's sidecars
// held at the end of the second; procedure is the leaf's procedure at a
// callee that declares procedures, empty for a whole (callee, caller)
// pair. It comes last so that the columns before it stay where they were
// before procedures.
var CSVHeader = []string{"scenario", "seed", "t", "callee", "caller", "nominal", "offered", "retries", "admitted", "dropped", "limit", "allowed", "ratio", "procedure"}

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
	for i := range n {
		for _, b := range r.Buckets {
			row = append(row[:0], r.Scenario.Name, seed, strconv.Itoa(i), b.Callee, b.Caller,
				num3(b.Nominal[i]), num3(b.Offered[i]), num3(b.Retries[i]), num3(b.Admitted[i]), num3(b.Dropped[i]),
				num3(b.Limit), num3(b.Allowed[i]), strconv.FormatFloat(b.Ratio[i], 'f', 4, 64), b.Procedure)
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
