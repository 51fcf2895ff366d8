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
// the plain way: peers the policy limits have counters of their own from
// the start, whatever their number; of the others, the first maxPeers
// distinct valid names requests give get counters of their own, later ones
// count as names.Overflow; names that are empty, too long or have odd
// characters count as names.Unknown (counted as invalid unless empty).
type peerModel struct {
	maxPeers int
	own      map[string]bool // peers with counters of their own
	limited  map[string]bool // of those, the ones the policy limits
	offered  map[string]uint64
	invalid  uint64
}

func (m *peerModel) valid(s string) bool {
	return s == names.Overflow || len(s) <= names.MaxLen && validOracle.MatchString(s)
}

// list lists peers in the policy, those at even indexes with a limit.
func (m *peerModel) list(peers []string) {
	for i, p := range peers {
		if i%2 == 0 && m.valid(p) && p != names.Unknown && p != names.Overflow {
			m.own[p], m.limited[p] = true, true
		}
	}
}

func (m *peerModel) decide(peer string) {
	switch {
	case peer == "" || peer == names.Unknown:
		peer = names.Unknown
	case !m.valid(peer):
		m.invalid++
		peer = names.Unknown
	case peer == names.Overflow || m.own[peer]:
	case len(m.own)-len(m.limited) < m.maxPeers:
		m.own[peer] = true
	default:
		peer = names.Overflow
	}
	m.offered[peer]++
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
func FuzzLimiterPeers(f *testing.F) {
	f.Fuzz(func(t *testing.T, maxPeers uint64, listed, requests string) {
		mp := 1 + int(maxPeers%16)
		l := NewLimiter(LimiterOptions{MaxPeers: mp, OneStripe: maxPeers&0x80 != 0})
		s := l.Service("checkout")
		m := &peerModel{maxPeers: mp, own: map[string]bool{}, limited: map[string]bool{}, offered: map[string]uint64{}}

		var rules []Rule
		var peers []string
		for _, p := range strings.Split(listed, ",") {
			if !slices.Contains(peers, p) { // a Policy lists each peer once
				r := Rule{Peer: p, LimitRPS: 10, AllowedRPS: math.Inf(1)}
				if len(peers)%2 == 1 {
					r.LimitRPS = math.Inf(1)
				}
				peers = append(peers, p)
				rules = append(rules, r)
			}
		}
		slices.SortFunc(rules, func(a, b Rule) int { return strings.Compare(a.Peer, b.Peer) })
		l.SetPolicy(&Policy{Name: names.Callee("checkout"), Service: "checkout", Peers: rules})
		m.list(peers)

		for _, peer := range strings.Split(requests, "\n") {
			d := s.Decide(peer)
			if d.Drop || d.Shadow {
				t.Fatalf("peer %q dropped at ratio 0", peer)
			}
			m.decide(peer)
		}

		counts := s.AppendCounts(nil)
		if len(counts) != len(m.own)+2 {
			t.Errorf("%d peers with counters, model has %d + the 2 reserved", len(counts), len(m.own))
		}
		for _, c := range counts {
			if !m.own[c.Peer] && c.Peer != names.Unknown && c.Peer != names.Overflow {
				t.Errorf("peer %q has counters; the model gave it none", c.Peer)
			}
			if c.Offered != m.offered[c.Peer] || c.Dropped != 0 || c.ShadowDropped != 0 {
				t.Errorf("peer %q: offered %d dropped %d shadow %d, model offered %d", c.Peer, c.Offered, c.Dropped, c.ShadowDropped, m.offered[c.Peer])
			}
		}
		if got := s.invalidPeers.Load(); got != m.invalid {
			t.Errorf("%d invalid peer names counted, model %d", got, m.invalid)
		}
		if n := s.peerCount(); n > mp+2+len(m.limited) {
			t.Errorf("%d peers in the table, MaxPeers is %d, %d limited", n, mp, len(m.limited))
		}
		for peer := range m.limited {
			if d := s.Decide(peer); d.Rule() == nil || d.Rule().Peer != peer {
				t.Errorf("limited peer %q decided under rule %+v", peer, d.Rule())
			}
		}
	})
}
