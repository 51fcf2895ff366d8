// Package names defines which service names sluice accepts on the wire and the
// names it reserves for itself.
//
// Every tier checks names with Check before a name becomes a map key, so a
// hostile or broken peer can not grow memory with long or odd names, and the
// reserved names below can never collide with a real service.
package names

import (
	"fmt"
	"strings"
)

const (
	// MaxLen bounds a service name. Kubernetes names are at most 253
	// characters; a service name longer than that is a bug or an attack.
	MaxLen = 253

	// Unknown is the caller of a request that names none.
	Unknown = "unknown"

	// Overflow stands for every caller seen after a callee's table of
	// distinct callers is full. The leading underscore keeps it apart from
	// real service names, which must start with a letter or digit.
	Overflow = "_overflow"
)

// Check reports whether s may be used as a service name: 1 to MaxLen
// characters from [A-Za-z0-9._-], starting with a letter or digit, or one of
// the reserved names. The error says what is wrong, for reject reasons and
// admission messages.
func Check(s string) error {
	if Valid(s) {
		return nil
	}
	if s == "" {
		return fmt.Errorf("empty name")
	}
	if len(s) > MaxLen {
		return fmt.Errorf("name of %d bytes is longer than %d", len(s), MaxLen)
	}
	if !isAlnum(s[0]) {
		return fmt.Errorf("name %q does not start with a letter or digit", truncate(s))
	}
	for i := 1; i < len(s); i++ {
		c := s[i]
		if !isAlnum(c) && c != '.' && c != '_' && c != '-' {
			return fmt.Errorf("name %q has character %q at %d; allowed are [A-Za-z0-9._-]", truncate(s), c, i)
		}
	}
	return nil
}

// Valid is Check without the error: it allocates nothing, for the request
// path.
func Valid(s string) bool {
	if s == Overflow {
		return true
	}
	if s == "" || len(s) > MaxLen || !isAlnum(s[0]) {
		return false
	}
	for i := 1; i < len(s); i++ {
		if c := s[i]; !isAlnum(c) && c != '.' && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

func isAlnum(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9'
}

// truncate keeps error messages short when the name itself is the problem.
func truncate(s string) string {
	const n = 64
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "?") + "…"
}

// The xDS names of a DropPolicy, the one place the controller's server and
// the sidecars' client take them from (docs/architecture.md, "Protocol").
const (
	// DropPolicyType is the xDS type URL of a DropPolicy resource.
	DropPolicyType = "type.googleapis.com/sluice.v1.DropPolicy"
	// CalleePrefix and CallerPrefix start the resource names of inbound
	// and outbound enforcement: "callee/<svc>", "caller/<svc>".
	CalleePrefix = "callee/"
	CallerPrefix = "caller/"
)

// Callee is the resource name for inbound enforcement at service: its
// sidecars drop what its callers send.
func Callee(service string) string { return CalleePrefix + service }

// Caller is the resource name for outbound enforcement by service.
func Caller(service string) string { return CallerPrefix + service }

// Procedure names: what a request does at its callee, the third part of a
// bucket key (issue #14). For gRPC it is the full method as the server sees
// it, "/shop.Checkout/Pay"; for HTTP the name a callee's route declares,
// "create-charge". Procedures are declared, not free-form, so that a
// caller can not grow a table or a metric by inventing them.
const (
	// MaxProcedureLen bounds a procedure name, as MaxLen bounds a service.
	MaxProcedureLen = 253

	// Other is the procedure of every request that no route of its callee
	// matches, and of a gRPC request whose method is not a valid name. The
	// leading underscore keeps it apart from declared procedures, which
	// must start with a letter, a digit or '/'.
	Other = "_other"
)

// CheckProcedure reports whether s may be used as a procedure name: 1 to
// MaxProcedureLen characters from [A-Za-z0-9._/-], starting with a letter,
// a digit or '/', with no empty part between slashes ("a//b") and no
// trailing '/'; or Other. A gRPC full method "/pkg.Service/Method" is one.
// Service names (Check) do not admit Other, nor procedure names Overflow.
func CheckProcedure(s string) error {
	if ValidProcedure(s) {
		return nil
	}
	switch {
	case s == "":
		return fmt.Errorf("empty procedure")
	case len(s) > MaxProcedureLen:
		return fmt.Errorf("procedure of %d bytes is longer than %d", len(s), MaxProcedureLen)
	case !isAlnum(s[0]) && s[0] != '/':
		return fmt.Errorf("procedure %q does not start with a letter, digit or '/'", truncate(s))
	case s[len(s)-1] == '/':
		return fmt.Errorf("procedure %q ends with '/'", truncate(s))
	}
	for i := 1; i < len(s); i++ {
		if c := s[i]; !isProcedureChar(c) {
			return fmt.Errorf("procedure %q has character %q at %d; allowed are [A-Za-z0-9._/-]", truncate(s), c, i)
		}
		if s[i] == '/' && s[i-1] == '/' {
			return fmt.Errorf("procedure %q has an empty part at %d", truncate(s), i)
		}
	}
	return fmt.Errorf("procedure %q is not valid", truncate(s)) // not reached
}

// ValidProcedure is CheckProcedure without the error: it allocates
// nothing, for the request path.
func ValidProcedure(s string) bool {
	if s == Other {
		return true
	}
	if s == "" || len(s) > MaxProcedureLen || !isAlnum(s[0]) && s[0] != '/' || s[len(s)-1] == '/' {
		return false
	}
	for i := 1; i < len(s); i++ {
		if c := s[i]; !isProcedureChar(c) || c == '/' && s[i-1] == '/' {
			return false
		}
	}
	return true
}

func isProcedureChar(c byte) bool {
	return isAlnum(c) || c == '.' || c == '_' || c == '-' || c == '/'
}
