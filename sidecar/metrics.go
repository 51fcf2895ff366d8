package sidecar

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/pkg/criticality"
)

var (
	requestsDesc = prometheus.NewDesc("sluice_sidecar_requests_total",
		"Requests decided, by bucket (peer; procedure when the service declares procedures: a declared one or "+
			"_other, else empty; criticality when the service declares tiers: CRITICAL_PLUS to SHEDDABLE, else empty) and outcome. admitted + dropped is every request; shadow_dropped requests "+
			"(a shadow limit would have dropped them) are admitted and counted in admitted too. Drops inferred for "+
			"peers enforced upstream are not in it: see sluice_sidecar_upstream_dropped_total.",
		[]string{"service", "peer", "procedure", "criticality", "outcome"}, nil)
	upstreamArrivalsDesc = prometheus.NewDesc("sluice_sidecar_upstream_arrivals_total",
		"Requests of peers enforced upstream (their proxyless gRPC client or the callee's Envoy carried out the "+
			"ratio before they arrived) that reached the sidecar; admitted without a drop, and in requests_total admitted "+
			"too. Present for peers that have been enforced upstream.",
		[]string{"service", "peer", "procedure", "criticality"}, nil)
	upstreamDroppedDesc = prometheus.NewDesc("sluice_sidecar_upstream_dropped_total",
		"Requests of peers enforced upstream that the upstream data plane is inferred to have dropped: each arrival "+
			"counts p/(1-p) at the ratio p in force, in whole requests. Reported to the controller as offered and dropped; "+
			"not in requests_total.",
		[]string{"service", "peer", "procedure", "criticality"}, nil)
	dropRatioDesc = prometheus.NewDesc("sluice_sidecar_drop_ratio",
		"Drop ratio in force for each peer listed in the current policy: the policy's, decaying to 0 once it has "+
			"expired in fail mode open; absent for peers a token bucket decides (expired in fail mode local).",
		[]string{"service", "peer", "procedure", "criticality", "mode"}, nil)
	peersDesc = prometheus.NewDesc("sluice_sidecar_peers",
		"Peers with counters: the limited ones (listed in the policy with a ratio or a limit), the observed ones "+
			"and the reserved unknown and _overflow; for a service with procedures, leaves (peer, procedure).",
		[]string{"service"}, nil)
	observedPeersDesc = prometheus.NewDesc("sluice_sidecar_observed_peers",
		"Peers with counters because requests named them, not because the policy limits them: at most --max-peers "+
			"(more only while peers the policy stopped limiting wait for eviction). Once full, requests from new "+
			"unlimited peers count as _overflow; watch sluice_sidecar_requests_total{peer=\"_overflow\"}.",
		[]string{"service"}, nil)
	peersEvictedDesc = prometheus.NewDesc("sluice_sidecar_peers_evicted_total",
		"Observed peers evicted from the table after --peer-idle without a request, freeing their place.",
		[]string{"service"}, nil)
	policyPeersDesc = prometheus.NewDesc("sluice_sidecar_policy_peers",
		"Peers listed in the current policy; absent when the service has no policy.",
		[]string{"service"}, nil)
	invalidPeersDesc = prometheus.NewDesc("sluice_sidecar_invalid_peer_names_total",
		"Requests whose peer name is not a valid service name; they count as peer unknown.",
		[]string{"service"}, nil)
	policyStateDesc = prometheus.NewDesc("sluice_sidecar_policy_state",
		"1 for the state the service's policy is in, else 0: fresh (received within half its TTL), stale (no new "+
			"policy for half its TTL), expired (none for its TTL: the fail mode is in force). All 0 without a policy.",
		[]string{"service", "state"}, nil)
	policyAgeDesc = prometheus.NewDesc("sluice_sidecar_policy_age_seconds",
		"Time since the sidecar received the service's current policy, on its own clock, as of its last fail-mode "+
			"check (every 100ms in the sidecar); absent without a policy.",
		[]string{"service"}, nil)
	failOpenDesc = prometheus.NewDesc("sluice_sidecar_fail_open_total",
		"Requests admitted that the last policy would have dropped: while it is expired in fail mode open, requests "+
			"its own ratio picked (the same error diffusion as when fresh) that the decayed ratio let through. Enforced rules only.",
		[]string{"service"}, nil)
	localDecisionsDesc = prometheus.NewDesc("sluice_sidecar_local_decisions_total",
		"Requests a local token bucket decided while the policy was expired in fail mode local, by outcome; admitted + "+
			"dropped is every such request, and shadow_dropped (a shadow rule's bucket was empty) are admitted too.",
		[]string{"service", "outcome"}, nil)
	callerIdentityDesc = prometheus.NewDesc("sluice_sidecar_caller_identity_total",
		"Requests by what the authenticated caller source (--caller-identity xfcc or mtls; HTTPOptions.Identify) made of "+
			"them: authenticated (decided as the identity's service), missing (no client certificate or "+
			"x-forwarded-client-cert: unknown), untrusted_proxy (x-forwarded-client-cert from an address not in "+
			"--trusted-proxies, ignored: unknown), invalid (no workload SPIFFE ID of the trust domain: unknown). "+
			"All 0 in header mode.",
		[]string{"service", "result"}, nil)
	callerMismatchDesc = prometheus.NewDesc("sluice_sidecar_caller_mismatch_total",
		"Authenticated requests whose caller header named another caller than their identity: decided as the "+
			"identity, or refused with --caller-mismatch reject. A client forging its caller, or a misconfigured one.",
		[]string{"service"}, nil)
	decidedIgnoredDesc = prometheus.NewDesc("sluice_sidecar_decided_ignored_total",
		"Requests carrying x-sluice-decided that were decided and counted all the same, by reason: untrusted, marks "+
			"are not trusted (no --trust-decided) or the mark does not name the request's (authenticated) caller; "+
			"procedures, the service declares procedures and decides every request in its leaf.",
		[]string{"service", "reason"}, nil)
	critInvalidDesc = prometheus.NewDesc("sluice_sidecar_criticality_invalid_total",
		"Requests whose criticality header named no tier (of a service that declares tiers); decided in the tier "+
			"the defaults give them.",
		[]string{"service"}, nil)
	critLoweredDesc = prometheus.NewDesc("sluice_sidecar_criticality_lowered_total",
		"Requests whose criticality header claimed a tier above their caller's max (else the service's); decided "+
			"in that max.",
		[]string{"service"}, nil)
	costInvalidDesc = prometheus.NewDesc("sluice_sidecar_cost_invalid_total",
		"Costs that were not a finite decimal number >= 0, by source: request (the trusted request header; priced as if "+
			"absent) or response (the app's response header or trailer; the price at admission counts instead).",
		[]string{"service", "source"}, nil)
	costClampedDesc = prometheus.NewDesc("sluice_sidecar_cost_clamped_total",
		"Costs above the policy's max cost, clamped to it, by source: request or response.",
		[]string{"service", "source"}, nil)
	concurrencyDroppedDesc = prometheus.NewDesc("sluice_sidecar_concurrency_dropped_total",
		"Requests refused because their bucket had the sidecar's share of its concurrency cap in flight; in "+
			"requests_total dropped too (shadow rules: counted here and as shadow_dropped, and admitted).",
		[]string{"service"}, nil)
	decidedUpstreamDesc = prometheus.NewDesc("sluice_sidecar_decided_upstream_total",
		"Inbound requests admitted without a decision because their caller's outbound enforcement had decided and "+
			"counted them already (x-sluice-decided); in no other count.",
		[]string{"service"}, nil)
)

