package names

import (
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"
)

// oracle is the rule of Check written the obvious way: a regular expression
// over bytes, the length bound, and the reserved names.
var oracle = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

func oracleOK(s string) bool {
	return s == Overflow || len(s) <= MaxLen && oracle.MatchString(s)
}

// FuzzCheck compares Check with the oracle on any string, and checks that
// its error message stays short and printable whatever the name: the
// message goes into reject reasons, logs and admission responses.
func FuzzCheck(f *testing.F) {
	for _, s := range []string{
		"checkout", "payments.v2-eu_1", Unknown, Overflow, "_overflow_", "_Overflow", "9lives", "",
		"-dash", ".dot", "_under", "a/b", "a b", "a\x00", "ünicode", "\xff\xfe", "a\xc3", "a\n",
		strings.Repeat("a", MaxLen), strings.Repeat("a", MaxLen+1), strings.Repeat("é", 200),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		err := Check(s)
		if want := oracleOK(s); (err == nil) != want {
			t.Fatalf("Check(%q) = %v, oracle says ok=%v", s, err, want)
		}
		if err == nil {
			return
		}
		msg := err.Error()
		// A truncated name (64 bytes, quoted: at most 4 bytes per byte)
		// plus the fixed text.
		if len(msg) > 4*64+128 {
			t.Errorf("Check(%d bytes): error of %d bytes", len(s), len(msg))
		}
		if !utf8.ValidString(msg) {
			t.Errorf("Check(%q): error %q is not valid UTF-8", s, msg)
		}
	})
}

// procedureOracle is the rule of CheckProcedure written the obvious way.
var procedureOracle = regexp.MustCompile(`^[A-Za-z0-9/][A-Za-z0-9._-]*(/[A-Za-z0-9._-]+)*$`)

// FuzzCheckProcedure compares CheckProcedure and ValidProcedure with the
// oracle on any string, and bounds the error message as FuzzCheck does.
func FuzzCheckProcedure(f *testing.F) {
	for _, s := range []string{
		"create-charge", "/shop.Checkout/Pay", Other, Overflow, "/", "//", "/a/", "a//b", "_x", "",
		"a b", "a\x00", "\xff", strings.Repeat("a", MaxProcedureLen+1), strings.Repeat("/a", 200),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		err := CheckProcedure(s)
		want := s == Other || len(s) <= MaxProcedureLen && procedureOracle.MatchString(s) && !strings.HasPrefix(s, "//") && !strings.HasSuffix(s, "/")
		if (err == nil) != want || ValidProcedure(s) != want {
			t.Fatalf("CheckProcedure(%q) = %v, ValidProcedure = %v, oracle says ok=%v", s, err, ValidProcedure(s), want)
		}
		if err != nil && (len(err.Error()) > 4*64+128 || !utf8.ValidString(err.Error())) {
			t.Errorf("CheckProcedure(%d bytes): error %q", len(s), err)
		}
	})
}
