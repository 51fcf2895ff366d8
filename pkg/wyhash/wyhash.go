// Package wyhash is the keyed string hash of the request path's tables:
// the sidecar's tables of peers and names, and pkg/heavy's table of a
// descriptor's values. It follows wyhash, keyed with two random words
// drawn per table, so that no one outside the process can choose strings
// that share a place (the defence of Go's maps, whose hash where AES is
// missing is wyhash too). Every byte of a string goes into its hash.
//
// It returns a short string's words with its hash: a string of at most
// Short bytes is determined by its length and its two words, so a table
// may compare those instead of the bytes. For a 14-byte value it is about
// half of hash/maphash's cost, the call into the runtime's AES hash
// included (BenchmarkHash).
package wyhash

import (
	"encoding/binary"
	"math/bits"
	"math/rand/v2"
)

// Short is the longest string that its words hold entirely.
const Short = 16

// Keys are a table's random hash keys. Any keys hash, but keys an
// attacker can guess (the zero Keys) let them pick strings that collide:
// draw them with New.
type Keys struct{ K0, K1 uint64 }

// New returns keys drawn from the runtime's random source.
func New() Keys { return Keys{K0: rand.Uint64(), K1: rand.Uint64()} }

// Hash returns the words of s and its hash, seeded with seed: what else
// tells a table's keys apart, such as the length, which the words alone
// do not (a string of 9 bytes and one of 10 may have the same two).
//
// The words are s read as two little-endian words the way wyhash reads
// short inputs, first and last bytes overlapping, so that a string of at
// most Short bytes is determined by its length and its words. A longer
// string gets its last sixteen bytes. Each sixteen bytes of a long string,
// then the words, go through Mix, so every byte of s goes into the hash.
//
// It does not inline; for 8 to Short bytes, the common length of a name
// or a tenant ID, a caller on the request path calls Short, which does,
// and saves the call (1–2 ns).
func (k *Keys) Hash(s string, seed uint64) (lo, hi, h uint64) {
	n := len(s)
	if n >= 8 && n <= Short {
		return k.Short(s, seed)
	}
	h = k.K1 ^ seed
	switch {
	case n > Short:
		// The last block may overlap the words; that only costs a mix.
		for b := s; len(b) > Short; b = b[16:] {
			h = Mix(LE64(b)^k.K0, LE64(b[8:])^h)
		}
		lo, hi = LE64(s[n-16:]), LE64(s[n-8:])
	case n >= 4:
		lo, hi = LE32(s), LE32(s[n-4:])
	case n > 0:
		lo = uint64(s[0])<<16 | uint64(s[n/2])<<8 | uint64(s[n-1])
	}
	return lo, hi, k.final(lo, hi, h, seed)
}

// Short is Hash of a string of 8 to Short bytes, which it does not check.
// It inlines.
func (k *Keys) Short(s string, seed uint64) (lo, hi, h uint64) {
	lo, hi = LE64(s), LE64(s[len(s)-8:])
	return lo, hi, k.final(lo, hi, k.K1^seed, seed)
}

// final is Hash's last step, of the words, the running hash h (K1^seed
// for a string of at most Short bytes) and the seed: wyhash's last two,
// the 128-bit product of the keyed words, then its halves multiplied once
// more.
//
// With one multiply, strings that differ only in their last bytes (the
// words' high bits) share the low bits of the product's low half, which
// leaves a table's place to its high half alone; for about one key in 300
// that piled most of a half-full table (1024 such names) into one run
// hundreds of places long, which every lookup of an absent name then
// probed (sidecar's FuzzPeerTableProbes).
//
// The seed goes in twice. Before the first multiply, in h, so that it
// passes through both: seeds that differ only in their high bits (the
// sidecar's procedure index, idx<<32) passed through the second alone
// gave one name's leaves places in an arithmetic progression, one run of
// all of them for about one key in 330 (TestSeedsSpreadOneString). After
// it too, so that it cannot cancel in a word: with the seed in h alone,
// strings of different lengths whose first words matched and whose last
// differed by their lengths' XOR ("1000" and "10000", "tenant-0000042"
// and "tenant-030000042") hashed alike under every key, and pkg/heavy,
// which counts by the hash alone, counted them as one
// (TestHashTellsLengthsApart).
func (k *Keys) final(lo, hi, h, seed uint64) uint64 {
	phi, plo := bits.Mul64(lo^k.K0, hi^h)
	return Mix(plo^k.K1, phi^(k.K0^seed)) // K0^seed ahead of the multiply
}

// Mix is wyhash's mixing step: the two halves of the 128-bit product,
// folded, so that the high bits of the operands reach the low bits of the
// result too, which pick a table's place.
func Mix(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}

// LE64 returns the first 8 bytes of s, little endian: one load (the
// conversion does not copy).
func LE64(s string) uint64 { return binary.LittleEndian.Uint64([]byte(s)) }

// LE32 returns the first 4 bytes of s, little endian: one load.
func LE32(s string) uint64 { return uint64(binary.LittleEndian.Uint32([]byte(s))) }