// Descriptor metrics (issue #15): labelled by service and descriptor name,
// which the policy bounds (descriptor.MaxPerService per service), never by
// a value.
var (
	descOfferedDesc = prometheus.NewDesc("sluice_sidecar_descriptor_offered_total",
		"Requests a descriptor decided (its bucket had admitted them), whatever their value.",
		[]string{"service", "descriptor"}, nil)
	descDroppedDesc = prometheus.NewDesc("sluice_sidecar_descriptor_dropped_total",
		"Requests a descriptor dropped, by reason: listed, by the ratio the controller listed for the value; local, "+
			"by the sidecar's allowance for a value the policy does not list.",
		[]string{"service", "descriptor", "reason"}, nil)
	descInvalidDesc = prometheus.NewDesc("sluice_sidecar_descriptor_invalid_total",
		"Requests whose descriptor value was unusable (too long, not UTF-8): counted and decided as _invalid, never stored.",
		[]string{"service", "descriptor"}, nil)
	descHeavyDesc = prometheus.NewDesc("sluice_sidecar_descriptor_heavy_fullness",
		"Share of the descriptor sketch's heavy set (--descriptor-heavy values) the current window fills, 0 to 1; "+
			"at 1, values at the report threshold compete for a place and the smallest are not reported.",
		[]string{"service", "descriptor"}, nil)
	descBytesDesc = prometheus.NewDesc("sluice_sidecar_descriptor_sketch_bytes",
		"Memory of the descriptor's sketch (both windows' tables, heavy sets and values), set by --descriptor-counters "+
			"and --descriptor-heavy, whatever the number of values.",
		[]string{"service", "descriptor"}, nil)
)

