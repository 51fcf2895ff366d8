package dropratio

import (
	"hash/fnv"
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// Digests of what Fill and Step returned for untiered random trees before
// tiers existed (commit 743cb21). A tree of tier 0 alone must still be
// split bit for bit as then; a change to either digest is a change of the
// untiered law, never a refactoring.
const (
	untieredFillDigest = 0xc4374cde902afeb9
	untieredStepDigest = 0x73787da0724419f1
)

// untieredDigests hashes every bit of Fill's shares and of two Steps'
// verdicts (the tree path and, for trees of the implicit procedure alone,
// the flat path) for trees drawn by randomTree, which draws tier 0 only.
func untieredDigests() (fill, step uint64) {
	hf, hs := fnv.New64a(), fnv.New64a()
	put := func(h interface{ Write([]byte) (int, error) }, v float64, b uint8) {
		u := math.Float64bits(v)
		h.Write([]byte{byte(u), byte(u >> 8), byte(u >> 16), byte(u >> 24), byte(u >> 32), byte(u >> 40), byte(u >> 48), byte(u >> 56), b})
	}
	var f Filler
	for seed := range uint64(5000) {
		r := rand.New(rand.NewPCG(seed, 16))
		tree := randomTree(r)
		for _, s := range f.Fill(tree) {
			put(hf, s.Allowed, uint8(s.Bound))
		}
		svc := Service{Name: "s", Capacity: tree.Capacity, Procedures: tree.Procedures, CallerLimits: tree.Callers}
		if seed%2 == 0 {
			svc.Procedures, svc.CallerLimits = nil, nil
		}
		for _, lf := range tree.Leaves {
			c := Caller{Name: lf.Caller, Procedure: lf.Procedure, Offered: lf.Offered, Limit: lf.Limit}
			if seed%2 == 0 {
				c.Procedure = ""
			}
			svc.Callers = append(svc.Callers, c)
		}
		cfg := DefaultConfig()
		cfg.OpenBelow = 0 // the digest predates it
		l, _ := New(cfg)
		for _, dt := range []time.Duration{0, time.Second} {
			for _, sv := range l.Step(dt, []Service{svc}) {
				for _, v := range sv.Verdicts {
					put(hs, v.Ratio, uint8(v.Reason))
					put(hs, v.Target, uint8(v.Bound))
					put(hs, v.Allowed, 0)
				}
			}
			svc.Callers = svc.Callers[:len(svc.Callers)*2/3]
		}
	}
	return hf.Sum64(), hs.Sum64()
}

func TestUntieredUnchanged(t *testing.T) {
	fill, step := untieredDigests()
	if fill != untieredFillDigest {
		t.Errorf("Fill digest %#x, was %#x before tiers", fill, uint64(untieredFillDigest))
	}
	if step != untieredStepDigest {
		t.Errorf("Step digest %#x, was %#x before tiers", step, uint64(untieredStepDigest))
	}
}
