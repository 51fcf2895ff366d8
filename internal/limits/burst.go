package limits

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// MaxPayback bounds a limit's payback: a longer window would hold a
// bucket below its limit for longer than anyone would connect with the
// overshoot that caused it.
const MaxPayback = time.Hour

// errBurstProcedures is why a caller of a callee with procedures can not
// name a burst or a payback yet: its limit across procedures is the
// hierarchical law's caller level, which holds no bucket level.
var errBurstProcedures = errors.New("not yet supported for a caller of a service with procedures (its limit holds across them)")

// burst reads a caller's burst and payback (fb) at cpath: a finite burst
// >= 0, a payback in [0, MaxPayback]; both need the caller's own limit.
func (b *builder) burst(svc *Service, cpath string, fb fileBucket) (float64, time.Duration) {
	var burst float64
	if fb.Burst != nil {
		if v := *fb.Burst; math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			b.errs = append(b.errs, fmt.Errorf("%s.burst: %v is not a finite number >= 0", cpath, v))
		} else {
			burst = v
		}
	}
	payback := setting(cpath+".payback", fb.Payback, ParsePayback, 0, &b.errs)
	for _, f := range []struct {
		field string
		set   bool
	}{{"burst", fb.Burst != nil}, {"payback", fb.Payback != ""}} {
		field := f.field
		switch {
		case !f.set:
		case fb.Limit == nil:
			b.errs = append(b.errs, fmt.Errorf("%s.%s: needs the caller's own limit", cpath, field))
		case svc.HasProcedures():
			b.errs = append(b.errs, fmt.Errorf("%s.%s: %w", cpath, field, errBurstProcedures))
		}
	}
	return burst, payback
}

// ParsePayback parses a limit's payback window: a Go duration ("10s",
// "1m30s") in [0, MaxPayback]; "0s" is none.
func ParsePayback(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, err
	}
	if d < 0 || d > MaxPayback {
		return 0, fmt.Errorf("%v is outside [0, %v]", d, MaxPayback)
	}
	return d, nil
}
