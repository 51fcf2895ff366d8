package descriptor

import (
	"net/netip"
	"strings"
)

// The two address sources, ClientIP and ForwardedFor, take their value from
// text a request carries. Both run on every request of a service that
// declares them, so neither allocates: the value is a substring of the
// input, or Missing or Invalid, never a new string. Neither calls
// netip.ParseAddr on input it has not validated first, because a parse
// error allocates (and a zone is interned in a process-wide table): the
// parser below accepts exactly what netip.ParseAddr accepts, which
// FuzzForwardedFor checks.
//
// # Which text form
//
// One address has many text forms ("2001:db8::1", "2001:DB8:0::1"), and a
// limit per value is only a limit per address if every request from it
// carries the same form. The value is the address as written, not
// re-rendered, with two normalisations that cost no allocation because
// each leaves a substring: the port, brackets and zone are cut, and an
// IPv4-mapped IPv6 address written with a dotted tail ("::ffff:192.0.2.1",
// which a dual-stack proxy writes for an IPv4 client) becomes the IPv4
// address, as Go's net package writes the same client's RemoteAddr.
//
// Re-rendering the rest (upper-case or uncompressed IPv6) would allocate a
// string per request and buy nothing: the entry ForwardedForValue picks was
// written by the first trusted proxy, which renders every address it sees
// in one form of its own, and an entry a client wrote itself (a source with
// more hops than there are proxies) is a free choice of address anyway, so
// its spelling gives the client no more values than the address does.
// A zone names an interface of the host that wrote the entry, not the
// client, so it is no part of the value either.
//
// Per-/64 bucketing of IPv6 clients (one host usually owns a /64, so it can
// otherwise send from 2^64 values) would need a source option and a
// rendered prefix; it is not done.

// maxEntryLen bounds an address entry, port, brackets and zone included:
// the longest address text is 45 bytes, and a longer entry is Invalid
// before it is parsed.
const maxEntryLen = 96

// ClientIPValue returns the value of a ClientIP source: the address of
// remoteAddr, a connection's remote address as net.Conn and
// http.Request.RemoteAddr give it ("192.0.2.1:1234", "[2001:db8::1]:443"),
// with the port, brackets and zone cut. A bare address without a port is
// taken as is. Missing for "", Invalid when remoteAddr holds no IP address
// (a Unix socket's "@", say). It allocates nothing.
func ClientIPValue(remoteAddr string) string {
	if remoteAddr == "" {
		return Missing
	}
	return address(remoteAddr)
}

// ForwardedForValue returns the value of a ForwardedFor source with hops trusted
// proxies: the hops-th entry from the right of X-Forwarded-For, whose
// header lines are values (as http.Header and gRPC metadata hold them;
// repeated lines are one comma-separated list, RFC 9110 §5.3). Each proxy
// appends the address it received the request from, so the entries right
// of the hops-th were written by trusted proxies and the hops-th is the
// client's address as the first of them saw it; everything left of it may
// be the client's own invention and is never read.
//
// Entries are trimmed of spaces and tabs; empty ones are skipped, as RFC
// 9110 §5.6.1 asks of list recipients. An entry is an address as ClientIPValue
// takes it: "192.0.2.1", "2001:db8::1", or the "192.0.2.1:1234" and
// "[2001:db8::1]:1234" some proxies write. The value is Missing when there
// are fewer than hops entries (or hops < 1), Invalid when the entry is not
// an IP address. See above for its text form. It allocates nothing, and
// reads only the last hops entries of a long header.
func ForwardedForValue(values []string, hops int) string {
	if hops < 1 {
		return Missing
	}
	n := 0
	for i := len(values) - 1; i >= 0; i-- {
		v := values[i]
		for end := len(v); end >= 0; {
			start := strings.LastIndexByte(v[:end], ',') + 1
			if e := trimOWS(v[start:end]); e != "" {
				if n++; n == hops {
					return address(e)
				}
			}
			end = start - 1
		}
	}
	return Missing
}

