// Package deptest checks the module's dependency direction
// (docs/architecture.md, "Packages"): which packages may import which. It has no code; the
// rules and the check are in deps_test.go, over one `go list -deps -json`.
package deptest
