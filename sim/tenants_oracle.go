package sim

// TenantResult is what a run's tenants offered, and what the oracle made
// of it. Counts are requests.
type TenantResult struct {
	Tenants *Tenants
	// Requests is the number of tenant requests the sidecars decided.
	Requests int64
	// Seen is the number of distinct tenants that sent a request.
	Seen int
	// Compliant counts the requests of tenants while they do not abuse
	// (every tenant but the abusers, and the abusers before AbuseFrom),
	// Abusive the abusers' from AbuseFrom on.
	Compliant, Abusive TenantCounts
	// Pinned is the part of Compliant sent by tenants pinned to one
	// sidecar, whose whole rate meets one sidecar's local allowance.
	Pinned TenantCounts
	// Warm is the part of Compliant from AbuseFrom on: a fleet whose
	// tenants did not all start at once, at the simulation's first
	// second, with nothing listed.
	Warm TenantCounts
	// Abusers holds each abuser's series, one entry per Bin.
	Abusers []AbuserSeries
	// Resources are the loop's costs that the number of tenants must not
	// drive.
	Resources TenantResources
}

// TenantCounts are one class's totals. WronglyLimited and WronglyAllowed
// are Cloudflare's measures, per tenant and second (see MeasureTenants);
// Shortfall is what seconds over the limit admitted below it.
type TenantCounts struct {
	Offered, Admitted                         int64
	WronglyLimited, WronglyAllowed, Shortfall float64
}

// add counts a tenant's second: offered requests, admitted of them, under
// limit (its limit times the second). In a second within the limit every
// drop was wrong (Cloudflare's false positive: a request limited though
// its client was under the threshold). In a second over it, every request
// admitted beyond the limit was wrongly allowed, and the requests the
// limit would have admitted but the loop dropped are a shortfall: an error
// of the abuser's admitted rate, which AbuserError measures, not a request
// of a client under its threshold.
func (c *TenantCounts) add(offered, admitted uint32, limit float64) {
	c.Offered += int64(offered)
	c.Admitted += int64(admitted)
	if float64(offered) <= limit {
		c.WronglyLimited += float64(offered - admitted)
		return
	}
	c.WronglyAllowed += max(0, float64(admitted)-limit)
	c.Shortfall += max(0, limit-float64(admitted))
}

// AbuserSeries is one abusive tenant's traffic.
type AbuserSeries struct {
	Tenant            string
	Limit             float64
	Sticky            bool
	Offered, Admitted []float64
}

// TenantResources is what the loop spent on the tenants' descriptor, as the
// production code reports it.
type TenantResources struct {
	// SketchBytes is one sidecar's heavy-hitter sketch memory for the
	// descriptor; Listed the most values a policy listed for it.
	SketchBytes int
	Listed      int
}

// tenantOracle counts every tenant's requests per second exactly, in flat
// arrays, and folds each second into the run's totals when it ends.
type tenantOracle struct {
	pop               *tenantPop
	offered, admitted []uint32 // per tenant, this second
	touched           []int32  // tenants with a request this second
	seen              []uint64 // bit per tenant: ever sent
	res               *TenantResult
	abuseBin          int
}

func newTenantOracle(p *tenantPop, nbins int) *tenantOracle {
	o := &tenantOracle{
		pop:      p,
		offered:  make([]uint32, p.t.Count),
		admitted: make([]uint32, p.t.Count),
		seen:     make([]uint64, (p.t.Count+63)/64),
		res:      &TenantResult{Tenants: p.t},
		abuseBin: int(p.t.AbuseFrom / Bin),
	}
	for _, i := range p.abusers {
		o.res.Abusers = append(o.res.Abusers, AbuserSeries{
			Tenant: p.name(int(i)), Limit: p.limit(int(i)), Sticky: p.pin[i] >= 0,
			Offered: make([]float64, nbins), Admitted: make([]float64, nbins),
		})
	}
	return o
}

// count records one request of tenant rank i.
func (o *tenantOracle) count(i int, admitted bool) {
	if o.offered[i] == 0 {
		o.touched = append(o.touched, int32(i))
	}
	o.offered[i]++
	if admitted {
		o.admitted[i]++
	}
}

// endSecond folds second bin into the totals and clears it (see
// TenantCounts.add).
func (o *tenantOracle) endSecond(bin int) {
	for _, i := range o.touched {
		off, adm := o.offered[i], o.admitted[i]
		o.offered[i], o.admitted[i] = 0, 0
		o.seen[i/64] |= 1 << (i % 64)
		limit := o.pop.limit(int(i)) * Bin.Seconds()
		c := &o.res.Compliant
		if a := o.pop.abuse[i]; a >= 0 && bin >= o.abuseBin {
			c = &o.res.Abusive
			o.res.Abusers[a].Offered[bin] = float64(off)
			o.res.Abusers[a].Admitted[bin] = float64(adm)
		} else if a >= 0 {
			o.res.Abusers[a].Offered[bin] = float64(off)
			o.res.Abusers[a].Admitted[bin] = float64(adm)
		}
		c.add(off, adm, limit)
		if c == &o.res.Compliant && o.pop.pin[i] >= 0 {
			o.res.Pinned.add(off, adm, limit)
		}
		if c == &o.res.Compliant && bin >= o.abuseBin {
			o.res.Warm.add(off, adm, limit)
		}
	}
	o.touched = o.touched[:0]
}

// result returns the totals, once the last second has ended.
func (o *tenantOracle) result() *TenantResult {
	o.res.Seen = 0
	for _, w := range o.seen {
		o.res.Seen += popcount(w)
	}
	return o.res
}

func popcount(w uint64) int {
	n := 0
	for ; w != 0; w &= w - 1 {
		n++
	}
	return n
}
