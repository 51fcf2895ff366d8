package configurator

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/pkg/history"
	"github.com/sluicehq/sluice/pkg/names"
)

// target is a command-line bucket, "callee/caller", or a callee alone.
type target struct {
	history.Bucket // Caller "" for a callee alone
}

func (t target) filter() history.Filter {
	return history.Filter{Callee: t.Callee, Caller: t.Caller}
}

func (t target) String() string {
	if t.Caller == "" {
		return t.Callee
	}
	return t.Callee + "/" + t.Caller
}

func bucketString(b history.Bucket) string { return b.Callee + "/" + b.Caller }

// parseTarget parses "callee/caller" or, with calleeOK, "callee", checking
// both names as every tier does.
func parseTarget(s string, calleeOK bool) (target, error) {
	callee, caller, hasCaller := strings.Cut(s, "/")
	if !hasCaller && !calleeOK {
		return target{}, fmt.Errorf("bucket %q: want callee/caller, e.g. checkout/web", s)
	}
	if err := names.Check(callee); err != nil {
		return target{}, fmt.Errorf("bucket %q: callee: %v", s, err)
	}
	if hasCaller {
		if err := names.Check(caller); err != nil {
			return target{}, fmt.Errorf("bucket %q: caller: %v", s, err)
		}
	}
	return target{history.Bucket{Callee: callee, Caller: caller}}, nil
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
