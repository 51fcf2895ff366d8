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

func TestCheckProcedure(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"create-charge", true},
		{"/shop.Checkout/Pay", true},
		{"/grpc.health.v1.Health/Check", true},
		{"v1/items.get", true},
		{Other, true},
		{strings.Repeat("a", MaxProcedureLen), true},
		{"", false},
		{strings.Repeat("a", MaxProcedureLen+1), false},
		{Overflow, false},
		{"_private", false},
		{"-dash", false},
		{"/", false},
		{"/shop.Checkout/", false},
		{"/shop//Pay", false},
		{"has space", false},
		{"query?x", false},
		{"ünicode", false},
		{"nul\x00", false},
	} {
		err := CheckProcedure(tc.name)
		if (err == nil) != tc.ok {
			t.Errorf("CheckProcedure(%q) = %v, want ok=%v", tc.name, err, tc.ok)
		}
		if ValidProcedure(tc.name) != tc.ok {
			t.Errorf("ValidProcedure(%q) = %v, want %v", tc.name, !tc.ok, tc.ok)
		}
	}
	// A service name is not a procedure's reserved name, nor the reverse.
	if Valid(Other) {
		t.Errorf("Valid(%q) = true: the service namespace does not reserve it", Other)
	}
}
