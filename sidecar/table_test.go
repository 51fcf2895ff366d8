package sidecar

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"testing/quick"

	"github.com/sluicehq/sluice/pkg/names"
)

// slotsFor returns a distinct slot for each name, of procedure ""; the
// verdict tells them apart, the counters are shared.
func slotsFor(peers ...string) map[leaf]slot {
	e := newEntry("")
	m := make(map[leaf]slot, len(peers))
	for _, p := range peers {
		m[leaf{p, "", 0}] = slot{e: e, v: &verdict{}}
	}
	return m
}

// checkAgainstMap fails unless t holds exactly the leaves of m of a service
// without procedures: each one with its slot, and none of probes that m
// lacks.
func checkAgainstMap(t *testing.T, pt *peerTable, m map[leaf]slot, probes ...string) {
	t.Helper()
	checkLeaves(t, pt, m, noProcedures, probes...)
}

// checkLeaves fails unless t holds exactly the current leaves of m under
// procs: each one with its slot, under its procedure's index, and none of
// probes, under any index, that m lacks.
func checkLeaves(t *testing.T, pt *peerTable, m map[leaf]slot, procs *procedures, probes ...string) {
	t.Helper()
	occupied, current := 0, 0
	for _, ps := range pt.slots {
		if ps.slot.e != nil {
			occupied++
		}
	}
	for k, want := range m {
		idx, ok := procs.index(k.proc)
		if !ok {
			continue
		}
		current++
		if got, ok := pt.get(k.peer, idx); !ok || got != want {
			t.Errorf("get(%q, %d) = %v, %v; want %v, true", k.peer, idx, got, ok, want)
		}
	}
	if occupied != current {
		t.Errorf("%d places occupied, want %d", occupied, current)
	}
	for _, peer := range probes {
		for idx, q := range procs.names {
			want, wantOK := m[leaf{peer, q, 0}]
			if got, ok := pt.get(peer, uint32(idx)); ok != wantOK || got != want {
				t.Errorf("get(%q, %d) = %v, %v; want %v, %v", peer, idx, got, ok, want, wantOK)
			}
		}
	}
}

func TestPeerTable(t *testing.T) {
	long := strings.Repeat("x", 40)
	for _, tc := range []struct {
		name   string
		peers  []string
		probes []string
	}{
		{"empty", nil, []string{"", "a", "checkout"}},
		{"reserved", []string{names.Unknown, names.Overflow}, []string{"", "unknow", "unknownn", "_overflo", "a"}},
		{"empty name is a key", []string{"", "a"}, []string{"b", "aa"}},
		{
			// Around every length where hash reads the name differently.
			"every length class",
			[]string{"a", "ab", "abc", "abcd", "abcdefg", "abcdefgh", "abcdefghi",
				"abcdefghijklmnop", "abcdefghijklmnopq", strings.Repeat("a", 32), strings.Repeat("a", 33), strings.Repeat("z", names.MaxLen)},
			[]string{"", "b", "ba", "abd", "abce", "bbcdefg", "abcdefgi", "abcdefghj",
				"abcdefghijklmnoq", "bbcdefghijklmnopq", strings.Repeat("a", 31), strings.Repeat("a", 34), strings.Repeat("z", names.MaxLen-1)},
		},
		{
			// Same length and the same words, a different middle: only the
			// full comparison tells them apart.
			"long names with equal ends",
			[]string{"ab" + long + "0123456789abcdef", "ab" + long + "0123456789abcdef" + "!"},
			[]string{"ac" + long + "0123456789abcdef", "ab" + long[1:] + "y0123456789abcdef"},
		},
		{
			// Short names whose overlapping words repeat bytes.
			"overlapping words",
			[]string{"aaaa", "aaaaa", "aaaaaaaa", "aaaaaaaaaaaa", "abab", "ababab"},
			[]string{"aaa", "aaaaaa", "aaaaaaa", "aaaaaaaaa", "abababab", "aba"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := slotsFor(tc.peers...)
			pt := newPeerTable(m, noProcedures, nil)
			checkAgainstMap(t, &pt, m, tc.probes...)
		})
	}
}

// randomName returns a name over a small alphabet, so that names share
// prefixes, suffixes and words; mostly short, sometimes up to names.MaxLen.
func randomName(r *rand.Rand) string {
	n := r.IntN(24)
	if r.IntN(8) == 0 {
		n = r.IntN(names.MaxLen + 1)
	}
	b := make([]byte, n)
	for i := range b {
		b[i] = "ab-\x00\xff"[r.IntN(5)]
	}
	return string(b)
}

func TestPeerTableMatchesMap(t *testing.T) {
	f := func(seed uint64) bool {
		r := rand.New(rand.NewPCG(seed, 1))
		var peers, probes []string
		for range r.IntN(100) {
			peers = append(peers, randomName(r))
		}
		for range 100 {
			probes = append(probes, randomName(r))
		}
		// And near misses of the peers: a byte changed, one more, one less.
		for _, p := range peers {
			if len(p) > 0 {
				b := []byte(p)
				b[r.IntN(len(b))] ^= 1
				probes = append(probes, string(b), p[1:], p[:len(p)-1])
			}
			probes = append(probes, p+"a")
		}
		m := slotsFor(peers...)
		pt := newPeerTable(m, noProcedures, nil)
		checkAgainstMap(t, &pt, m, probes...)
		return !t.Failed()
	}
	if err := quick.Check(f, &quick.Config{MaxCount: 500}); err != nil {
		t.Error(err)
	}
}

