package names

import (
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"checkout", true},
		{"payments.v2-eu_1", true},
		{Unknown, true},
		{Overflow, true},
		{"9lives", true},
		{strings.Repeat("a", MaxLen), true},
		{"", false},
		{strings.Repeat("a", MaxLen+1), false},
		{"_private", false},
		{"-dash", false},
		{"has space", false},
		{"slash/inside", false},
		{"ünicode", false},
		{"nul\x00", false},
	} {
		err := Check(tc.name)
		if (err == nil) != tc.ok {
			t.Errorf("Check(%q) = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}

func TestResourceNames(t *testing.T) {
	if got := Callee("checkout"); got != "callee/checkout" {
		t.Errorf("Callee = %q", got)
	}
	if got := Caller("web"); got != "caller/web" {
		t.Errorf("Caller = %q", got)
	}
}
