// Package descriptor names the fourth part of the bucket key (DESIGN.md,
// "The bucket, widened"): a descriptor is one request attribute with many
// values (a tenant, an API key, a client IP), limited per value. It holds
// what every tier shares about one: where a request's value comes from
// (Source), the reserved values, and the bounds that keep a hostile value
// from costing more than its own bucket.
//
// Declared dimensions (callers, procedures) run through the exact global
// loop. A descriptor's values are not declared and may be millions, so no
// tier keeps state per value: sidecars count values in a fixed-size sketch
// (pkg/heavy) and report only heavy ones, aggregators and the controller
// bound the lists they pass on, and a value nobody listed is decided by a
// sidecar's local allowance (pkg/allowance). docs/architecture.md,
// "Descriptors", tells the whole path.
//
// Like pkg/dataplane, it imports only the standard library: limits files,
// the controller, the sidecar and the simulator all use it.
package descriptor

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

const (
	// MaxPerService bounds the descriptors one service may declare: each
	// costs a sketch on every sidecar and a list in every policy.
	MaxPerService = 4

	// MaxValueLen bounds a value: a longer one is never hashed in full or
	// stored; it counts as Invalid.
	MaxValueLen = 256

	// MaxNameLen bounds a descriptor's name.
	MaxNameLen = 63

	// Missing is the value of a request without the attribute: no such
	// header, an empty one, or fewer X-Forwarded-For entries than trusted
	// hops. It has its own limit (the limits' "missing").
	Missing = "_missing"

	// Invalid is the value of a request whose attribute is unusable: longer
	// than MaxValueLen, not valid UTF-8, or not an IP address where one is
	// expected. Such values are counted here, with a metric, and never
	// stored, so garbage cannot fill a sketch's heavy set.
	Invalid = "_invalid"
)

// Reserved reports whether v is one of the values sluice reserves.
func Reserved(v string) bool { return v == Missing || v == Invalid }

// Value returns the value a request's attribute v counts under: Missing
// for "", Invalid for a value longer than MaxValueLen or not valid UTF-8,
// else v. It allocates nothing; the request path calls it on every value
// before the value goes near a sketch.
func Value(v string) string {
	switch {
	case v == "":
		return Missing
	case len(v) > MaxValueLen:
		return Invalid
	case ascii(v):
		return v
	case !utf8.ValidString(v):
		return Invalid
	}
	return v
}

// ascii reports whether v, 1 to MaxValueLen bytes, is all ASCII (so valid
// UTF-8) in word loads: a tenant ID, an API key or an address is, and
// utf8.ValidString takes a byte at a time for all but its whole words (4
// ns of a 14-byte value's decision, a tenth of it; BenchmarkValue).
// Overlapping first and last loads cover a length that is not a multiple
// of the word's.
func ascii(v string) bool {
	const high32, high64 = 0x80808080, 0x8080808080808080
	n := len(v)
	le := binary.LittleEndian
	if n < 8 {
		if n < 4 {
			return (v[0]|v[n>>1]|v[n-1])&0x80 == 0
		}
		return (le.Uint32([]byte(v))|le.Uint32([]byte(v[n-4:])))&high32 == 0
	}
	or := le.Uint64([]byte(v[n-8:]))
	for i := 0; i+8 <= n; i += 8 {
		or |= le.Uint64([]byte(v[i:])) // a load: the conversion does not copy
	}
	return or&high64 == 0
}

// CheckName returns an error unless name may name a descriptor: 1 to
// MaxNameLen characters of [a-z0-9_], starting with a letter. Names are
// metric label values and YAML keys, so they are kept plain.
func CheckName(name string) error {
	if name == "" {
		return fmt.Errorf("empty descriptor name")
	}
	if len(name) > MaxNameLen {
		return fmt.Errorf("descriptor name of %d bytes is longer than %d", len(name), MaxNameLen)
	}
	if name[0] < 'a' || name[0] > 'z' {
		return fmt.Errorf("descriptor name %q does not start with a lower-case letter", name)
	}
	for i := 1; i < len(name); i++ {
		if c := name[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return fmt.Errorf("descriptor name %q has character %q at %d; allowed are [a-z0-9_]", name, c, i)
		}
	}
	return nil
}