// collectDescriptors sends the metrics of s's current descriptors.
func collectDescriptors(ch chan<- prometheus.Metric, s *ServiceLimiter) {
	dt := s.table.Load().desc
	if dt == nil {
		return
	}
	bytes := float64(s.descOpts.Bytes())
	for i := range dt.descs {
		st := dt.descs[i].st
		t := st.totals()
		n, k := st.sk.Heavy()
		ch <- prometheus.MustNewConstMetric(descOfferedDesc, prometheus.CounterValue, float64(t.offered), s.name, st.name)
		ch <- prometheus.MustNewConstMetric(descDroppedDesc, prometheus.CounterValue, float64(t.listed), s.name, st.name, "listed")
		ch <- prometheus.MustNewConstMetric(descDroppedDesc, prometheus.CounterValue, float64(t.local), s.name, st.name, "local")
		ch <- prometheus.MustNewConstMetric(descInvalidDesc, prometheus.CounterValue, float64(t.invalid), s.name, st.name)
		ch <- prometheus.MustNewConstMetric(descHeavyDesc, prometheus.GaugeValue, float64(n)/float64(k), s.name, st.name)
		ch <- prometheus.MustNewConstMetric(descBytesDesc, prometheus.GaugeValue, bytes, s.name, st.name)
	}
}

// The states the policy state gauge has a series for.
var gaugedStates = [...]PolicyState{Fresh, Stale, Expired}

// Collector returns a prometheus.Collector that reads the Limiter's counters
// and policies when scraped; deciding a request does no metric work at all.
// Label cardinality is bounded by MaxPeers + 2 per service, or for a
// service with procedures or criticality by MaxLeaves + 2·(procedures +
// 1)·tiers: a procedure label is a declared procedure, names.Other, or ""
// (none declared), and a criticality label one of the four tiers or ""
// (none declared), never a name or a value taken from a request.
func (l *Limiter) Collector() prometheus.Collector {
	return &collector{l: l, admitted: map[bucket]admitted{}}
}

type collector struct {
	l *Limiter

	// admitted keeps the admitted counter monotonic: it is offered -
	// dropped, and a request in flight during a scrape can be counted
	// offered in one scrape and dropped only in the next, which would look
	// like a counter reset. Each scrape keeps only the peers in the tables
	// then, so it is bounded like them; an evicted peer seen again starts
	// from zero (a counter reset, as its counters are).
	mu       sync.Mutex // guards admitted; scrapes may overlap
	admitted map[bucket]admitted
}

type bucket struct {
	service, peer, proc string
	tier                criticality.Tier
}

