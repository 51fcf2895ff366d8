package k8s_test

import (
	"fmt"
	"slices"
	"sort"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/sluicehq/sluice/internal/webhook/inject"
)

// peer is a party of a connection: a pod (namespace and labels) or an
// address outside the cluster's pods (external).
type peer struct {
	name      string
	namespace string
	labels    labels.Set
	external  bool
	ports     []port // what it listens on
}

type port struct {
	number   int32
	protocol corev1.Protocol
}

func (p port) String() string { return fmt.Sprintf("%d/%s", p.number, p.protocol) }

// allowed evaluates the NetworkPolicies of the build as a conforming CNI
// does: a connection passes when the source's egress policies (if any
// select it) allow it and the destination's ingress policies (if any
// select it) allow it. Only pods in the policies' namespace are governed.
func allowed(t *testing.T, pols []*networkingv1.NetworkPolicy, src, dst peer, p port) bool {
	return permits(t, pols, src, dst, p, networkingv1.PolicyTypeEgress) && permits(t, pols, dst, src, p, networkingv1.PolicyTypeIngress)
}

// permits: do the policies of type typ that select self allow traffic with
// other on p?
func permits(t *testing.T, pols []*networkingv1.NetworkPolicy, self, other peer, p port, typ networkingv1.PolicyType) bool {
	selected := false
	for _, pol := range pols {
		if self.external || pol.Namespace != self.namespace || !slices.Contains(pol.Spec.PolicyTypes, typ) ||
			!selectorMatches(t, &pol.Spec.PodSelector, self.labels) {
			continue
		}
		selected = true
		if typ == networkingv1.PolicyTypeEgress {
			for _, rule := range pol.Spec.Egress {
				if peersMatch(t, pol.Namespace, rule.To, other) && portsMatch(rule.Ports, p) {
					return true
				}
			}
		} else {
			for _, rule := range pol.Spec.Ingress {
				if peersMatch(t, pol.Namespace, rule.From, other) && portsMatch(rule.Ports, p) {
					return true
				}
			}
		}
	}
	return !selected
}

func peersMatch(t *testing.T, policyNS string, peers []networkingv1.NetworkPolicyPeer, other peer) bool {
	if len(peers) == 0 {
		return true // no to/from: everyone, in the cluster or not
	}
	for _, np := range peers {
		switch {
		case np.IPBlock != nil:
			t.Errorf("ipBlock peers are not modelled by this test; extend it")
		case other.external:
		case np.NamespaceSelector == nil:
			if other.namespace == policyNS && selectorMatches(t, np.PodSelector, other.labels) {
				return true
			}
		default:
			nsLabels := labels.Set{"kubernetes.io/metadata.name": other.namespace}
			if selectorMatches(t, np.NamespaceSelector, nsLabels) &&
				(np.PodSelector == nil || selectorMatches(t, np.PodSelector, other.labels)) {
				return true
			}
		}
	}
	return false
}

func portsMatch(ports []networkingv1.NetworkPolicyPort, p port) bool {
	if len(ports) == 0 {
		return true
	}
	for _, np := range ports {
		proto := corev1.ProtocolTCP
		if np.Protocol != nil {
			proto = *np.Protocol
		}
		if proto == p.protocol && (np.Port == nil || np.Port.IntVal == p.number) {
			return true
		}
	}
	return false
}

func selectorMatches(t *testing.T, sel *metav1.LabelSelector, l labels.Set) bool {
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		t.Fatalf("selector %+v: %v", sel, err)
	}
	return s.Matches(l)
}

// TestNetworkPolicies checks that the policies allow exactly the flows the
// architecture needs, between every pair of parties on every port that
// matters, and nothing else.
func TestNetworkPolicies(t *testing.T) {
	eachOverlay(t, func(t *testing.T, r *rendered) {
		pols := all[*networkingv1.NetworkPolicy](r)
		tcp := func(n int32) port { return port{n, corev1.ProtocolTCP} }
		// The sluice pods, with the labels the build gives their templates.
		podLabels := map[string]labels.Set{}
		for _, w := range workloads(r) {
			podLabels[w.name] = labels.Set(w.labels)
		}
		pod := func(name, workload string, ports ...port) peer {
			l, ok := podLabels[workload]
			if !ok {
				t.Fatalf("no workload %s", workload)
			}
			return peer{name: name, namespace: "sluice-system", labels: l, ports: ports}
		}
		peers := []peer{
			pod("controller", "sluice-controller", tcp(18000), tcp(19000)),
			pod("aggregator", "sluice-aggregator", tcp(18100), tcp(19100)),
			pod("injector", "sluice-injector", tcp(9443), tcp(19200)),
			pod("derive", "sluice-derive"),
			pod("migrate", "sluice-migrate"),
			{name: "sidecar", namespace: "shop", labels: labels.Set{inject.SidecarLabel: inject.Injected, "app": "checkout"},
				ports: []port{tcp(sidecarPorts(t, r).proxy), tcp(sidecarPorts(t, r).admin)}},
			{name: "other-pod", namespace: "shop", labels: labels.Set{"app": "web"}},
			{name: "prometheus", namespace: "monitoring", labels: labels.Set{"app.kubernetes.io/name": "prometheus"}},
			{name: "dns", namespace: "kube-system", labels: labels.Set{"k8s-app": "kube-dns"},
				ports: []port{{53, corev1.ProtocolUDP}, tcp(53)}},
			{name: "apiserver", external: true},
		}
		want := map[string]bool{
			"sidecar->aggregator:18100/TCP":    true,
			"sidecar->controller:18000/TCP":    true,
			"aggregator->controller:18000/TCP": true,
			"prometheus->controller:19000/TCP": true,
			"prometheus->aggregator:19100/TCP": true,
			"prometheus->injector:19200/TCP":   true,
		}
		for _, p := range []string{"controller", "aggregator", "injector", "derive", "migrate"} {
			want[p+"->dns:53/UDP"], want[p+"->dns:53/TCP"] = true, true
		}
		switch r.overlay {
		case "overlays/dev":
			peers = append(peers, pod("postgres", "sluice-postgres", tcp(5432)))
			for _, p := range []string{"controller", "derive", "migrate"} {
				want[p+"->postgres:5432/TCP"] = true
			}
			want["postgres->dns:53/UDP"], want["postgres->dns:53/TCP"] = true, true
		case "overlays/prod":
			peers = append(peers, peer{name: "external-postgres", external: true, ports: []port{tcp(5432)}})
			for _, p := range []string{"controller", "derive", "migrate"} {
				want[p+"->external-postgres:5432/TCP"] = true
			}
		}

		// The API server's calls come from outside any pod selector: the
		// webhook port is open to everyone whose egress sluice does not
		// govern (sluice's own pods have no business there).
		for _, p := range peers {
			if p.namespace != "sluice-system" {
				want[p.name+"->injector:9443/TCP"] = true
			}
		}

		var wrong []string
		for _, src := range peers {
			for _, dst := range peers {
				if src.name == dst.name || (src.external && dst.external) {
					continue
				}
				for _, p := range dst.ports {
					if src.namespace != "sluice-system" && dst.namespace != "sluice-system" {
						continue // neither end is sluice's: not its policies' business
					}
					flow := fmt.Sprintf("%s->%s:%s", src.name, dst.name, p)
					if got := allowed(t, pols, src, dst, p); got != want[flow] {
						wrong = append(wrong, fmt.Sprintf("%s allowed=%v, want %v", flow, got, want[flow]))
					}
				}
			}
		}
		sort.Strings(wrong)
		for _, w := range wrong {
			t.Error(w)
		}
	})
}