func FuzzPeerTable(f *testing.F) {
	f.Add("unknown,_overflow,checkout", "checkou")
	f.Add("a,aa,aaaa,aaaaaaaa,aaaaaaaaaaaaaaaa,aaaaaaaaaaaaaaaaa", "aaaaaaaaaaaaaaaaaa")
	f.Add(","+strings.Repeat("x", 40), strings.Repeat("x", 39)+"y")
	f.Add("web#,web##,web,mobile###,unknown#", "web")
	f.Fuzz(func(t *testing.T, peers, probe string) {
		m := slotsFor(strings.Split(peers, ",")...)
		pt := newPeerTable(m, noProcedures, nil)
		checkAgainstMap(t, &pt, m, probe, probe+probe)

		// The same names as leaves of a service with procedures: "peer#"
		// is peer's leaf of the first declared procedure, "peer##" of
		// the second, "peer" of names.Other; the table must tell every
		// (name, index) apart.
		procs := compileProcedures(&Policy{Procedures: []string{"/a.B/C", "get-item"}})
		leaves := map[leaf]slot{}
		e := newEntry("")
		for _, p := range strings.Split(peers, ",") {
			name := strings.TrimRight(p, "#")
			leaves[leaf{name, procs.names[(len(p)-len(name))%len(procs.names)], 0}] = slot{e: e, v: &verdict{}}
		}
		lt := newPeerTable(leaves, procs, nil)
		checkLeaves(t, &lt, leaves, procs, probe, strings.TrimRight(probe, "#"))
	})
}

func TestPeerTableHostileNames(t *testing.T) {
	// MaxPeers names an attacker might pick to pile up in one place if the
	// hash skipped bytes: equal but for a few bytes in the middle, or short
	// and equal but for one byte. Probes must stay short all the same.
	for _, shape := range []string{"%08d", "pre-%04d-suf", strings.Repeat("a", 100) + "%04d" + strings.Repeat("b", 100)} {
		var peers []string
		for i := range DefaultMaxPeers {
			peers = append(peers, fmt.Sprintf(shape, i))
		}
		m := slotsFor(peers...)
		pt := newPeerTable(m, noProcedures, nil)
		checkAgainstMap(t, &pt, m, fmt.Sprintf(shape, -1))
		longest := 0
		for _, p := range peers {
			longest = max(longest, probeLength(&pt, p))
		}
		// Expected at most a dozen or so at this load; a hash that ignored
		// the varying bytes would give DefaultMaxPeers.
		if longest > 64 {
			t.Errorf("%q: a probe of %d places", shape, longest)
		}
	}
}

// probeLength returns how many places get looks at to find peer, which t
// holds.
func probeLength(t *peerTable, peer string) int {
	_, _, i := t.Hash(peer, leafKey(len(peer), 0))
	for n := 1; ; n++ {
		if ps := &t.slots[i&uint64(len(t.slots)-1)]; ps.slot.e != nil && ps.peer == peer {
			return n
		}
		i++
	}
}

func TestTableIndexFollowsPeers(t *testing.T) {
	// Every way a table is built keeps its index in step with its peers.
	l := NewLimiter(LimiterOptions{MaxPeers: 20})
	s := l.Service("checkout")
	check := func(when string) {
		t.Helper()
		tb := s.table.Load()
		limited := 0
		if tb.policy != nil {
			limited = len(tb.policy.Peers)
		}
		if len(tb.leaves) != tb.counted+2+limited {
			t.Fatalf("%s: %d peers, %d observed, %d limited", when, len(tb.leaves), tb.counted, limited)
		}
		t.Run(when, func(t *testing.T) { checkAgainstMap(t, &tb.index, tb.leaves, "", "bad name", "never-seen") })
	}
	check("new")
	for i := range 10 {
		s.Decide(fmt.Sprintf("peer-%d", i))
	}
	check("after first sightings")
	l.SetPolicy(policy("checkout", Rule{Peer: "peer-1", DropRatio: 0.5}, Rule{Peer: "listed", DropRatio: 0.5}))
	check("after SetPolicy")
	for i := range 30 {
		s.Decide(fmt.Sprintf("more-%d", i))
	}
	check("when full")
	l.Expire(t0)
	for k := range s.table.Load().leaves {
		if k.peer != "more-0" {
			s.Decide(k.peer) // more-0 stays idle
		}
	}
	l.Expire(t0.Add(DefaultPeerIdle / 2))
	l.Expire(t0.Add(DefaultPeerIdle))
	if n := len(s.table.Load().leaves); n != 2+2+19 {
		t.Fatalf("%d peers after an eviction, want the reserved, the limited and 19 observed", n)
	}
	check("after an eviction")
	l.RemovePolicy("checkout")
	check("after RemovePolicy")
}

func BenchmarkPeerLookup(b *testing.B) {
	// The map that peerTable replaced on the hot path, and peerTable, at
	// three name lengths: below 8 bytes, 8 to 16, longer.
	peers := map[string]slot{}
	leaves := map[leaf]slot{}
	for i := range 64 {
		peers[fmt.Sprintf("caller-%02d", i)] = slot{e: newEntry("")}
	}
	keys := []string{"web", "caller-a", "productcatalogservice"}
	for _, k := range keys {
		peers[k] = slot{e: newEntry("")}
	}
	for p, sl := range peers {
		leaves[leaf{p, "", 0}] = sl
	}
	t := newPeerTable(leaves, noProcedures, nil)
	var sink slot
	for _, k := range keys {
		k = strings.Clone(k) // not the pointer stored in the table
		b.Run(fmt.Sprintf("map-%d", len(k)), func(b *testing.B) {
			for b.Loop() {
				sink = peers[k]
			}
		})
		b.Run(fmt.Sprintf("table-%d", len(k)), func(b *testing.B) {
			for b.Loop() {
				sink, _ = t.get(k, 0)
			}
		})
	}
	_ = sink
}
