// Package duration is the one way every sluice binary and config source
// reads and writes a duration: a flag, its SLUICE_* environment variable, a
// --config file, a simulator scenario. It takes what time.ParseDuration
// takes (ns, us, µs, ms, s, m, h) and days and weeks (d, w), because the
// controller's --history-retention and the configurator's --lookback are
// counted in them, and an operator who writes "35d" for one should not
// learn that the other wants "840h".
package duration

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// Day and Week are the units time.ParseDuration lacks. A day is 24 hours:
// sluice keeps its history in UTC, which has no daylight saving.
const (
	Day  = 24 * time.Hour
	Week = 7 * Day
)

// units, longest name first where one is a prefix of another ("ms" before
// "m"), so that the first match is the right one.
var units = []struct {
	name string
	d    time.Duration
}{
	{"ns", time.Nanosecond},
	{"us", time.Microsecond},
	{"µs", time.Microsecond},
	{"μs", time.Microsecond}, // Greek mu, as time.ParseDuration also accepts
	{"ms", time.Millisecond},
	{"s", time.Second},
	{"m", time.Minute},
	{"h", time.Hour},
	{"d", Day},
	{"w", Week},
}

const unitList = "w, d, h, m, s, ms, us, ns"

// Parse parses a duration such as "35d", "4w", "1w3d", "36h30m", "1.5s",
// "100ms" or "-1s": an optional sign, then one or more decimal numbers each
// followed by a unit. "0" alone needs no unit. Whether a negative duration
// means something is the caller's to say.
func Parse(s string) (time.Duration, error) {
	orig := s
	if s == "" {
		return 0, errors.New("empty duration; use e.g. 500ms, 30s, 5m, 36h, 35d or 4w")
	}
	neg := false
	if s[0] == '-' || s[0] == '+' {
		neg = s[0] == '-'
		s = s[1:]
	}
	if s == "0" {
		return 0, nil
	}
	if s == "" {
		return 0, fmt.Errorf("duration %q: a sign alone is no duration", orig)
	}
	// Whole nanoseconds per term, summed exactly; the fraction of a term is
	// rounded to the nanosecond, as time.ParseDuration does.
	var total uint64
	for s != "" {
		i := 0
		for i < len(s) && (s[i] >= '0' && s[i] <= '9' || s[i] == '.') {
			i++
		}
		if i == 0 {
			return 0, fmt.Errorf("duration %q: expected a number at %q; use e.g. 30s, 35d or 1w3d", orig, s)
		}
		num := s[:i]
		s = s[i:]
		j := 0
		for j < len(s) && (s[j] < '0' || s[j] > '9') && s[j] != '.' {
			j++
		}
		name := s[:j]
		s = s[j:]
		if name == "" {
			return 0, fmt.Errorf("duration %q: missing unit after %s; units are %s", orig, num, unitList)
		}
		unit := time.Duration(0)
		for _, u := range units {
			if u.name == name {
				unit = u.d
				break
			}
		}
		if unit == 0 {
			return 0, fmt.Errorf("duration %q: unknown unit %q; units are %s", orig, name, unitList)
		}
		n, err := term(num, unit)
		if err != nil {
			return 0, fmt.Errorf("duration %q: %w", orig, err)
		}
		if total+n < total || total+n > math.MaxInt64 {
			return 0, fmt.Errorf("duration %q is too long (at most %s)", orig, Format(math.MaxInt64))
		}
		total += n
	}
	if neg {
		return -time.Duration(total), nil
	}
	return time.Duration(total), nil
}

// term is num units in nanoseconds: the whole part exactly, the fraction
// as time.ParseDuration takes it (truncated to the nanosecond), so that the
// two parsers agree on everything Go's reads.
func term(num string, unit time.Duration) (uint64, error) {
	whole, frac, _ := strings.Cut(num, ".")
	if strings.Contains(frac, ".") || whole == "" && frac == "" {
		return 0, fmt.Errorf("bad number %q", num)
	}
	var w uint64
	if whole != "" {
		v, err := strconv.ParseUint(whole, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%s is too long", num)
		}
		w = v
	}
	if w > math.MaxInt64/uint64(unit) {
		return 0, fmt.Errorf("%s is too long", num)
	}
	n := w * uint64(unit)
	// The fraction's digits while they fit, as time.ParseDuration reads them.
	var f uint64
	scale := 1.0
	overflow := false
	for _, c := range []byte(frac) {
		if overflow || f > (1<<63-1)/10 {
			overflow = true
			continue
		}
		f = f*10 + uint64(c-'0')
		scale *= 10
	}
	if f > 0 {
		n += uint64(float64(f) * (float64(unit) / scale))
	}
	return n, nil
}

// Format renders d so that Parse reads it back: in whole weeks or days when
// it is one ("4w", "35d"), else as time.Duration prints it, without zero
// tails ("36h30m", not "36h30m0s").
func Format(d time.Duration) string {
	sign := ""
	if d < 0 && d != math.MinInt64 {
		sign, d = "-", -d
	}
	switch {
	case d == 0:
		return "0"
	case d%Week == 0:
		return sign + strconv.FormatInt(int64(d/Week), 10) + "w"
	case d%Day == 0:
		return sign + strconv.FormatInt(int64(d/Day), 10) + "d"
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return sign + s
}

// Value is a flag value over a time.Duration that Parse reads and Format
// prints, so that --help shows a default of 35 days as "35d".
type Value time.Duration

// Set implements pflag.Value.
func (v *Value) Set(s string) error {
	d, err := Parse(s)
	if err != nil {
		return err
	}
	*v = Value(d)
	return nil
}

func (v *Value) String() string { return Format(time.Duration(*v)) }

// Type implements pflag.Value: help shows "duration", as for pflag's own.
func (v *Value) Type() string { return "duration" }

// Var declares a duration flag, as pflag's DurationVar does, read by Parse.
func Var(fs *pflag.FlagSet, p *time.Duration, name string, value time.Duration, usage string) {
	*p = value
	fs.Var((*Value)(p), name, usage)
}

// UnmarshalText lets a Value be read from YAML, JSON and other text
// encodings with Parse.
func (v *Value) UnmarshalText(b []byte) error { return v.Set(string(b)) }

// MarshalText writes a Value as Format does.
func (v Value) MarshalText() ([]byte, error) { return []byte(Format(time.Duration(v))), nil }

// NonNegative is a Value that refuses negative durations: for windows and
// spans, where "-1d" is a typo rather than a meaning.
type NonNegative time.Duration

// Set implements pflag.Value.
func (v *NonNegative) Set(s string) error {
	d, err := Parse(s)
	if err != nil {
		return err
	}
	if d < 0 {
		return fmt.Errorf("duration %q is negative", s)
	}
	*v = NonNegative(d)
	return nil
}

func (v *NonNegative) String() string { return Format(time.Duration(*v)) }

// Type implements pflag.Value.
func (v *NonNegative) Type() string { return "duration" }
