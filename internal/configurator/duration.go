package configurator

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Day and Week are the units time.ParseDuration lacks. Days are 24 hours:
// history is kept in UTC, which has no daylight saving.
const (
	Day  = 24 * time.Hour
	Week = 7 * Day
)

// ParseDuration parses a non-negative duration such as "28d", "4w", "672h",
// "1w3d" or "36h30m": a sequence of decimal numbers, each with a unit, w
// (weeks), d (days), h, m or s. "0" alone needs no unit. Look-back windows
// are what it is for, so it has no sub-second units and no sign.
func ParseDuration(s string) (time.Duration, error) {
	orig := s
	if s == "" {
		return 0, fmt.Errorf("empty duration; use e.g. 28d, 4w or 672h")
	}
	if s == "0" {
		return 0, nil
	}
	if strings.HasPrefix(s, "-") {
		return 0, fmt.Errorf("duration %q is negative", orig)
	}
	var total float64 // seconds; a float so 1.5d works, checked for overflow at the end
	for s != "" {
		i := 0
		for i < len(s) && (s[i] >= '0' && s[i] <= '9' || s[i] == '.') {
			i++
		}
		if i == 0 {
			return 0, fmt.Errorf("duration %q: expected a number at %q; use e.g. 28d, 4w or 672h", orig, s)
		}
		n, err := strconv.ParseFloat(s[:i], 64)
		if err != nil {
			return 0, fmt.Errorf("duration %q: bad number %q", orig, s[:i])
		}
		s = s[i:]
		j := 0
		for j < len(s) && (s[j] < '0' || s[j] > '9') && s[j] != '.' {
			j++
		}
		var unit time.Duration
		switch s[:j] {
		case "w":
			unit = Week
		case "d":
			unit = Day
		case "h":
			unit = time.Hour
		case "m":
			unit = time.Minute
		case "s":
			unit = time.Second
		case "":
			return 0, fmt.Errorf("duration %q: missing unit after %v; units are w, d, h, m, s", orig, n)
		default:
			return 0, fmt.Errorf("duration %q: unknown unit %q; units are w, d, h, m, s", orig, s[:j])
		}
		s = s[j:]
		total += n * unit.Seconds()
	}
	if total*float64(time.Second) >= math.MaxInt64 {
		return 0, fmt.Errorf("duration %q is too long", orig)
	}
	return time.Duration(math.Round(total * float64(time.Second))), nil
}

// FormatDuration renders d the way ParseDuration reads it, in whole weeks or
// days when it is one ("4w", "10d"), else as time.Duration does.
func FormatDuration(d time.Duration) string {
	switch {
	case d == 0:
		return "0"
	case d%Week == 0:
		return strconv.FormatInt(int64(d/Week), 10) + "w"
	case d%Day == 0:
		return strconv.FormatInt(int64(d/Day), 10) + "d"
	}
	s := d.String()
	// "36h30m0s" reads better as "36h30m".
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// durationValue is a pflag.Value over ParseDuration.
type durationValue time.Duration

func (d *durationValue) Set(s string) error {
	v, err := ParseDuration(s)
	if err != nil {
		return err
	}
	*d = durationValue(v)
	return nil
}

func (d *durationValue) String() string { return FormatDuration(time.Duration(*d)) }
func (d *durationValue) Type() string   { return "duration" }

// days returns how many whole UTC days a window of d covers, rounding up:
// 36h is 2 days. At least 1.
func days(d time.Duration) int {
	n := int((d + Day - 1) / Day)
	return max(n, 1)
}
