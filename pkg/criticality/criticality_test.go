package criticality

import (
	"strings"
	"testing"
)

func TestParseRoundTrips(t *testing.T) {
	for _, tier := range Tiers {
		for _, s := range []string{tier.String(), strings.ToLower(tier.String())} {
			got, ok := Parse(s)
			if !ok || got != tier {
				t.Errorf("Parse(%q) = %v, %v; want %v", s, got, ok, tier)
			}
		}
	}
	for _, s := range []string{"", "None", "critical ", "Critical", "CRITICAL_PLUS_PLUS", "5", strings.Repeat("x", 1000)} {
		if got, ok := Parse(s); ok || got != None {
			t.Errorf("Parse(%q) = %v, %v; want None, false", s, got, ok)
		}
	}
}

func TestOrderIsShedOrder(t *testing.T) {
	for i := 1; i < len(Tiers); i++ {
		if !(Tiers[i-1] < Tiers[i]) {
			t.Errorf("%v before %v: a larger number must be a lower tier", Tiers[i-1], Tiers[i])
		}
	}
	if Tier(5).Valid() || !Sheddable.Valid() || !None.Valid() {
		t.Error("Valid: want None..Sheddable")
	}
	if got := Tier(9).String(); got != "Tier(9)" {
		t.Errorf("String of an invalid tier = %q", got)
	}
}

func TestCap(t *testing.T) {
	for _, c := range []struct {
		t, max, want Tier
		lowered      bool
	}{
		{CriticalPlus, Critical, Critical, true},
		{Critical, Critical, Critical, false},
		{Sheddable, Critical, Sheddable, false},
		{CriticalPlus, None, CriticalPlus, false},
		{None, Critical, None, false},
	} {
		if got, lowered := Cap(c.t, c.max); got != c.want || lowered != c.lowered {
			t.Errorf("Cap(%v, %v) = %v, %v; want %v, %v", c.t, c.max, got, lowered, c.want, c.lowered)
		}
	}
}

func TestParseConfigNamesWhatIsAccepted(t *testing.T) {
	_, err := ParseConfig("URGENT")
	if err == nil || !strings.Contains(err.Error(), `"URGENT"`) || !strings.Contains(err.Error(), "SHEDDABLE_PLUS") {
		t.Errorf("ParseConfig(URGENT) = %v", err)
	}
	_, err = ParseConfig(strings.Repeat("a", 500))
	if err == nil || len(err.Error()) > 200 {
		t.Errorf("a long value is quoted whole: %v", err)
	}
}

func TestParseAllocatesNothing(t *testing.T) {
	v := strings.Clone("SHEDDABLE_PLUS")
	if n := testing.AllocsPerRun(100, func() { Parse(v) }); n != 0 {
		t.Errorf("Parse allocates %v", n)
	}
}