// trimOWS trims the optional whitespace of RFC 9110: spaces and tabs.
func trimOWS(s string) string {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}

// address returns the value of one non-empty address entry: its address
// text without port, brackets or zone, or Invalid.
func address(e string) string {
	if len(e) > maxEntryLen {
		return Invalid
	}
	host, bracketed := e, false
	if e[0] == '[' {
		end := strings.LastIndexByte(e, ']')
		if end < 0 || !isPort(e[end+1:]) && end+1 != len(e) {
			return Invalid
		}
		host, bracketed = e[1:end], true
	} else if i := strings.IndexByte(e, ':'); i >= 0 && strings.IndexByte(e[i+1:], ':') < 0 {
		// One colon: an IPv4 address and a port (an IPv6 address has
		// at least two).
		if !isPort(e[i:]) {
			return Invalid
		}
		host = e[:i]
	}
	zoned := false
	if i := strings.IndexByte(host, '%'); i >= 0 {
		if i == len(host)-1 {
			return Invalid // netip: a zone, if written, is not empty
		}
		host, zoned = host[:i], true
	}
	switch i := strings.IndexAny(host, ".:"); {
	case i < 0:
		return Invalid
	case host[i] == '.': // IPv4, which takes neither zone nor brackets
		if !validIPv4(host) || zoned || bracketed {
			return Invalid
		}
		return host
	case !validIPv6(host):
		return Invalid
	}
	if strings.IndexByte(host, '.') >= 0 {
		// A dotted tail: an IPv4-mapped address is the IPv4 one. host is
		// valid, so netip parses it without allocating.
		if a, _ := netip.ParseAddr(host); a.Is4In6() {
			return host[strings.LastIndexByte(host, ':')+1:]
		}
	}
	return host
}

// isPort reports whether s is ':' and a port: 1 to 5 decimal digits of at
// most 65535, as netip.ParseAddrPort reads one.
func isPort(s string) bool {
	if len(s) < 2 || len(s) > 6 || s[0] != ':' {
		return false
	}
	n := 0
	for i := 1; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
		n = n*10 + int(s[i]-'0')
	}
	return n <= 65535
}

// validIPv4 reports whether s is four decimal fields of at most 255,
// separated by dots, none with a leading zero: netip's IPv4 form.
func validIPv4(s string) bool {
	fields, val, digits := 0, 0, 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= '0' && c <= '9':
			if digits == 1 && val == 0 {
				return false
			}
			val, digits = val*10+int(c-'0'), digits+1
			if val > 255 {
				return false
			}
		case c == '.':
			if digits == 0 || fields == 3 {
				return false
			}
			fields, val, digits = fields+1, 0, 0
		default:
			return false
		}
	}
	return fields == 3 && digits > 0
}

// validIPv6 reports whether s is an IPv6 address as netip writes and reads
// it (RFC 4291 §2.2): eight groups of 1 to 4 hex digits separated by
// colons, or fewer with one "::" standing for at least one zero group, the
// last two groups optionally written as an IPv4 address.
func validIPv6(s string) bool {
	groups, ellipsis := 0, false
	if strings.HasPrefix(s, "::") {
		ellipsis, s = true, s[2:]
		if s == "" {
			return true
		}
	}
	for {
		off := 0
		for off < len(s) && isHex(s[off]) {
			if off++; off > 4 {
				return false
			}
		}
		if off == 0 {
			return false
		}
		if off < len(s) && s[off] == '.' {
			// The embedded IPv4 address: the last two groups.
			if !ellipsis && groups != 6 || groups > 6 || !validIPv4(s) {
				return false
			}
			groups += 2
			break
		}
		groups++
		s = s[off:]
		if s == "" {
			break
		}
		if s[0] != ':' || len(s) == 1 || groups == 8 {
			return false
		}
		s = s[1:]
		if s[0] == ':' {
			if ellipsis {
				return false
			}
			ellipsis, s = true, s[1:]
			if s == "" {
				break
			}
		}
	}
	if ellipsis {
		return groups < 8
	}
	return groups == 8
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}
