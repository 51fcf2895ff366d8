package wyhash

import (
	"fmt"
	"hash/maphash"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
)

// Strings that differ in any single byte hash apart (but for a chance of
// 2⁻⁶⁴ a pair), at every length a table takes: else callers could make
// names or values collide.
func TestHashUsesEveryByte(t *testing.T) {
	k := New()
	r := rand.New(rand.NewPCG(1, 2))
	for n := 1; n <= 300; n++ {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		_, _, h := k.Hash(string(b), uint64(n))
		for i := range b {
			c := b[i]
			b[i] ^= 1 << r.IntN(8)
			if _, _, h2 := k.Hash(string(b), uint64(n)); h2 == h {
				t.Errorf("length %d: changing byte %d leaves the hash at %#x", n, i, h)
			}
			b[i] = c
		}
	}
}

// A string of at most Short bytes is its length and its words: the
// tables compare those instead of the bytes.
func TestShortStringIsItsWords(t *testing.T) {
	k := New()
	r := rand.New(rand.NewPCG(3, 4))
	for n := range Short + 1 {
		for range 1000 {
			b := make([]byte, n)
			for i := range b {
				b[i] = byte(r.Uint32())
			}
			lo, hi, _ := k.Hash(string(b), 0)
			if got := unwords(n, lo, hi); got != string(b) {
				t.Fatalf("length %d: words %#x %#x give %q, want %q", n, lo, hi, got, b)
			}
		}
	}
}

// unwords is the string of n bytes whose words are lo and hi.
func unwords(n int, lo, hi uint64) string {
	b := make([]byte, n)
	le := func(w uint64, at, size int) {
		for i := range size {
			b[at+i] = byte(w >> (8 * i))
		}
	}
	switch {
	case n >= 8:
		le(hi, n-8, 8)
		le(lo, 0, 8)
	case n >= 4:
		le(hi, n-4, 4)
		le(lo, 0, 4)
	case n > 0:
		b[n-1], b[n/2], b[0] = byte(lo), byte(lo>>8), byte(lo>>16)
	}
	return string(b)
}

// Strings of different lengths hash apart when seeded with their lengths,
// as pkg/heavy seeds them: no two of a million decimal numbers, nor of
// a run of one byte at every length, share a hash. A seed XORed into a
// word gave pairs such as "1000" and "10000" the same hash under every key
// (one number in a hundred had such a twin), and any value of 8 to 15 bytes
// a 16-byte twin, built here.
func TestHashTellsLengthsApart(t *testing.T) {
	k := New()
	seen := make(map[uint64]string, 1<<20)
	add := func(s string) {
		_, _, h := k.Hash(s, uint64(len(s)))
		if o, ok := seen[h]; ok && o != s {
			t.Fatalf("%q and %q hash alike: %#x", o, s, h)
		}
		seen[h] = s
	}
	for i := range 1_000_000 {
		add(strconv.Itoa(i))
	}
	for n := 1; n <= 300; n++ {
		add(strings.Repeat("a", n))
	}
	for n := 8; n < 16; n++ {
		v := fmt.Sprintf("tenant-%0*d", n-7, 42)
		// The same first word, and a last word that differs from v's by
		// the lengths' XOR.
		twin := v[:8] + string(v[n-8]^byte(n^16)) + v[n-7:]
		_, _, h := k.Hash(v, uint64(n))
		_, _, h2 := k.Hash(twin, 16)
		if h == h2 {
			t.Errorf("%q and %q hash alike: %#x", v, twin, h)
		}
	}
}

// One string under seeds that differ only in their high bits, as the
// sidecar seeds a peer's leaves (its length | procedure index << 32),
// spreads as random places would: 257 of them in 1024 places, linear
// probing, the longest run at most 96 (random hashes: a median of 6, and
// 21 at most in 30,000 keys) for each of 3,000 keys. The seed passed
// through the last multiply alone gave runs over 96 for about one key in
// 330: ten or so here.
func TestSeedsSpreadOneString(t *testing.T) {
	const places, leaves, maxRun = 1024, 257, 96
	r := rand.New(rand.NewPCG(5, 6))
	for _, name := range []string{"svc", "frontend", "checkout-service-eu-west-1"} {
		over := 0
		for range 3000 {
			k := Keys{K0: r.Uint64(), K1: r.Uint64()}
			var taken [places]bool
			for idx := range uint64(leaves) {
				_, _, h := k.Hash(name, uint64(len(name))|idx<<32)
				i := h % places
				for taken[i] {
					i = (i + 1) % places
				}
				taken[i] = true
			}
			longest, run := 0, 0
			for i := range 2 * places { // twice round: a run may wrap
				if !taken[i%places] {
					run = 0
					continue
				}
				run++
				longest = max(longest, run)
			}
			if longest > maxRun {
				over++
			}
		}
		if over > 0 {
			t.Errorf("%q: %d of 3000 keys put its %d leaves in a run longer than %d", name, over, leaves, maxRun)
		}
	}
}

// Sequential IDs, the shape of tenant IDs and of a flood, spread evenly
// over a table's places by every part of the hash a table reads: the low
// bits (a place), bits 32 and up (the sidecar's value tags and filter),
// 37 and up (pkg/heavy's tags) and the top ones. A chi-squared test of 2¹⁶
// IDs in 2¹³ places, at six standard deviations.
func TestSequentialValuesSpread(t *testing.T) {
	const places, ids = 1 << 13, 1 << 16
	shifts := [4]int{0, 32, 37, 64 - 13}
	for _, shape := range []string{"tenant-%07d", "%d", "10.0.%d.%d", "key-%040d"} {
		k := New()
		var at [4][places]float64
		for i := range ids {
			var s string
			if shape == "10.0.%d.%d" {
				s = fmt.Sprintf(shape, i>>8, i&255)
			} else {
				s = fmt.Sprintf(shape, i)
			}
			_, _, h := k.Hash(s, uint64(len(s)))
			for i, shift := range shifts {
				at[i][h>>shift%places]++
			}
		}
		for i, counts := range at {
			const mean = float64(ids) / places
			chi2 := 0.0
			for _, c := range counts {
				chi2 += (c - mean) * (c - mean) / mean
			}
			if dof := float64(places - 1); chi2 > dof+6*math.Sqrt(2*dof) {
				t.Errorf("%s, bits from %d: χ² = %.0f over %d places, want about %.0f", shape, shifts[i], chi2, places, dof)
			}
		}
	}
}

// BenchmarkHash compares Hash with hash/maphash, which pkg/heavy used
// before, for a tenant ID, an IPv4 address and a 40-byte API key.
func BenchmarkHash(b *testing.B) {
	k, seed := New(), maphash.MakeSeed()
	for _, v := range []string{"tenant-0000042", "203.0.113.7", "k-0123456789abcdef0123456789abcdef012345"} {
		b.Run(fmt.Sprintf("wyhash/%d", len(v)), func(b *testing.B) {
			for b.Loop() {
				k.Hash(v, uint64(len(v)))
			}
		})
		b.Run(fmt.Sprintf("maphash/%d", len(v)), func(b *testing.B) {
			for b.Loop() {
				maphash.String(seed, v)
			}
		})
	}
}
