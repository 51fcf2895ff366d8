package dataplane

import (
	"encoding"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
)

// text is what both types provide.
type text interface {
	comparable
	String() string
	encoding.TextMarshaler
}

// checkText checks that every value in values has a text form that parse
// and UnmarshalText read back, that bad is refused with an error naming it,
// and that the strings that are no value's name are refused by both.
func checkText[T text](t *testing.T, values []T, bad T, parse func(string) (T, error), unmarshal func(*T, []byte) error, what string) {
	t.Helper()
	for _, v := range values {
		b, err := v.MarshalText()
		if err != nil || string(b) != v.String() {
			t.Errorf("%v.MarshalText() = %q, %v; want %q", v, b, err, v.String())
		}
		if got, err := parse(v.String()); err != nil || got != v {
			t.Errorf("parse(%q) = %v, %v; want %v", v, got, err, v)
		}
		var back T
		if err := unmarshal(&back, b); err != nil || back != v {
			t.Errorf("UnmarshalText(%q) = %v, %v; want %v", b, back, err, v)
		}
	}
	if b, err := bad.MarshalText(); err == nil || !strings.Contains(err.Error(), bad.String()) {
		t.Errorf("%v.MarshalText() = %q, %v; want an error naming it", bad, b, err)
	}
	for _, s := range []string{"", "closed", "Open", "open ", "sidecar\x00", "enforce"} {
		if _, err := parse(s); err == nil || err.Error() != strconv.Quote(s)+" is not "+what {
			t.Errorf("parse(%q): %v; want %q is not %s", s, err, s, what)
		}
		keep := values[len(values)-1]
		if err := unmarshal(&keep, []byte(s)); err == nil || keep != values[len(values)-1] {
			t.Errorf("UnmarshalText(%q) = %v, left %v; want an error and the value unchanged", s, err, keep)
		}
	}
}

func TestFailModeText(t *testing.T) {
	checkText(t, []FailMode{FailOpen, FailHold, FailLocal}, FailMode(3), ParseFailMode,
		(*FailMode).UnmarshalText, "open, hold or local")
	if got := FailMode(3).String(); got != "FailMode(3)" {
		t.Errorf("FailMode(3).String() = %q", got)
	}
	var zero FailMode
	if zero != FailOpen {
		t.Errorf("zero fail mode %v, want open (DESIGN.md's default)", zero)
	}
}

func TestEnforcementText(t *testing.T) {
	checkText(t, []Enforcement{EnforceSidecar, EnforceUpstream}, Enforcement(2), ParseEnforcement,
		(*Enforcement).UnmarshalText, "sidecar or upstream")
	if got := Enforcement(2).String(); got != "Enforcement(2)" {
		t.Errorf("Enforcement(2).String() = %q", got)
	}
	var zero Enforcement
	if zero != EnforceSidecar {
		t.Errorf("zero enforcement %v, want sidecar", zero)
	}
}

// The text form is what encoders use, e.g. a JSON document.
func TestJSON(t *testing.T) {
	type doc struct {
		FailMode    FailMode    `json:"fail_mode"`
		Enforcement Enforcement `json:"enforcement"`
	}
	b, err := json.Marshal(doc{FailLocal, EnforceUpstream})
	if err != nil || string(b) != `{"fail_mode":"local","enforcement":"upstream"}` {
		t.Fatalf("Marshal = %s, %v", b, err)
	}
	var d doc
	if err := json.Unmarshal(b, &d); err != nil || d != (doc{FailLocal, EnforceUpstream}) {
		t.Errorf("Unmarshal = %+v, %v", d, err)
	}
	if err := json.Unmarshal([]byte(`{"fail_mode":"closed"}`), &d); err == nil || !strings.Contains(err.Error(), `"closed" is not open, hold or local`) {
		t.Errorf("Unmarshal of an unknown fail mode: %v", err)
	}
}
