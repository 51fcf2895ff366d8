package descriptor

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/testkit"
)

func TestClientIP(t *testing.T) {
	for in, want := range map[string]string{
		"192.0.2.1:1234":          "192.0.2.1",
		"[2001:db8::1]:443":       "2001:db8::1",
		"[fe80::1%eth0]:80":       "fe80::1",
		"[::ffff:192.0.2.1]:80":   "192.0.2.1", // a dual-stack listener's IPv4 client
		"[::ffff:c000:201]:80":    "::ffff:c000:201",
		"192.0.2.1":               "192.0.2.1", // no port
		"2001:db8::1":             "2001:db8::1",
		"[2001:db8::1]":           "2001:db8::1",
		"2001:DB8::1":             "2001:DB8::1", // as written; see "Which text form"
		"":                        Missing,
		"@":                       Invalid, // a Unix socket
		"pipe":                    Invalid,
		"192.0.2.1:":              Invalid,
		"192.0.2.1:65536":         Invalid,
		"[192.0.2.1]:80":          Invalid, // brackets are for IPv6
		"192.0.2.1%eth0:80":       Invalid, // zones are for IPv6
		"[2001:db8::1]:80:80":     Invalid,
		"[2001:db8::1":            Invalid,
		"fe80::1%":                Invalid,
		"192.0.2.01:80":           Invalid, // netip refuses leading zeros
		"1:2:3:4:5:6:7:8:9":       Invalid,
		strings.Repeat("1", 1000): Invalid,
	} {
		if got := ClientIPValue(in); got != want {
			t.Errorf("ClientIPValue(%.40q) = %q, want %q", in, got, want)
		}
	}
}

func TestForwardedFor(t *testing.T) {
	for _, tc := range []struct {
		values []string
		hops   int
		want   string
	}{
		{nil, 1, Missing},
		{[]string{""}, 1, Missing},
		{[]string{" , ,"}, 1, Missing},
		{[]string{"192.0.2.1"}, 1, "192.0.2.1"},
		{[]string{"192.0.2.1"}, 2, Missing},
		{[]string{"192.0.2.1"}, 0, Missing},
		{[]string{"spoofed, 192.0.2.1, 10.0.0.1"}, 1, "10.0.0.1"},
		{[]string{"spoofed, 192.0.2.1, 10.0.0.1"}, 2, "192.0.2.1"},
		{[]string{"spoofed, 192.0.2.1, 10.0.0.1"}, 3, Invalid},
		{[]string{"spoofed, 192.0.2.1, 10.0.0.1"}, 4, Missing},
		// Repeated lines are one list.
		{[]string{"198.51.100.7, 192.0.2.1", "10.0.0.1"}, 2, "192.0.2.1"},
		{[]string{"198.51.100.7", "192.0.2.1,10.0.0.1"}, 3, "198.51.100.7"},
		// Empty elements and whitespace do not count.
		{[]string{"192.0.2.1,,\t10.0.0.1 , "}, 2, "192.0.2.1"},
		{[]string{"192.0.2.1", "", "10.0.0.1"}, 2, "192.0.2.1"},
		// Proxies that write ports, brackets, zones, mapped addresses.
		{[]string{"192.0.2.1:5555, 10.0.0.1"}, 2, "192.0.2.1"},
		{[]string{"[2001:db8::1]:5555, 10.0.0.1"}, 2, "2001:db8::1"},
		{[]string{"2001:db8::1, 10.0.0.1"}, 2, "2001:db8::1"},
		{[]string{"::ffff:192.0.2.1"}, 1, "192.0.2.1"},
		{[]string{"fe80::1%eth0"}, 1, "fe80::1"},
		// The client's own junk on the left is never read.
		{[]string{strings.Repeat("\xff,", 5000) + "192.0.2.1"}, 1, "192.0.2.1"},
		{[]string{"unknown"}, 1, Invalid},
		{[]string{"\xff\xfe"}, 1, Invalid},
		{[]string{strings.Repeat("a", 10<<10)}, 1, Invalid},
	} {
		if got := ForwardedForValue(tc.values, tc.hops); got != tc.want {
			t.Errorf("ForwardedForValue(%.60q, %d) = %q, want %q", tc.values, tc.hops, got, tc.want)
		}
	}
}

// Neither source allocates, on good values or on hostile ones.
func TestAddressSourcesAllocateNothing(t *testing.T) {
	long := strings.Repeat("a", 10<<10)
	commas := []string{strings.Repeat(",", 10<<10) + "192.0.2.1, 10.0.0.1"}
	for _, f := range []func(){
		func() { ClientIPValue("192.0.2.1:1234") },
		func() { ClientIPValue("[fe80::1%eth0]:80") },
		func() { ClientIPValue(long) },
		func() { ClientIPValue("zz:80") },
		func() { ClientIPValue("1.2.3.400") },
		func() { ClientIPValue("1::2::3") },
		func() { ForwardedForValue(commas, 2) },
		func() { ForwardedForValue([]string{long}, 1) },
		func() { ForwardedForValue([]string{"\xff\xfe, 2001:db8::1"}, 2) },
		func() { ForwardedForValue([]string{"::ffff:192.0.2.1"}, 1) },
	} {
		if n := testing.AllocsPerRun(100, f); n != 0 {
			t.Errorf("allocates %v", n)
		}
	}
}

