package duration

import (
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
	}{
		{"0", 0},
		{"-0", 0},
		{"35d", 35 * Day},
		{"4w", 4 * Week},
		{"1w3d", 10 * Day},
		{"36h30m", 36*time.Hour + 30*time.Minute},
		{"1.5d", 36 * time.Hour},
		{"100ms", 100 * time.Millisecond},
		{"1.5s", 1500 * time.Millisecond},
		{"10us", 10 * time.Microsecond},
		{"10µs", 10 * time.Microsecond},
		{"7ns", 7},
		{"-1s", -time.Second},
		{"+2m", 2 * time.Minute},
		{".5h", 30 * time.Minute},
		{"2562047h47m16.854775807s", math.MaxInt64},
	} {
		got, err := Parse(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("Parse(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func TestParseErrors(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", "empty duration"},
		{"-", "a sign alone"},
		{"5", "missing unit after 5"},
		{"5x", `unknown unit "x"`},
		{"d", "expected a number"},
		{"1..5s", "bad number"},
		{".s", "bad number"},
		{"3000000w", "too long"},
		{"2562047h47m16.854775808s", "too long"},
		{"1s ", `unknown unit "s "`},
	} {
		_, err := Parse(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q) error %v; want it to say %q", tc.in, err, tc.want)
		}
	}
}

// TestAgreesWithTimeParseDuration: on everything Go's parser reads, this one
// reads the same; it is a superset, not a dialect.
func TestAgreesWithTimeParseDuration(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	goUnits := []string{"ns", "us", "µs", "ms", "s", "m", "h"}
	for range 20000 {
		var b strings.Builder
		if r.IntN(4) == 0 {
			b.WriteByte('-')
		}
		for n := 1 + r.IntN(3); n > 0; n-- {
			b.WriteString(strconv.FormatFloat(float64(r.IntN(100000))/float64(1+r.IntN(1000)), 'f', r.IntN(4), 64))
			b.WriteString(goUnits[r.IntN(len(goUnits))])
		}
		s := b.String()
		want, werr := time.ParseDuration(s)
		got, err := Parse(s)
		if (werr == nil) != (err == nil) || got != want {
			t.Fatalf("%q: Parse %v, %v; time.ParseDuration %v, %v", s, got, err, want, werr)
		}
	}
}

func TestFormatRoundTrips(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{0, "0"},
		{840 * time.Hour, "5w"},
		{35 * Day, "5w"},
		{10 * Day, "10d"},
		{36*time.Hour + 30*time.Minute, "36h30m"},
		{2 * time.Hour, "2h"},
		{1500 * time.Millisecond, "1.5s"},
		{-time.Second, "-1s"},
		{-3 * Day, "-3d"},
	} {
		if got := Format(tc.d); got != tc.want {
			t.Errorf("Format(%v) = %q, want %q", tc.d, got, tc.want)
		}
		if back, err := Parse(Format(tc.d)); err != nil || back != tc.d {
			t.Errorf("Parse(Format(%v)) = %v, %v", tc.d, back, err)
		}
	}
}

func TestFlag(t *testing.T) {
	fs := pflag.NewFlagSet("x", pflag.ContinueOnError)
	var retention time.Duration
	Var(fs, &retention, "history-retention", 35*Day, "how long")
	if retention != 35*Day {
		t.Fatalf("default %v", retention)
	}
	if got := fs.Lookup("history-retention").DefValue; got != "5w" {
		t.Errorf("help shows default %q, want 5w", got)
	}
	if err := fs.Parse([]string{"--history-retention", "3w2d"}); err != nil || retention != 23*Day {
		t.Errorf("--history-retention 3w2d: %v, %v", retention, err)
	}
	err := fs.Parse([]string{"--history-retention", "3y"})
	if err == nil || !strings.Contains(err.Error(), `unknown unit "y"`) || !strings.Contains(err.Error(), "history-retention") {
		t.Errorf("--history-retention 3y: %v; want an error naming the flag and the unit", err)
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"35d", "1w3d", "-1.5s", "100ms", "0", "2562047h47m16.854775807s", "9999999999999999999w"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := Parse(s)
		if err != nil {
			return
		}
		back, err := Parse(Format(d))
		if err != nil || back != d {
			t.Fatalf("Parse(%q) = %v; Format gives %q, which parses to %v, %v", s, d, Format(d), back, err)
		}
		if want, werr := time.ParseDuration(s); werr == nil && want != d {
			t.Fatalf("Parse(%q) = %v; time.ParseDuration says %v", s, d, want)
		}
	})
}

func TestNonNegative(t *testing.T) {
	var d time.Duration
	v := (*NonNegative)(&d)
	if err := v.Set("4w"); err != nil || d != 4*Week || v.String() != "4w" {
		t.Errorf("Set(4w): %v, %v, %q", err, d, v.String())
	}
	if err := v.Set("-1d"); err == nil || !strings.Contains(err.Error(), "negative") || d != 4*Week {
		t.Errorf("Set(-1d): %v, %v; want an error and the value kept", err, d)
	}
	if err := v.Set("1x"); err == nil {
		t.Error("Set(1x): no error")
	}
}
