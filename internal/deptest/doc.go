// Package deptest checks the module's dependency direction (STYLE.md,
// "Dependency direction is a rule with a test"; DESIGN.md, "Components and
// where they live"): which packages may import which. It has no code; the
// rules and the check are in deps_test.go, over one `go list -deps -json`.
package deptest
