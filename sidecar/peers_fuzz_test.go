package sidecar

import (
	"math"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/testkit"
	"github.com/sluicehq/sluice/pkg/names"
)

// validOracle is names.Check written as a regular expression.
var validOracle = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// peerModel is what a ServiceLimiter's peer accounting should do, written
// the plain way, per leaf (peer, procedure; procedure "" for a service
// without procedures): leaves the policy limits have counters of their own
// from the start, whatever their number; of the others, the first maxPeers
// distinct leaves of valid names requests give get counters of their own,
// later ones count as names.Overflow's leaf of their procedure; names that
// are empty, too long or have odd characters count as names.Unknown
// (counted as invalid unless empty).
type peerModel struct {
	maxPeers int
	own      map[leaf]bool // leaves with counters of their own
	limited  map[leaf]bool // of those, the ones the policy limits
	offered  map[leaf]uint64
	invalid  uint64
}

func (m *peerModel) valid(s string) bool {
	return s == names.Overflow || len(s) <= names.MaxLen && validOracle.MatchString(s)
}

// list lists leaves in the policy, those at even indexes with a limit.
func (m *peerModel) list(leaves []leaf) {
	for i, k := range leaves {
		if i%2 == 0 && m.valid(k.peer) && k.peer != names.Unknown && k.peer != names.Overflow {
			m.own[k], m.limited[k] = true, true
		}
	}
}

func (m *peerModel) decide(peer, proc string) {
	k := leaf{peer, proc, 0}
	switch {
	case peer == "" || peer == names.Unknown:
		k.peer = names.Unknown
	case !m.valid(peer):
		m.invalid++
		k.peer = names.Unknown
	case peer == names.Overflow || m.own[k]:
	case len(m.own)-len(m.limited) < m.maxPeers:
		m.own[k] = true
	default:
		k.peer = names.Overflow
	}
	m.offered[k]++
}

// fuzzProcedures are the procedures FuzzLimiterPeers' policy declares when
// it has procedures: a gRPC method and a name; requests name them, or any
// other method, which is names.Other's.
var fuzzProcedures = []string{"/shop.Checkout/Pay", "get-item"}

// fuzzProcedure returns the procedure of a request of method under a
// policy that declares procs: the method if declared, else names.Other;
// "" without procedures.
func fuzzProcedure(procs []string, method string) string {
	switch {
	case len(procs) == 0:
		return ""
	case slices.Contains(procs, method):
		return method
	}
	return names.Other
}

// peersSeeds are FuzzLimiterPeers' committed seeds.
func peersSeeds() []seed {
	s := func(name string, maxPeers uint64, listed, requests string) seed {
		return seed{Name: name, Args: []any{maxPeers, listed, requests}}
	}
	return []seed{
		s("mixed", 2, "web,batch", "web\nmobile\nweb\nnew-1\nnew-2\nnew-3\n\n_overflow\nunknown\nbad name\n\xff\xfe"),
		s("name-lengths", 0, "", strings.Repeat("x", names.MaxLen)+"\n"+strings.Repeat("y", names.MaxLen+1)+"\nz\nz"),
		s("policy-fills-table", 9, "a,b,c,d,e,f,g,h,i,j,k,l", "m\nl\na\n-dash\n_under\nnul\x00"),
		s("policy-lists-reserved", 0x81, "_overflow,unknown,,bad/name,ok", "ok\nok.v2\nOK\n9lives\n_overflow"),
		s("flood", 3, "web", strings.Repeat("caller-x\ncaller-y\ncaller-z\ncaller-w\n", 8)+"web"),
		s("procedures", 0x102, "web,web,mobile,batch,web", "web#/shop.Checkout/Pay\nweb#get-item\nweb\nweb#/shop.Checkout/Nope\n"+
			"new#get-item\nnew#/shop.Checkout/Pay\nnewer#get-item\n#get-item\nbad name#get-item\n_overflow#_other\nmobile#get-item"),
	}
}

func TestFuzzLimiterPeersCorpus(t *testing.T) {
	testkit.CheckCorpus(t, "FuzzLimiterPeers", peersSeeds())
}

