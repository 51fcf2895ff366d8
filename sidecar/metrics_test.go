package sidecar

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/sluicehq/sluice/pkg/dataplane"
	"github.com/sluicehq/sluice/pkg/dropratio"
)

func TestCollector(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	l.SetPolicy(policy("checkout",
		Rule{Peer: "a"},
		Rule{Peer: "b", DropRatio: 0.5},
		Rule{Peer: "c", DropRatio: 0.25, Mode: dropratio.Shadow},
		Rule{Peer: "e", DropRatio: 0.75, Enforcement: dataplane.EnforceUpstream},
	))
	// Outcomes as the callers saw them, to check the collector against.
	seen := map[string]*[3]int{} // admitted, dropped, shadow_dropped
	decide := func(service, peer string, n int) {
		key := service + "/" + peer
		if seen[key] == nil {
			seen[key] = new([3]int)
		}
		for range n {
			d := l.Decide(service, peer)
			switch {
			case d.Drop:
				seen[key][1]++
			case d.Shadow:
				seen[key][0]++
				seen[key][2]++
			default:
				seen[key][0]++
			}
		}
	}
	decide("checkout", "a", 3)
	decide("checkout", "b", 10)
	decide("checkout", "c", 20)
	decide("checkout", "d", 1)
	decide("checkout", "", 2)
	decide("checkout", "not a name", 1)
	decide("cart", "web", 4)
	decide("checkout", "e", 10) // each stands for 3 dropped upstream

	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(l.Collector()); err != nil {
		t.Fatal(err)
	}

	var want strings.Builder
	want.WriteString(`
# HELP sluice_sidecar_caller_identity_total Requests by what the authenticated caller source (--caller-identity xfcc or mtls; HTTPOptions.Identify) made of them: authenticated (decided as the identity's service), missing (no client certificate or x-forwarded-client-cert: unknown), untrusted_proxy (x-forwarded-client-cert from an address not in --trusted-proxies, ignored: unknown), invalid (no workload SPIFFE ID of the trust domain: unknown). All 0 in header mode.
# TYPE sluice_sidecar_caller_identity_total counter
sluice_sidecar_caller_identity_total{result="authenticated",service="cart"} 0
sluice_sidecar_caller_identity_total{result="authenticated",service="checkout"} 0
sluice_sidecar_caller_identity_total{result="invalid",service="cart"} 0
sluice_sidecar_caller_identity_total{result="invalid",service="checkout"} 0
sluice_sidecar_caller_identity_total{result="missing",service="cart"} 0
sluice_sidecar_caller_identity_total{result="missing",service="checkout"} 0
sluice_sidecar_caller_identity_total{result="untrusted_proxy",service="cart"} 0
sluice_sidecar_caller_identity_total{result="untrusted_proxy",service="checkout"} 0
# HELP sluice_sidecar_caller_mismatch_total Authenticated requests whose caller header named another caller than their identity: decided as the identity, or refused with --caller-mismatch reject. A client forging its caller, or a misconfigured one.
# TYPE sluice_sidecar_caller_mismatch_total counter
sluice_sidecar_caller_mismatch_total{service="cart"} 0
sluice_sidecar_caller_mismatch_total{service="checkout"} 0
# HELP sluice_sidecar_concurrency_dropped_total Requests refused because their bucket had the sidecar's share of its concurrency cap in flight; in requests_total dropped too (shadow rules: counted here and as shadow_dropped, and admitted).
# TYPE sluice_sidecar_concurrency_dropped_total counter
sluice_sidecar_concurrency_dropped_total{service="cart"} 0
sluice_sidecar_concurrency_dropped_total{service="checkout"} 0
# HELP sluice_sidecar_cost_clamped_total Costs above the policy's max cost, clamped to it, by source: request or response.
# TYPE sluice_sidecar_cost_clamped_total counter
sluice_sidecar_cost_clamped_total{service="cart",source="request"} 0
sluice_sidecar_cost_clamped_total{service="cart",source="response"} 0
sluice_sidecar_cost_clamped_total{service="checkout",source="request"} 0
sluice_sidecar_cost_clamped_total{service="checkout",source="response"} 0
# HELP sluice_sidecar_cost_invalid_total Costs that were not a finite decimal number >= 0, by source: request (the trusted request header; priced as if absent) or response (the app's response header or trailer; the price at admission counts instead).
# TYPE sluice_sidecar_cost_invalid_total counter
sluice_sidecar_cost_invalid_total{service="cart",source="request"} 0
sluice_sidecar_cost_invalid_total{service="cart",source="response"} 0
sluice_sidecar_cost_invalid_total{service="checkout",source="request"} 0
sluice_sidecar_cost_invalid_total{service="checkout",source="response"} 0
# HELP sluice_sidecar_criticality_invalid_total Requests whose criticality header named no tier (of a service that declares tiers); decided in the tier the defaults give them.
# TYPE sluice_sidecar_criticality_invalid_total counter
sluice_sidecar_criticality_invalid_total{service="cart"} 0
sluice_sidecar_criticality_invalid_total{service="checkout"} 0
# HELP sluice_sidecar_criticality_lowered_total Requests whose criticality header claimed a tier above their caller's max (else the service's); decided in that max.
# TYPE sluice_sidecar_criticality_lowered_total counter
sluice_sidecar_criticality_lowered_total{service="cart"} 0
sluice_sidecar_criticality_lowered_total{service="checkout"} 0
# HELP sluice_sidecar_decided_ignored_total Requests carrying x-sluice-decided that were decided and counted all the same, by reason: untrusted, marks are not trusted (no --trust-decided) or the mark does not name the request's (authenticated) caller; procedures, the service declares procedures and decides every request in its leaf.
# TYPE sluice_sidecar_decided_ignored_total counter
sluice_sidecar_decided_ignored_total{reason="procedures",service="cart"} 0
sluice_sidecar_decided_ignored_total{reason="untrusted",service="cart"} 0
sluice_sidecar_decided_ignored_total{reason="procedures",service="checkout"} 0
sluice_sidecar_decided_ignored_total{reason="untrusted",service="checkout"} 0
# HELP sluice_sidecar_decided_upstream_total Inbound requests admitted without a decision because their caller's outbound enforcement had decided and counted them already (x-sluice-decided); in no other count.
# TYPE sluice_sidecar_decided_upstream_total counter
sluice_sidecar_decided_upstream_total{service="cart"} 0
sluice_sidecar_decided_upstream_total{service="checkout"} 0
# HELP sluice_sidecar_drop_ratio Drop ratio in force for each peer listed in the current policy: the policy's, decaying to 0 once it has expired in fail mode open; absent for peers a token bucket decides (expired in fail mode local).
# TYPE sluice_sidecar_drop_ratio gauge
sluice_sidecar_drop_ratio{criticality="",mode="enforce",peer="a",procedure="",service="checkout"} 0
sluice_sidecar_drop_ratio{criticality="",mode="enforce",peer="b",procedure="",service="checkout"} 0.5
sluice_sidecar_drop_ratio{criticality="",mode="shadow",peer="c",procedure="",service="checkout"} 0.25
sluice_sidecar_drop_ratio{criticality="",mode="upstream",peer="e",procedure="",service="checkout"} 0.75
# HELP sluice_sidecar_fail_open_total Requests admitted that the last policy would have dropped: while it is expired in fail mode open, requests its own ratio picked (the same error diffusion as when fresh) that the decayed ratio let through. Enforced rules only.
# TYPE sluice_sidecar_fail_open_total counter
sluice_sidecar_fail_open_total{service="cart"} 0
sluice_sidecar_fail_open_total{service="checkout"} 0
# HELP sluice_sidecar_invalid_peer_names_total Requests whose peer name is not a valid service name; they count as peer unknown.
# TYPE sluice_sidecar_invalid_peer_names_total counter
sluice_sidecar_invalid_peer_names_total{service="cart"} 0
sluice_sidecar_invalid_peer_names_total{service="checkout"} 1
# HELP sluice_sidecar_local_decisions_total Requests a local token bucket decided while the policy was expired in fail mode local, by outcome; admitted + dropped is every such request, and shadow_dropped (a shadow rule's bucket was empty) are admitted too.
# TYPE sluice_sidecar_local_decisions_total counter
sluice_sidecar_local_decisions_total{outcome="admitted",service="cart"} 0
sluice_sidecar_local_decisions_total{outcome="admitted",service="checkout"} 0
sluice_sidecar_local_decisions_total{outcome="dropped",service="cart"} 0
sluice_sidecar_local_decisions_total{outcome="dropped",service="checkout"} 0
sluice_sidecar_local_decisions_total{outcome="shadow_dropped",service="cart"} 0
sluice_sidecar_local_decisions_total{outcome="shadow_dropped",service="checkout"} 0
# HELP sluice_sidecar_observed_peers Peers with counters because requests named them, not because the policy limits them: at most --max-peers (more only while peers the policy stopped limiting wait for eviction). Once full, requests from new unlimited peers count as _overflow; watch sluice_sidecar_requests_total{peer="_overflow"}.
# TYPE sluice_sidecar_observed_peers gauge
sluice_sidecar_observed_peers{service="cart"} 1
sluice_sidecar_observed_peers{service="checkout"} 1
# HELP sluice_sidecar_peers Peers with counters: the limited ones (listed in the policy with a ratio or a limit), the observed ones and the reserved unknown and _overflow; for a service with procedures, leaves (peer, procedure).
# TYPE sluice_sidecar_peers gauge
sluice_sidecar_peers{service="cart"} 3
sluice_sidecar_peers{service="checkout"} 7
# HELP sluice_sidecar_peers_evicted_total Observed peers evicted from the table after --peer-idle without a request, freeing their place.
# TYPE sluice_sidecar_peers_evicted_total counter
sluice_sidecar_peers_evicted_total{service="cart"} 0
sluice_sidecar_peers_evicted_total{service="checkout"} 0
# HELP sluice_sidecar_policy_peers Peers listed in the current policy; absent when the service has no policy.
# TYPE sluice_sidecar_policy_peers gauge
sluice_sidecar_policy_peers{service="checkout"} 4
# HELP sluice_sidecar_policy_state 1 for the state the service's policy is in, else 0: fresh (received within half its TTL), stale (no new policy for half its TTL), expired (none for its TTL: the fail mode is in force). All 0 without a policy.
# TYPE sluice_sidecar_policy_state gauge
sluice_sidecar_policy_state{service="cart",state="expired"} 0
sluice_sidecar_policy_state{service="cart",state="fresh"} 0
sluice_sidecar_policy_state{service="cart",state="stale"} 0
sluice_sidecar_policy_state{service="checkout",state="expired"} 0
sluice_sidecar_policy_state{service="checkout",state="fresh"} 1
sluice_sidecar_policy_state{service="checkout",state="stale"} 0
# HELP sluice_sidecar_requests_total Requests decided, by bucket (peer; procedure when the service declares procedures: a declared one or _other, else empty; criticality when the service declares tiers: CRITICAL_PLUS to SHEDDABLE, else empty) and outcome. admitted + dropped is every request; shadow_dropped requests (a shadow limit would have dropped them) are admitted and counted in admitted too. Drops inferred for peers enforced upstream are not in it: see sluice_sidecar_upstream_dropped_total.
# TYPE sluice_sidecar_requests_total counter
`)
	seen["checkout/unknown"] = &[3]int{seen["checkout/"][0] + seen["checkout/not a name"][0]}
	delete(seen, "checkout/")
	delete(seen, "checkout/not a name")
	for _, key := range []string{"cart/_overflow", "checkout/_overflow"} {
		seen[key] = new([3]int)
	}
	seen["cart/unknown"] = new([3]int)
	// Prometheus sorts series by label values: outcome, peer, service.
	for _, outcome := range []string{"admitted", "dropped", "shadow_dropped"} {
		for _, peer := range []string{"_overflow", "a", "b", "c", "d", "e", "unknown", "web"} {
			for _, service := range []string{"cart", "checkout"} {
				c := seen[service+"/"+peer]
				if c == nil {
					continue
				}
				i := map[string]int{"admitted": 0, "dropped": 1, "shadow_dropped": 2}[outcome]
				fmt.Fprintf(&want, "sluice_sidecar_requests_total{criticality=\"\",outcome=%q,peer=%q,procedure=\"\",service=%q} %d\n", outcome, peer, service, c[i])
			}
		}
	}
	want.WriteString(`# HELP sluice_sidecar_upstream_arrivals_total Requests of peers enforced upstream (their proxyless gRPC client or the callee's Envoy carried out the ratio before they arrived) that reached the sidecar; admitted without a drop, and in requests_total admitted too. Present for peers that have been enforced upstream.
# TYPE sluice_sidecar_upstream_arrivals_total counter
sluice_sidecar_upstream_arrivals_total{criticality="",peer="e",procedure="",service="checkout"} 10
# HELP sluice_sidecar_upstream_dropped_total Requests of peers enforced upstream that the upstream data plane is inferred to have dropped: each arrival counts p/(1-p) at the ratio p in force, in whole requests. Reported to the controller as offered and dropped; not in requests_total.
# TYPE sluice_sidecar_upstream_dropped_total counter
sluice_sidecar_upstream_dropped_total{criticality="",peer="e",procedure="",service="checkout"} 30
`)
	if seen["checkout/e"][0] != 10 {
		t.Fatalf("upstream peer e: outcomes %v, want all 10 admitted", seen["checkout/e"])
	}
	if seen["checkout/b"][1] == 0 || seen["checkout/c"][2] == 0 {
		t.Fatalf("no drops to check: %v %v", seen["checkout/b"], seen["checkout/c"])
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want.String())); err != nil {
		t.Error(err)
	}
	if n, err := testutil.GatherAndLint(reg); err != nil || len(n) != 0 {
		t.Errorf("lint: %v %v", n, err)
	}
}

