package configurator

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/pkg/history"
	"github.com/sluicehq/sluice/pkg/names"
)

// target is a command-line bucket, or a callee alone: "checkout",
// "checkout/web", a leaf "checkout/web/create-charge", a procedure's own
// level "checkout/*/create-charge". The procedure is everything after the
// second '/', so that a gRPC method is one: "checkout/web//shop.Checkout/Pay".
type target struct {
	history.Bucket // Caller "" for a callee alone
}

// filter selects what the store should read for t: for a caller alone,
// its bucket and its leaves; selects narrows that to t's own bucket.
func (t target) filter() history.Filter {
	return history.Filter{Callee: t.Callee, Caller: t.Caller, Procedure: t.Procedure}
}

// selects reports whether b is t's bucket, or one of t's callee's when t
// is a callee alone: a path with a caller names exactly one bucket.
func (t target) selects(b history.Bucket) bool {
	if t.Caller == "" {
		return b.Callee == t.Callee
	}
	return b == t.Bucket
}

func (t target) String() string {
	if t.Caller == "" {
		return t.Callee
	}
	return t.Path()
}

func bucketString(b history.Bucket) string { return b.Path() }

// parseTarget parses "callee/caller", "callee/caller/procedure",
// "callee/*/procedure" or, with calleeOK, "callee", checking the names as
// every tier does.
func parseTarget(s string, calleeOK bool) (target, error) {
	callee, rest, hasCaller := strings.Cut(s, "/")
	caller, proc, hasProc := strings.Cut(rest, "/")
	if !hasCaller && !calleeOK {
		return target{}, fmt.Errorf("bucket %q: want callee/caller, e.g. checkout/web, or callee/caller/procedure", s)
	}
	if err := names.Check(callee); err != nil {
		return target{}, fmt.Errorf("bucket %q: callee: %v", s, err)
	}
	if hasProc {
		if err := names.CheckProcedure(proc); err != nil {
			return target{}, fmt.Errorf("bucket %q: procedure (everything after the second '/'): %v", s, err)
		}
	}
	switch {
	case !hasCaller:
	case caller == history.AnyCaller && !hasProc:
		return target{}, fmt.Errorf("bucket %q: %s stands for every caller of a procedure: want %s/%s/PROCEDURE", s, history.AnyCaller, callee, history.AnyCaller)
	case caller == history.AnyCaller:
	default:
		if err := names.Check(caller); err != nil {
			return target{}, fmt.Errorf("bucket %q: caller: %v", s, err)
		}
	}
	return target{history.Bucket{Callee: callee, Caller: caller, Procedure: proc}}, nil
}

// hasProcedure reports whether any of bs has one: tables then show a
// PROCEDURE column, and are as before procedures existed otherwise.
func hasProcedure[T any](rows []T, bucket func(T) history.Bucket) bool {
	for _, r := range rows {
		if bucket(r).Procedure != "" {
			return true
		}
	}
	return false
}

// bucketColumns is a table's header or row: callee, caller, the procedure
// when withProc, then rest.
func bucketColumns(withProc bool, callee, caller, proc string, rest ...string) []string {
	out := []string{callee, caller}
	if withProc {
		out = append(out, proc)
	}
	return append(out, rest...)
}

// parseRate parses a limit or capacity given to flag: a finite number >= 0,
// or, with noneOK, "none" (ok false).
func parseRate(flag, s string, noneOK bool) (v float64, ok bool, err error) {
	if noneOK && s == "none" {
		return 0, false, nil
	}
	v, err = strconv.ParseFloat(strings.TrimSpace(s), 64)
	switch {
	case err != nil:
		return 0, false, fmt.Errorf("--%s %q is not a number", flag, s)
	case math.IsNaN(v):
		return 0, false, fmt.Errorf("--%s is NaN; want a number >= 0", flag)
	case math.IsInf(v, 0):
		return 0, false, fmt.Errorf("--%s is infinite; want a number >= 0 (or none)", flag)
	case v < 0:
		return 0, false, fmt.Errorf("--%s %v is negative; want a number >= 0 (0 blocks)", flag, v)
	}
	return v, true, nil
}

// parseFlag parses a flag's value with the parser of its type (ParseMode,
// ParseFailMode, ParseEnforcement), so that the configurator spells them
// as limits files and the store do; the error names the flag.
func parseFlag[T any](flag, s string, parse func(string) (T, error)) (*T, error) {
	v, err := parse(s)
	if err != nil {
		return nil, fmt.Errorf("--%s %w", flag, err)
	}
	return &v, nil
}
