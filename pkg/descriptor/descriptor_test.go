package descriptor

import (
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/sluicehq/sluice/pkg/heavy"
)

func TestParseSourceRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Source
	}{
		{"header x-tenant-id", Source{Kind: Header, Header: "x-tenant-id"}},
		{"header X-Api-Key", Source{Kind: Header, Header: "x-api-key"}},
		{"  client-ip ", Source{Kind: ClientIP}},
		{"xff 1", Source{Kind: ForwardedFor, Hops: 1}},
		{"xff 16", Source{Kind: ForwardedFor, Hops: 16}},
	} {
		got, err := ParseSource(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseSource(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
			continue
		}
		back, err := ParseSource(got.String())
		if err != nil || back != got {
			t.Errorf("ParseSource(%q.String() = %q) = %+v, %v", tc.in, got.String(), back, err)
		}
	}
}

func TestParseSourceRejects(t *testing.T) {
	for _, in := range []string{"", "header", "header a b", "header x:y", "header " + strings.Repeat("a", 129),
		"xff 0", "xff 17", "xff -1", "xff one", "client-ip 1", "cookie session", "metadata x"} {
		if s, err := ParseSource(in); err == nil {
			t.Errorf("ParseSource(%q) = %+v, want an error", in, s)
		}
	}
	if _, err := (Source{}).MarshalText(); err == nil {
		t.Error("the zero Source marshals")
	}
}

func TestCheckName(t *testing.T) {
	for _, ok := range []string{"tenant", "api_key", "ip4", strings.Repeat("a", MaxNameLen)} {
		if err := CheckName(ok); err != nil {
			t.Errorf("CheckName(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "Tenant", "_tenant", "1x", "a-b", "a.b", strings.Repeat("a", MaxNameLen+1)} {
		if CheckName(bad) == nil {
			t.Errorf("CheckName(%q) = nil", bad)
		}
	}
}

func TestValue(t *testing.T) {
	for in, want := range map[string]string{
		"":                                 Missing,
		"acme":                             "acme",
		strings.Repeat("a", MaxValueLen):   strings.Repeat("a", MaxValueLen),
		strings.Repeat("a", MaxValueLen+1): Invalid,
		"\xff\xfe":                         Invalid,
		"héllo":                            "héllo",
	} {
		if got := Value(in); got != want {
			t.Errorf("Value(%.20q) = %.20q, want %.20q", in, got, want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { Value("\xff") }); n != 0 {
		t.Errorf("Value allocates %v", n)
	}
}

// Value's ASCII fast path agrees with utf8.ValidString at every length
// and with the first non-ASCII byte at every position: each word load and
// the overlapping last one. ascii is asserted too: a fast path that never
// answers true would pass on Value alone, slower.
func TestValueNonASCIIAnywhere(t *testing.T) {
	for n := 1; n <= MaxValueLen; n++ {
		plain := strings.Repeat("a", n)
		if got := Value(plain); got != plain || !ascii(plain) {
			t.Fatalf("Value(%d × a) = %.20q, ascii %v", n, got, ascii(plain))
		}
		for i := range n {
			for _, b := range []string{"\x80", "\xff", "\xc3\xa9"} {
				v := (plain[:i] + b + plain[i:])[:max(n, i+len(b))]
				want := v
				if !utf8.ValidString(v) {
					want = Invalid
				}
				if len(v) > MaxValueLen {
					want = Invalid
				}
				if got := Value(v); got != want {
					t.Fatalf("Value(%q) = %q, want %q", v, got, want)
				}
				if ascii(v) { // else a value would skip the UTF-8 check
					t.Fatalf("ascii(%q) = true", v)
				}
			}
		}
	}
}

func BenchmarkValue(b *testing.B) {
	for _, v := range []string{"tenant-0000042", "203.0.113.7", strings.Repeat("k", 40), "héllo-wörld"} {
		b.Run(fmt.Sprintf("%d", len(v)), func(b *testing.B) {
			for b.Loop() {
				Value(v)
			}
		})
	}
}

func TestCheckValue(t *testing.T) {
	for _, ok := range []string{"acme", Missing, "10.0.0.1", "héllo"} {
		if err := CheckValue(ok); err != nil {
			t.Errorf("CheckValue(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", Invalid, "\xff", strings.Repeat("a", MaxValueLen+1)} {
		if CheckValue(bad) == nil {
			t.Errorf("CheckValue(%.20q) = nil", bad)
		}
	}
}

// The sketch's reserved key is this package's Invalid: a sidecar that maps
// a bad value to Invalid and a sketch that does so itself agree.
func TestInvalidIsTheSketchs(t *testing.T) {
	if heavy.Invalid != Invalid {
		t.Fatalf("heavy.Invalid = %q, descriptor.Invalid = %q", heavy.Invalid, Invalid)
	}
}
