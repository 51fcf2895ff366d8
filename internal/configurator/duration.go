package configurator

import (
	"fmt"
	"time"

	"github.com/sluicehq/sluice/internal/duration"
)

// Day and Week: look-back windows are counted in them.
const (
	Day  = duration.Day
	Week = duration.Week
)

// ParseDuration parses a look-back window: duration.Parse, which every
// binary shares ("28d", "4w", "672h", "1w3d"), refusing negative windows.
func ParseDuration(s string) (time.Duration, error) {
	d, err := duration.Parse(s)
	if err != nil {
		return 0, err
	}
	if d < 0 {
		return 0, fmt.Errorf("duration %q is negative", s)
	}
	return d, nil
}

// FormatDuration renders d the way ParseDuration reads it ("4w", "10d").
func FormatDuration(d time.Duration) string { return duration.Format(d) }

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
