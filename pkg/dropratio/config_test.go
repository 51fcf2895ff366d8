package dropratio

import (
	"math"
	"strconv"
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	with := func(f func(*Config)) Config {
		c := DefaultConfig()
		f(&c)
		return c
	}
	tests := []struct {
		name string
		cfg  Config
		want []string // one substring per expected problem
	}{
		{"default", DefaultConfig(), nil},
		{"MinRate 0", with(func(c *Config) { c.MinRate = 0 }), nil},
		{"PMax 1.5", with(func(c *Config) { c.PMax = 1.5 }), []string{"dropratio: PMax 1.5 is outside (0, 1)"}},
		{"PMax 1", with(func(c *Config) { c.PMax = 1 }), []string{"PMax 1 is outside (0, 1)"}},
		{"PMax 0", with(func(c *Config) { c.PMax = 0 }), []string{"PMax 0 is outside (0, 1)"}},
		{"PMax NaN", with(func(c *Config) { c.PMax = nan }), []string{"PMax NaN is outside (0, 1)"}},
		{"MinRate negative", with(func(c *Config) { c.MinRate = -1 }), []string{"MinRate -1 is outside [0, +Inf)"}},
		{"MinRate Inf", with(func(c *Config) { c.MinRate = inf }), []string{"MinRate +Inf is outside [0, +Inf)"}},
		{"ReleaseRate 1", with(func(c *Config) { c.ReleaseRate = 1 }), []string{"ReleaseRate 1 is outside (1, +Inf)"}},
		{"ReleaseRate Inf", with(func(c *Config) { c.ReleaseRate = inf }), []string{"ReleaseRate +Inf is outside (1, +Inf)"}},
		{"zero value", Config{}, []string{"PMax 0 is", "ReleaseRate 0 is"}},
		{"all three", Config{PMax: nan, MinRate: -2, ReleaseRate: 0.5}, []string{"PMax NaN", "MinRate -2", "ReleaseRate 0.5"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate() = nil, want %d problems", len(tt.want))
			}
			lines := strings.Split(err.Error(), "\n")
			if len(lines) != len(tt.want) {
				t.Errorf("Validate() reported %d problems, want %d:\n%v", len(lines), len(tt.want), err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate() = %q, want it to contain %q", err, w)
				}
			}
			if l, err2 := New(tt.cfg); l != nil || err2 == nil {
				t.Errorf("New() = %v, %v; want nil and an error", l, err2)
			}
		})
	}
}

func TestStrings(t *testing.T) {
	for _, tt := range []struct {
		got, want string
	}{
		{Enforce.String(), "enforce"},
		{Shadow.String(), "shadow"},
		{Mode(9).String(), "Mode(9)"},
		{None.String(), "none"},
		{OverLimit.String(), "over_limit"},
		{OverCapacity.String(), "over_capacity"},
		{Reason(7).String(), "Reason(7)"},
	} {
		if tt.got != tt.want {
			t.Errorf("String() = %q, want %q", tt.got, tt.want)
		}
	}
}

// Every text form of a mode is the one ParseMode reads back; nothing else
// is a mode.
func TestModeText(t *testing.T) {
	for _, m := range []Mode{Enforce, Shadow} {
		text, err := m.MarshalText()
		if err != nil || string(text) != m.String() {
			t.Errorf("%v.MarshalText() = %q, %v; want %q", m, text, err, m.String())
		}
		var back Mode = 7
		if err := back.UnmarshalText(text); err != nil || back != m {
			t.Errorf("UnmarshalText(%q) = %v, %v; want %v", text, back, err, m)
		}
		if got, err := ParseMode(m.String()); err != nil || got != m {
			t.Errorf("ParseMode(%q) = %v, %v", m, got, err)
		}
	}
	if text, err := Mode(2).MarshalText(); err == nil || !strings.Contains(err.Error(), "Mode(2)") {
		t.Errorf("Mode(2).MarshalText() = %q, %v; want an error naming it", text, err)
	}
	for _, s := range []string{"", "Shadow", "enforce ", "upstream"} {
		m := Shadow
		if err := m.UnmarshalText([]byte(s)); err == nil || m != Shadow ||
			err.Error() != strconv.Quote(s)+" is not enforce or shadow" {
			t.Errorf("UnmarshalText(%q) = %v, left %v; want an error naming it, m unchanged", s, err, m)
		}
	}
}