// admitted is the last admitted count of one incarnation of a bucket.
type admitted struct{ incarnation, n uint64 }

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- requestsDesc
	ch <- dropRatioDesc
	ch <- peersDesc
	ch <- observedPeersDesc
	ch <- peersEvictedDesc
	ch <- policyPeersDesc
	ch <- invalidPeersDesc
	ch <- policyStateDesc
	ch <- policyAgeDesc
	ch <- failOpenDesc
	ch <- localDecisionsDesc
	ch <- decidedUpstreamDesc
	ch <- critInvalidDesc
	ch <- critLoweredDesc
	ch <- costInvalidDesc
	ch <- costClampedDesc
	ch <- concurrencyDroppedDesc
	ch <- callerIdentityDesc
	ch <- callerMismatchDesc
	ch <- decidedIgnoredDesc
	ch <- upstreamArrivalsDesc
	ch <- upstreamDroppedDesc
	ch <- descOfferedDesc
	ch <- descDroppedDesc
	ch <- descInvalidDesc
	ch <- descHeavyDesc
	ch <- descBytesDesc
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	next := make(map[bucket]admitted, len(c.admitted))
	for _, name := range c.l.Services() {
		s := c.l.lookup(name)
		for k, sl := range s.table.Load().leaves {
			// One read of the leaf's counters, so that the inferred
			// drops taken out of Dropped are the ones in it.
			pc, arrived, inferred := sl.e.counts()
			b := bucket{name, k.peer, k.proc, k.tier}
			tier := k.tier.String()
			a := admitted{incarnation: sl.e.incarnation, n: pc.Offered - pc.Dropped}
			if last := c.admitted[b]; last.incarnation == a.incarnation {
				a.n = max(a.n, last.n)
			}
			next[b] = a
			ch <- prometheus.MustNewConstMetric(requestsDesc, prometheus.CounterValue, float64(a.n), name, k.peer, k.proc, tier, "admitted")
			ch <- prometheus.MustNewConstMetric(requestsDesc, prometheus.CounterValue, float64(pc.Dropped-inferred), name, k.peer, k.proc, tier, "dropped")
			ch <- prometheus.MustNewConstMetric(requestsDesc, prometheus.CounterValue, float64(pc.ShadowDropped), name, k.peer, k.proc, tier, "shadow_dropped")
			if arrived > 0 {
				ch <- prometheus.MustNewConstMetric(upstreamArrivalsDesc, prometheus.CounterValue, float64(arrived), name, k.peer, k.proc, tier)
				ch <- prometheus.MustNewConstMetric(upstreamDroppedDesc, prometheus.CounterValue, float64(inferred), name, k.peer, k.proc, tier)
			}
		}
		ch <- prometheus.MustNewConstMetric(peersDesc, prometheus.GaugeValue, float64(s.peerCount()), name)
		ch <- prometheus.MustNewConstMetric(observedPeersDesc, prometheus.GaugeValue, float64(s.observedCount()), name)
		ch <- prometheus.MustNewConstMetric(peersEvictedDesc, prometheus.CounterValue, float64(s.evicted.Load()), name)
		ch <- prometheus.MustNewConstMetric(invalidPeersDesc, prometheus.CounterValue, float64(s.invalidPeers.Load()), name)
		ch <- prometheus.MustNewConstMetric(decidedUpstreamDesc, prometheus.CounterValue, float64(s.upstream.Load()), name)
		ch <- prometheus.MustNewConstMetric(critInvalidDesc, prometheus.CounterValue, float64(s.critInvalid.Load()), name)
		ch <- prometheus.MustNewConstMetric(critLoweredDesc, prometheus.CounterValue, float64(s.critLowered.Load()), name)
		for src, label := range [...]string{costFromRequest: "request", costFromResponse: "response"} {
			ch <- prometheus.MustNewConstMetric(costInvalidDesc, prometheus.CounterValue, float64(s.costInvalid[src].Load()), name, label)
			ch <- prometheus.MustNewConstMetric(costClampedDesc, prometheus.CounterValue, float64(s.costClamped[src].Load()), name, label)
		}
		ch <- prometheus.MustNewConstMetric(concurrencyDroppedDesc, prometheus.CounterValue, float64(s.concDropped.Load()), name)
		for res := range numIdentityResults {
			ch <- prometheus.MustNewConstMetric(callerIdentityDesc, prometheus.CounterValue, float64(s.ident.load(res)), name, res.String())
		}
		ch <- prometheus.MustNewConstMetric(callerMismatchDesc, prometheus.CounterValue, float64(s.ident.mismatch.Load()), name)
		ch <- prometheus.MustNewConstMetric(decidedIgnoredDesc, prometheus.CounterValue, float64(s.ident.decidedIgnore.Load()), name, "untrusted")
		ch <- prometheus.MustNewConstMetric(decidedIgnoredDesc, prometheus.CounterValue, float64(s.ident.decidedLeaf.Load()), name, "procedures")
		t := s.table.Load()
		if p := t.policy; p != nil {
			ch <- prometheus.MustNewConstMetric(policyPeersDesc, prometheus.GaugeValue, float64(len(p.Peers)), name)
			for _, r := range p.Peers {
				if !validName(r.Peer) { // hand-built policies only; not a valid label
					continue
				}
				k := leaf{r.Peer, r.Procedure, r.Tier}
				ratio, ok := t.ratio(k)
				if !ok { // a token bucket decides
					continue
				}
				if !t.current(k) { // hand-built policies only
					continue
				}
				ch <- prometheus.MustNewConstMetric(dropRatioDesc, prometheus.GaugeValue, ratio, name, r.Peer, r.Procedure, r.Tier.String(), r.modeLabel())
			}
		}

		st := s.Status()
		for _, state := range gaugedStates {
			v := 0.0
			if st.State == state {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(policyStateDesc, prometheus.GaugeValue, v, name, state.String())
		}
		if st.State != NoPolicy && !st.Received.IsZero() {
			ch <- prometheus.MustNewConstMetric(policyAgeDesc, prometheus.GaugeValue, st.Age.Seconds(), name)
		}
		collectDescriptors(ch, s)
		fc := s.failCounts()
		ch <- prometheus.MustNewConstMetric(failOpenDesc, prometheus.CounterValue, float64(fc.failOpen), name)
		ch <- prometheus.MustNewConstMetric(localDecisionsDesc, prometheus.CounterValue, float64(fc.localAdmitted+fc.localShadow), name, "admitted")
		ch <- prometheus.MustNewConstMetric(localDecisionsDesc, prometheus.CounterValue, float64(fc.localDropped), name, "dropped")
		ch <- prometheus.MustNewConstMetric(localDecisionsDesc, prometheus.CounterValue, float64(fc.localShadow), name, "shadow_dropped")
	}
	c.admitted = next
}
