package configurator

import (
	"time"

	"github.com/sluicehq/sluice/internal/duration"
)

// Day and Week: look-back windows are counted in them.
const (
	Day  = duration.Day
	Week = duration.Week
)

// days returns how many whole UTC days a window of d covers, rounding up:
// 36h is 2 days. At least 1.
func days(d time.Duration) int {
	n := int((d + Day - 1) / Day)
	return max(n, 1)
}
