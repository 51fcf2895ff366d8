package configurator

import (
	"math"
	"testing"
	"testing/quick"
)

func TestRoundUp(t *testing.T) {
	for _, tc := range []struct{ in, want float64 }{
		{1234, 1300},
		{1200, 1200},
		{1201, 1300},
		{87.2, 88},
		{99.5, 100},
		{100, 100},
		{101, 110},
		{1000, 1000},
		{999.9, 1000},
		{5, 5},
		{5.01, 5.1},
		{1.1, 1.1},
		{0.123, 0.13},
		{0.3, 0.3},
		{1.25e6, 1.3e6},
		{0, 0},
		{-3, -3},
	} {
		if got := RoundUp(tc.in); got != tc.want {
			t.Errorf("RoundUp(%v) = %v; want %v", tc.in, got, tc.want)
		}
	}
	if got := RoundUp(math.NaN()); !math.IsNaN(got) {
		t.Errorf("RoundUp(NaN) = %v", got)
	}
}

// TestRoundUpQuick checks the two promises against a naive oracle: never
// down (beyond float noise), and less than 10 % up.
func TestRoundUpQuick(t *testing.T) {
	f := func(mant uint32, exp int8) bool {
		v := float64(mant%1e6+1) * math.Pow(10, float64(exp%8))
		r := RoundUp(v)
		return r >= v*(1-1e-9) && r < v*1.1+1e-12*v
	}
	if err := quick.Check(f, nil); err != nil {
		t.Error(err)
	}
}

func TestFormatRate(t *testing.T) {
	for _, tc := range []struct {
		in   float64
		want string
	}{
		{0, "0"},
		{5, "5"},
		{0.35, "0.35"},
		{87.2, "87.2"},
		{88, "88"},
		{100, "100"},
		{1234.56, "1,235"},
		{12345, "12,345"},
		{1234567, "1,234,567"},
		{-1234, "-1,234"},
		{math.Inf(1), "∞"},
		{math.NaN(), "-"},
	} {
		if got := formatRate(tc.in); got != tc.want {
			t.Errorf("formatRate(%v) = %q; want %q", tc.in, got, tc.want)
		}
	}
}

func TestFormatDelta(t *testing.T) {
	for _, tc := range []struct {
		from, to float64
		want     string
	}{
		{100, 125, "+25%"},
		{100, 50, "-50%"},
		{1000, 1045, "+4.5%"},
		{100, 100, "0%"},
		{0, 10, "+∞"},
	} {
		if got := formatDelta(tc.from, tc.to); got != tc.want {
			t.Errorf("formatDelta(%v, %v) = %q; want %q", tc.from, tc.to, got, tc.want)
		}
	}
}
