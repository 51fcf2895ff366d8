package routes

import (
	"fmt"
	"strings"
)

// A template is a parsed pattern.
type template struct {
	method string // "" for every method
	segs   []segment
}

type segKind uint8

const (
	literal segKind = iota // matches itself
	param                  // "{name}": one non-empty segment
	rest                   // "*", last: zero or more segments
)

type segment struct {
	kind segKind
	lit  string // the literal, for kind literal
}

// parse checks a pattern and splits it into its method and segments.
func parse(pattern string) (template, error) {
	var t template
	if len(pattern) > MaxPatternLen {
		return t, fmt.Errorf("pattern of %d bytes is longer than %d (MaxPatternLen)", len(pattern), MaxPatternLen)
	}
	path := pattern
	if i := strings.IndexByte(pattern, ' '); i >= 0 {
		t.method, path = pattern[:i], pattern[i+1:]
		if err := checkMethod(t.method); err != nil {
			return t, err
		}
	}
	switch {
	case path == "":
		return t, fmt.Errorf("empty path")
	case path[0] != '/':
		return t, fmt.Errorf("relative path %q: a path template starts with '/'", short(path))
	case path == "/":
		t.segs = []segment{{kind: literal, lit: ""}}
		return t, nil
	}
	parts := strings.Split(path[1:], "/")
	if len(parts) > MaxSegments {
		return t, fmt.Errorf("%d segments: at most %d (MaxSegments)", len(parts), MaxSegments)
	}
	for i, p := range parts {
		s, err := parseSegment(p)
		if err != nil {
			return t, fmt.Errorf("segment %d: %w", i, err)
		}
		if s.kind == rest && i != len(parts)-1 {
			return t, fmt.Errorf("segment %d: * is not the last segment", i)
		}
		t.segs = append(t.segs, s)
	}
	return t, nil
}

// checkMethod accepts 1 to MaxMethodLen upper-case letters and '-'.
func checkMethod(m string) error {
	if m == "" || len(m) > MaxMethodLen {
		return fmt.Errorf("method %q: 1 to %d (MaxMethodLen) characters", short(m), MaxMethodLen)
	}
	for i := 0; i < len(m); i++ {
		if c := m[i]; (c < 'A' || c > 'Z') && c != '-' {
			return fmt.Errorf("method %q has character %q; allowed are [A-Z-]", short(m), c)
		}
	}
	return nil
}

func parseSegment(p string) (segment, error) {
	switch {
	case p == "":
		return segment{}, fmt.Errorf("empty segment (\"//\" or a trailing '/')")
	case p == "*":
		return segment{kind: rest}, nil
	case p[0] == '{' || p[len(p)-1] == '}':
		name, ok := strings.CutPrefix(p, "{")
		name, ok2 := strings.CutSuffix(name, "}")
		if !ok || !ok2 || strings.ContainsAny(name, "{}") {
			return segment{}, fmt.Errorf("unbalanced braces in %q: a parameter is a whole segment, {name}", short(p))
		}
		if name == "" {
			return segment{}, fmt.Errorf("parameter %q has no name", p)
		}
		for i := 0; i < len(name); i++ {
			if c := name[i]; !isWord(c) {
				return segment{}, fmt.Errorf("parameter %q has character %q; allowed are [A-Za-z0-9_]", short(p), c)
			}
		}
		return segment{kind: param}, nil
	}
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case c == '{' || c == '}':
			return segment{}, fmt.Errorf("unbalanced braces in %q: a parameter is a whole segment, {name}", short(p))
		case c == '*':
			return segment{}, fmt.Errorf("segment %q: * is a whole segment", short(p))
		case c <= ' ' || c == 0x7f || c == '?' || c == '#':
			return segment{}, fmt.Errorf("segment %q has character %q, which a request path does not", short(p), c)
		}
	}
	return segment{kind: literal, lit: p}, nil
}

func isWord(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_'
}

// covers reports whether every request b matches, a matches too: then b,
// declared after a, can never match. It decides segment by segment:
//
//   - a's method is none, or b's;
//   - walking both templates, at each position: a "*" in a covers whatever
//     of b is left; otherwise b must have a segment there that is not "*"
//     (b's "*" matches paths of any length, a fixed segment does not), and
//     a's "{x}" covers b's "{y}" or b's non-empty literal, a's literal
//     covers only the same literal;
//   - b must end where a ends.
//
// The rule is exact, and a later route is shadowed by the union of the
// earlier ones only when one of them alone shadows it: take the request
// with a method no route names (if b has none), a segment no route names
// for each of b's "{y}", and for b's "*" more empty segments than any
// template has; an earlier route that matches this request covers b by
// the rule above, since only "{x}" or an earlier "*" match a segment no
// route names and only "*" matches an empty segment past the root.
func covers(a, b template) bool {
	if a.method != "" && a.method != b.method {
		return false
	}
	for i, s := range a.segs {
		if s.kind == rest {
			return true
		}
		if i == len(b.segs) {
			return false
		}
		switch o := b.segs[i]; {
		case o.kind == rest:
			return false
		case s.kind == param:
			if o.kind == literal && o.lit == "" {
				return false
			}
		case o.kind != literal || o.lit != s.lit:
			return false
		}
	}
	return len(a.segs) == len(b.segs)
}
