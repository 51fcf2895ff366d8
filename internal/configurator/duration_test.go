package configurator

import (
	"strings"
	"testing"
	"time"
)

func TestParseDuration(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
	}{
		{"0", 0},
		{"28d", 28 * Day},
		{"4w", 28 * Day},
		{"672h", 28 * Day},
		{"1w3d", 10 * Day},
		{"36h30m", 36*time.Hour + 30*time.Minute},
		{"1.5d", 36 * time.Hour},
		{"24h", Day},
		{"90s", 90 * time.Second},
	} {
		got, err := ParseDuration(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	for _, tc := range []struct{ in, wantErr string }{
		{"", "empty"},
		{"28", "missing unit"},
		{"28x", `unknown unit "x"`},
		{"-1d", "negative"},
		{"d", "expected a number"},
		{"1..2d", "bad number"},
		{"100000000w", "too long"},
		{"4 w", `unknown unit " w"`},
	} {
		if _, err := ParseDuration(tc.in); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("ParseDuration(%q) error = %v; want it to contain %q", tc.in, err, tc.wantErr)
		}
	}
}

func TestFormatDuration(t *testing.T) {
	for _, tc := range []struct {
		in   time.Duration
		want string
	}{
		{0, "0"},
		{28 * Day, "4w"},
		{10 * Day, "10d"},
		{36 * time.Hour, "36h"},
		{36*time.Hour + 30*time.Minute, "36h30m"},
		{90 * time.Second, "1m30s"},
	} {
		if got := FormatDuration(tc.in); got != tc.want {
			t.Errorf("FormatDuration(%v) = %q; want %q", tc.in, got, tc.want)
		}
		if back, err := ParseDuration(FormatDuration(tc.in)); err != nil || back != tc.in {
			t.Errorf("ParseDuration(FormatDuration(%v)) = %v, %v", tc.in, back, err)
		}
	}
}
