//go:build !race

package child

// Race reports whether this program was built with the race detector: a
// test built with -race builds the binaries it runs with -race too.
const Race = false