func TestCollectorAdmittedNeverDecreases(t *testing.T) {
	l := NewLimiter(LimiterOptions{})
	s := l.Service("checkout")
	for range 5 {
		s.Decide("a")
	}
	c := l.Collector()
	admitted := func() float64 {
		t.Helper()
		reg := prometheus.NewRegistry()
		reg.MustRegister(c)
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "sluice_sidecar_requests_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				labels := map[string]string{}
				for _, lp := range m.GetLabel() {
					labels[lp.GetName()] = lp.GetValue()
				}
				if labels["peer"] == "a" && labels["outcome"] == "admitted" {
					return m.GetCounter().GetValue()
				}
			}
		}
		t.Fatal("no admitted series for peer a")
		return 0
	}
	if got := admitted(); got != 5 {
		t.Fatalf("admitted %v, want 5", got)
	}
	// A decision in flight: counted offered, not yet dropped.
	st := &s.table.Load().leaves[leaf{"a", "", 0}].e.stripes[0]
	st.offered.Add(1)
	if got := admitted(); got != 6 {
		t.Fatalf("admitted %v, want 6", got)
	}
	st.dropped.Add(1) // the decision lands as a drop
	if got := admitted(); got != 6 {
		t.Errorf("admitted went from 6 to %v", got)
	}
}