// refForwardedFor is ForwardedForValue written plainly: split the joined lines,
// drop empty elements, take the hops-th from the right and ask netip.
func refForwardedFor(values []string, hops int) (netip.Addr, string) {
	var entries []string
	for _, e := range strings.Split(strings.Join(values, ","), ",") {
		if e = strings.Trim(e, " \t"); e != "" {
			entries = append(entries, e)
		}
	}
	if hops < 1 || len(entries) < hops {
		return netip.Addr{}, Missing
	}
	return refAddress(entries[len(entries)-hops])
}

// refAddress parses an entry with netip: ip:port, [ip]:port, [ip] or ip.
// It returns the address without zone, or Invalid.
func refAddress(e string) (netip.Addr, string) {
	if len(e) > maxEntryLen {
		return netip.Addr{}, Invalid
	}
	a, err := func() (netip.Addr, error) {
		if ap, err := netip.ParseAddrPort(e); err == nil {
			return ap.Addr(), nil
		}
		if strings.HasPrefix(e, "[") && strings.HasSuffix(e, "]") {
			a, err := netip.ParseAddr(e[1 : len(e)-1])
			if err == nil && !a.Is6() {
				return a, errBracket
			}
			return a, err
		}
		return netip.ParseAddr(e)
	}()
	if err != nil {
		return netip.Addr{}, Invalid
	}
	return a.WithZone(""), ""
}

type bracketError struct{}

func (bracketError) Error() string { return "an IPv4 address in brackets" }

var errBracket = bracketError{}

// checkForwardedFor fails t unless ForwardedForValue(values, hops) agrees with
// refForwardedFor: the same reserved value, or the same address, in a
// substring of the entry (ForwardedForValue never builds a string), the
// IPv4-mapped one written dotted as IPv4.
func checkForwardedFor(t *testing.T, values []string, hops int) {
	got := ForwardedForValue(values, hops)
	addr, reserved := refForwardedFor(values, hops)
	if reserved != "" {
		if got != reserved {
			t.Fatalf("ForwardedForValue(%q, %d) = %q, want %q", values, hops, got, reserved)
		}
		return
	}
	a, err := netip.ParseAddr(got)
	if err != nil || a != addr && !(addr.Is4In6() && a == addr.Unmap()) {
		t.Fatalf("ForwardedForValue(%q, %d) = %q, want the address %v", values, hops, got, addr)
	}
	if !strings.Contains(strings.Join(values, ","), got) {
		t.Fatalf("ForwardedForValue(%q, %d) = %q, which the header does not hold", values, hops, got)
	}
}

func forwardedForSeeds() []testkit.Seed {
	s := func(name, lines string, hops int64) testkit.Seed {
		return testkit.Seed{Name: name, Args: []any{lines, hops}}
	}
	return []testkit.Seed{
		s("one", "192.0.2.1", 1),
		s("chain", "spoofed, 192.0.2.1, 10.0.0.1", 2),
		s("lines", "198.51.100.7, 192.0.2.1\n10.0.0.1", 2),
		s("empties", ", ,192.0.2.1,,\t10.0.0.1 , ", 2),
		s("ports", "192.0.2.1:5555, [2001:db8::1]:80, 10.0.0.1", 2),
		s("zone", "[fe80::1%eth0]:80,fe80::2%lo", 1),
		s("mapped", "::ffff:192.0.2.1, 0:0:0:0:0:ffff:192.0.2.1", 1),
		s("embedded-v4", "1:2:3:4:5:6:1.2.3.4, ::1.2.3.4", 2),
		s("bad-v6", "1::2::3, 1:2:3:4:5:6:7:8:9, 12345::, :1::, 1:2:3:4:5:6:7:8::", 3),
		s("bad-v4", "1.2.3.04, 1.2.3.256, 1.2.3, 1.2.3.4.5, .1.2.3", 1),
		s("bracket-v4", "[192.0.2.1]:80", 1),
		s("too-few", "192.0.2.1", 3),
	}
}

func TestFuzzForwardedForCorpus(t *testing.T) {
	testkit.CheckCorpus(t, "FuzzForwardedFor", forwardedForSeeds())
}

// FuzzForwardedFor checks ForwardedForValue, and so ClientIPValue and the address
// parser that keeps netip's errors from allocating, against
// refForwardedFor. lines holds the header lines separated by '\n'.
func FuzzForwardedFor(f *testing.F) {
	f.Fuzz(func(t *testing.T, lines string, hops int64) {
		if hops > MaxHops+2 || hops < -1 {
			return
		}
		checkForwardedFor(t, strings.Split(lines, "\n"), int(hops))
		// ClientIPValue is ForwardedForValue of one entry.
		if !strings.ContainsAny(lines, ",\n") {
			if e := strings.Trim(lines, " \t"); e != "" && ClientIPValue(e) != ForwardedForValue([]string{e}, 1) {
				t.Fatalf("ClientIPValue(%q) = %q, ForwardedFor = %q", e, ClientIPValue(e), ForwardedForValue([]string{e}, 1))
			}
		}
	})
}

func BenchmarkForwardedFor(b *testing.B) {
	for _, bc := range []struct {
		name   string
		values []string
	}{
		{"v4", []string{"198.51.100.7, 192.0.2.1, 10.0.0.1"}},
		{"v6-port", []string{"[2001:db8:85a3::8a2e:370:7334]:443, 10.0.0.1"}},
		{"invalid", []string{"unknown, 10.0.0.1"}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				ForwardedForValue(bc.values, 2)
			}
		})
	}
}