// CheckValue returns an error unless v may be named in configuration (an
// override) or a policy: a value a request can carry, valid UTF-8, at most
// MaxValueLen bytes, or Missing. Invalid is refused: it has no limit of
// its own, it is counted under the descriptor's limit.
func CheckValue(v string) error {
	switch {
	case v == "":
		return fmt.Errorf("empty value (a request without the attribute is %q)", Missing)
	case len(v) > MaxValueLen:
		return fmt.Errorf("value of %d bytes is longer than %d", len(v), MaxValueLen)
	case !utf8.ValidString(v):
		return fmt.Errorf("value %q is not valid UTF-8", v)
	case v == Invalid:
		return fmt.Errorf("value %q is reserved", v)
	}
	return nil
}

// Kind is where a request's value comes from.
type Kind uint8

const (
	// Header is a request header, or the gRPC metadata of that name (the
	// same thing on the wire: HTTP/2 headers).
	Header Kind = iota + 1
	// ClientIP is the connection's remote address, without the port.
	ClientIP
	// ForwardedFor is X-Forwarded-For behind Hops trusted proxies.
	ForwardedFor
)

// MaxHops bounds the trusted proxies in front of a sidecar.
const MaxHops = 16

// Source says where a request's value comes from. The zero Source is not
// valid.
type Source struct {
	Kind Kind
	// Header is the header's name, lower case (HTTP/2 and gRPC metadata
	// names are), for Kind Header.
	Header string
	// Hops is the number of trusted proxies in front of the sidecar, for
	// Kind ForwardedFor: each appended the address it received the request
	// from, so the client is the Hops-th address from the right of
	// X-Forwarded-For. 1 to MaxHops.
	Hops int
}

// ParseSource reads a source's text form: "header <name>", "client-ip" or
// "xff <hops>". The error says what is wrong.
func ParseSource(s string) (Source, error) {
	f := strings.Fields(s)
	switch {
	case len(f) == 1 && f[0] == "client-ip":
		return Source{Kind: ClientIP}, nil
	case len(f) == 2 && f[0] == "header":
		name := strings.ToLower(f[1])
		if err := checkHeaderName(name); err != nil {
			return Source{}, err
		}
		return Source{Kind: Header, Header: name}, nil
	case len(f) == 2 && f[0] == "xff":
		n, err := strconv.Atoi(f[1])
		if err != nil || n < 1 || n > MaxHops {
			return Source{}, fmt.Errorf("xff hops %q: want a number of trusted proxies from 1 to %d", f[1], MaxHops)
		}
		return Source{Kind: ForwardedFor, Hops: n}, nil
	}
	return Source{}, fmt.Errorf("source %q: want \"header <name>\", \"client-ip\" or \"xff <trusted hops>\"", s)
}

// String returns the source's text form, which ParseSource reads back.
func (s Source) String() string {
	switch s.Kind {
	case Header:
		return "header " + s.Header
	case ClientIP:
		return "client-ip"
	case ForwardedFor:
		return "xff " + strconv.Itoa(s.Hops)
	}
	return "Source(" + strconv.Itoa(int(s.Kind)) + ")"
}

// MarshalText returns the text form; an invalid source is an error.
func (s Source) MarshalText() ([]byte, error) {
	if _, err := ParseSource(s.String()); err != nil {
		return nil, err
	}
	return []byte(s.String()), nil
}

// UnmarshalText sets s from its text form; see ParseSource.
func (s *Source) UnmarshalText(text []byte) error {
	v, err := ParseSource(string(text))
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// checkHeaderName accepts an HTTP token (RFC 9110) of at most 128 bytes
// that is not a pseudo-header and not a header sluice itself sets or
// reads for another purpose.
func checkHeaderName(name string) error {
	if name == "" || len(name) > 128 {
		return fmt.Errorf("header name %q: want 1 to 128 characters", name)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return fmt.Errorf("header name %q has character %q at %d, not allowed in an HTTP header name", name, c, i)
		}
	}
	return nil
}