// FuzzLimiterPeers sends the lines of requests (any bytes: invalid UTF-8,
// NULs, names past names.MaxLen, the reserved names) as caller names
// through a ServiceLimiter with a small MaxPeers, after a policy listing
// the comma-separated names of listed (every other one with a limit, the
// rest unlimited), and compares every counter with peerModel. A flood of
// made-up callers must end in the overflow bucket and hostile strings in
// unknown, with every request counted once, and never take a limited
// peer's counters.
//
// With maxPeers&0x100 the policy declares fuzzProcedures, a line is
// "caller#method" decided by DecideGRPC, the listed names get rules of the
// procedures in turn (fuzzProcedures, then names.Other), and the bound is
// MaxLeaves: the same model, per leaf.
func FuzzLimiterPeers(f *testing.F) {
	f.Fuzz(func(t *testing.T, maxPeers uint64, listed, requests string) {
		mp := 1 + int(maxPeers%16)
		var procs []string
		if maxPeers&0x100 != 0 {
			procs = fuzzProcedures
		}
		l := NewLimiter(LimiterOptions{MaxPeers: mp, MaxLeaves: mp, OneStripe: maxPeers&0x80 != 0})
		if procs != nil {
			l = NewLimiter(LimiterOptions{MaxPeers: 100, MaxLeaves: mp, OneStripe: maxPeers&0x80 != 0})
		}
		s := l.Service("checkout")
		m := &peerModel{maxPeers: mp, own: map[leaf]bool{}, limited: map[leaf]bool{}, offered: map[leaf]uint64{}}

		var rules []Rule
		var leaves []leaf
		for i, p := range strings.Split(listed, ",") {
			k := leaf{p, "", 0}
			if procs != nil {
				k.proc = append(slices.Clone(procs), names.Other)[i%(len(procs)+1)]
			}
			if !slices.Contains(leaves, k) { // a Policy lists each leaf once
				r := Rule{Peer: k.peer, Procedure: k.proc, LimitRPS: 10, AllowedRPS: math.Inf(1)}
				if len(leaves)%2 == 1 {
					r.LimitRPS = math.Inf(1)
				}
				leaves = append(leaves, k)
				rules = append(rules, r)
			}
		}
		slices.SortFunc(rules, func(a, b Rule) int { return cmpRule(a.Peer, a.Procedure, a.Tier, leaf{b.Peer, b.Procedure, b.Tier}) })
		l.SetPolicy(&Policy{Name: names.Callee("checkout"), Service: "checkout", Peers: rules, Procedures: procs})
		m.list(leaves)

		for _, line := range strings.Split(requests, "\n") {
			peer, method := line, ""
			var d Decision
			if procs != nil {
				peer, method, _ = strings.Cut(line, "#")
				d = s.DecideGRPC(peer, method)
			} else {
				d = s.Decide(peer)
			}
			if d.Drop || d.Shadow {
				t.Fatalf("request %q dropped at ratio 0", line)
			}
			m.decide(peer, fuzzProcedure(procs, method))
		}

		reserved := 2 * max(len(procs)+1, 1)
		if procs == nil {
			reserved = 2
		}
		counts := s.AppendCounts(nil)
		if len(counts) != len(m.own)+reserved {
			t.Errorf("%d leaves with counters, model has %d + the %d reserved", len(counts), len(m.own), reserved)
		}
		for _, c := range counts {
			k := leaf{c.Peer, c.Procedure, 0}
			if !m.own[k] && c.Peer != names.Unknown && c.Peer != names.Overflow {
				t.Errorf("leaf %q/%q has counters; the model gave it none", c.Peer, c.Procedure)
			}
			if c.Offered != m.offered[k] || c.Dropped != 0 || c.ShadowDropped != 0 {
				t.Errorf("leaf %q/%q: offered %d dropped %d shadow %d, model offered %d", c.Peer, c.Procedure, c.Offered, c.Dropped, c.ShadowDropped, m.offered[k])
			}
		}
		if got := s.invalidPeers.Load(); got != m.invalid {
			t.Errorf("%d invalid peer names counted, model %d", got, m.invalid)
		}
		if n := s.peerCount(); n > mp+reserved+len(m.limited) {
			t.Errorf("%d leaves in the table, the bound is %d, %d limited", n, mp, len(m.limited))
		}
		for k := range m.limited {
			if d := s.DecideGRPC(k.peer, k.proc); d.Rule() == nil || d.Rule().Peer != k.peer || d.Rule().Procedure != k.proc {
				t.Errorf("limited leaf %q/%q decided under rule %+v", k.peer, k.proc, d.Rule())
			}
		}
	})
}
