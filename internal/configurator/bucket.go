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

func parseMode(flag, s string) (history.Mode, error) {
	switch m := history.Mode(s); m {
	case history.Enforce, history.Shadow:
		return m, nil
	}
	return "", fmt.Errorf("--%s %q is not enforce or shadow", flag, s)
}

func parseEnforcement(s string) (history.Enforcement, error) {
	switch e := history.Enforcement(s); e {
	case history.EnforceSidecar, history.EnforceUpstream:
		return e, nil
	}
	return "", fmt.Errorf("--enforcement %q is not sidecar or upstream", s)
}

func parseFailMode(s string) (history.FailMode, error) {
	switch m := history.FailMode(s); m {
	case history.FailOpen, history.FailHold, history.FailLocal:
		return m, nil
	}
	return "", fmt.Errorf("--fail-mode %q is not open, hold or local", s)
}
