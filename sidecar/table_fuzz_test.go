package sidecar

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/sluicehq/sluice/internal/testkit"
	"github.com/sluicehq/sluice/pkg/names"
	"github.com/sluicehq/sluice/pkg/wyhash"
)

// maxProbe bounds the longest probe of a half-full table, the fullest a
// table gets before its array doubles (1024 names in 2048 places: the
// reserved two and 1022 callers). With a hash that spreads them it is
// about 13 typically and below 60 in 10^5 tables; the single-multiply hash
// this replaced went past 96 for one key in 300 and reached 900, most of
// the table in one run.
const maxProbe = 96

// withKeys indexes peers the way newPeerTable does, with the given keys
// instead of random ones, so that a fuzz input names its table.
func withKeys(peers map[leaf]slot, k0, k1 uint64) peerTable {
	size := minPeerTableSize
	for size < 2*len(peers) {
		size *= 2
	}
	t := peerTable{slots: make([]peerSlot, size), Keys: wyhash.Keys{K0: k0, K1: k1}}
	mask := uint64(size - 1)
	for k, sl := range peers {
		key := leafKey(len(k.peer), 0)
		lo, hi, i := t.Hash(k.peer, key)
		for t.slots[i&mask].slot.e != nil {
			i++
		}
		t.slots[i&mask] = peerSlot{peer: k.peer, lo: lo, hi: hi, key: key, slot: sl}
	}
	return t
}

// keys returns the random source whose first two numbers are the keys of
// the table of fuzz input key: ChaCha8, so that the keys are as random as
// newPeerTable's however plain the input.
func keys(key uint64) *rand.Rand {
	var seed [32]byte
	binary.LittleEndian.PutUint64(seed[:], key)
	return rand.New(rand.NewChaCha8(seed))
}

// tableSeeds are FuzzPeerTableProbes' committed seeds: name shapes a flood
// might use, and keys under which the earlier hash piled such names into
// runs hundreds of places long.
func tableSeeds() []seed {
	s := func(name string, key uint64, prefix, suffix string, width uint64) seed {
		return seed{Name: name, Args: []any{key, prefix, suffix, width}}
	}
	return []seed{
		s("digits-8", 1, "", "", 8),
		s("digits-4", 2, "", "", 4),
		s("digits-16", 3, "", "", 16),
		s("natural", 4, "", "", 0),
		s("pre-suf", 5, "pre-", "-suf", 4),
		s("caller", 6, "caller-", "", 5),
		s("long-equal-ends", 7, "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
			"bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb", 4),
		s("too-long", 8, string(make([]byte, names.MaxLen)), "", 4),
		// Keys under which the single-multiply hash made runs of 470 to
		// 820 places of these shapes.
		s("weak-old-digits-8", 4547, "", "", 8),
		s("weak-old-pre-suf", 3704, "pre-", "-suf", 4),
		s("weak-old-caller", 1545, "caller-", "", 5),
		s("weak-old-digits-16", 4551, "", "", 16),
		s("weak-old-natural", 2683, "", "", 0),
	}
}

func TestFuzzPeerTableProbesCorpus(t *testing.T) {
	testkit.CheckCorpus(t, "FuzzPeerTableProbes", tableSeeds())
}

// FuzzPeerTableProbes fills a table the way a flood of new callers does,
// up to half its places, with names of the fuzzer's shape, prefix + a number of
// width digits + suffix, under keys drawn from key as newPeerTable draws
// them. The table must agree with a map, and no probe may be long: every
// request from an unlisted caller probes it, so a long run is a slow
// request path that a caller can trigger at will.
func FuzzPeerTableProbes(f *testing.F) {
	f.Fuzz(func(t *testing.T, key uint64, prefix, suffix string, width uint64) {
		w := int(width % 17)
		if len(prefix)+len(suffix)+max(w, 4) > names.MaxLen {
			return // Decide never hashes such names
		}
		peers := []string{names.Unknown, names.Overflow}
		for i := range DefaultMaxPeers - 2 {
			peers = append(peers, fmt.Sprintf("%s%0*d%s", prefix, w, i, suffix))
		}
		m := slotsFor(peers...)
		if len(m) != len(peers) {
			return // the shape made a reserved name
		}
		r := keys(key)
		pt := withKeys(m, r.Uint64(), r.Uint64())
		checkAgainstMap(t, &pt, m, prefix+suffix, prefix+"x"+suffix)
		longest, worst := 0, ""
		for _, p := range peers {
			if n := probeLength(&pt, p); n > longest {
				longest, worst = n, p
			}
		}
		if longest > maxProbe {
			t.Fatalf("a probe of %d places (for %q) in a table of %d names in %d places", longest, worst, len(m), len(pt.slots))
		}
	})
}
