package configurator

import (
	"bytes"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/pkg/history"
)

// SeedBucket is one bucket of synthetic history: a daily curve that tops
// out at Peak at PeakHour (UTC), a quarter of it twelve hours later, with a
// little noise per minute, growing by Growth a week.
type SeedBucket struct {
	history.Bucket
	Peak     float64 // rps at the top of the daily curve at the end of the history, before noise
	Growth   float64 // per week: 0.05 is 5 % more every week, so 4 weeks earlier the curve is 1.05⁻⁴ of today's
	Days     int     // days of history, ending at the end; 0: the whole span
	PeakHour int     // UTC hour of the daily top, 0 to 23
}

// DefaultSeedSpec is the history of README's lifecycle transcript: web
// growing 5 % a week, mobile flat (it has a generous manual limit in the
// story), batch at night and only three days old, and orders calling
// checkout.
func DefaultSeedSpec() []SeedBucket {
	return []SeedBucket{
		{Bucket: history.Bucket{Callee: "checkout", Caller: "web"}, Peak: 900, Growth: 0.05, PeakHour: 19},
		{Bucket: history.Bucket{Callee: "checkout", Caller: "mobile"}, Peak: 300, PeakHour: 20},
		{Bucket: history.Bucket{Callee: "checkout", Caller: "batch"}, Peak: 60, Days: 3, PeakHour: 3},
		{Bucket: history.Bucket{Callee: "orders", Caller: "checkout"}, Peak: 420, PeakHour: 14},
	}
}

// Bounds of a seed, so that a typo does not fill a database.
const (
	minSeedSpan = time.Hour
	maxSeedSpan = 366 * Day
	maxSeedRows = 20_000_000
)

// checkSeedBucket reports every problem of b, named by where it came from.
func checkSeedBucket(where string, b SeedBucket) []error {
	var errs []error
	if !(b.Peak > 0 && b.Peak < 1e9) {
		errs = append(errs, fmt.Errorf("%s: peak %v is outside (0, 1e9) rps", where, b.Peak))
	}
	if !(b.Growth > -1 && b.Growth <= 10) {
		errs = append(errs, fmt.Errorf("%s: growth %v is outside (-1, 10] per week", where, b.Growth))
	}
	if b.Days < 0 {
		errs = append(errs, fmt.Errorf("%s: days %d is negative", where, b.Days))
	}
	if b.PeakHour < 0 || b.PeakHour > 23 {
		errs = append(errs, fmt.Errorf("%s: peak hour %d is outside 0 to 23", where, b.PeakHour))
	}
	return errs
}

// parseSeedBucket reads a --bucket value: callee/caller=PEAK, then optional
// ,growth=5% (or 0.05), ,days=N, ,peak-hour=H.
func parseSeedBucket(s string) (SeedBucket, error) {
	name, rest, ok := strings.Cut(s, "=")
	if !ok {
		return SeedBucket{}, fmt.Errorf("--bucket %q: want callee/caller=PEAK, e.g. checkout/web=1000", s)
	}
	t, err := parseTarget(name, false)
	if err != nil {
		return SeedBucket{}, fmt.Errorf("--bucket %q: %w", s, err)
	}
	b := SeedBucket{Bucket: t.Bucket, PeakHour: 18}
	fields := strings.Split(rest, ",")
	if b.Peak, err = strconv.ParseFloat(fields[0], 64); err != nil {
		return SeedBucket{}, fmt.Errorf("--bucket %q: peak %q is not a number", s, fields[0])
	}
	for _, f := range fields[1:] {
		k, v, _ := strings.Cut(f, "=")
		switch k {
		case "growth":
			pct := strings.HasSuffix(v, "%")
			g, err := strconv.ParseFloat(strings.TrimSuffix(v, "%"), 64)
			if err != nil {
				return SeedBucket{}, fmt.Errorf("--bucket %q: growth %q is not a number or a percentage", s, v)
			}
			if pct {
				g /= 100
			}
			b.Growth = g
		case "days":
			if b.Days, err = strconv.Atoi(v); err != nil {
				return SeedBucket{}, fmt.Errorf("--bucket %q: days %q is not a whole number", s, v)
			}
		case "peak-hour":
			if b.PeakHour, err = strconv.Atoi(v); err != nil {
				return SeedBucket{}, fmt.Errorf("--bucket %q: peak-hour %q is not a whole number", s, v)
			}
		default:
			return SeedBucket{}, fmt.Errorf("--bucket %q: unknown option %q; options are growth, days, peak-hour", s, k)
		}
	}
	if err := errors.Join(checkSeedBucket("--bucket "+strconv.Quote(s), b)...); err != nil {
		return SeedBucket{}, err
	}
	return b, nil
}

// seedFile is the YAML form of a seed spec:
//
//	buckets:
//	  checkout/web:   {peak: 900, growth: 0.05, peak_hour: 19}
//	  checkout/batch: {peak: 60, days: 3, peak_hour: 3}
type seedFile struct {
	Buckets map[string]struct {
		Peak     *float64 `yaml:"peak"`
		Growth   float64  `yaml:"growth"`
		Days     int      `yaml:"days"`
		PeakHour *int     `yaml:"peak_hour"`
	} `yaml:"buckets"`
}

// parseSeedFile reads a spec file, reporting every problem at once.
func parseSeedFile(r io.Reader) ([]SeedBucket, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("read spec: %w", err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var f seedFile
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("decode spec: %w", err)
	}
	if len(f.Buckets) == 0 {
		return nil, errors.New("spec: buckets: none; want e.g. buckets: {checkout/web: {peak: 1000}}")
	}
	var (
		out  []SeedBucket
		errs []error
	)
	for name, fb := range f.Buckets {
		where := "buckets." + name
		t, err := parseTarget(name, false)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", where, err))
			continue
		}
		b := SeedBucket{Bucket: t.Bucket, Growth: fb.Growth, Days: fb.Days, PeakHour: 18}
		if fb.Peak == nil {
			errs = append(errs, fmt.Errorf("%s.peak: required", where))
			continue
		}
		b.Peak = *fb.Peak
		if fb.PeakHour != nil {
			b.PeakHour = *fb.PeakHour
		}
		if e := checkSeedBucket(where, b); len(e) > 0 {
			errs = append(errs, e...)
			continue
		}
		out = append(out, b)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b SeedBucket) int { return compareBuckets(a.Bucket, b.Bucket) })
	return out, nil
}

// mergeSeedBuckets returns spec with each of over replacing the bucket of
// the same name, or added; sorted by bucket.
func mergeSeedBuckets(spec, over []SeedBucket) []SeedBucket {
	out := slices.Clone(spec)
	for _, o := range over {
		if i := slices.IndexFunc(out, func(b SeedBucket) bool { return b.Bucket == o.Bucket }); i >= 0 {
			out[i] = o
		} else {
			out = append(out, o)
		}
	}
	slices.SortFunc(out, func(a, b SeedBucket) int { return compareBuckets(a.Bucket, b.Bucket) })
	return out
}

// seedRange is the minutes [From, To) a bucket gets when the history spans
// span and ends at end.
func seedRange(b SeedBucket, end time.Time, span time.Duration) (from, to time.Time) {
	end = end.UTC().Truncate(time.Minute)
	if b.Days > 0 {
		span = min(span, time.Duration(b.Days)*Day)
	}
	return end.Add(-span), end
}

// Synthetic returns made-up minute rows for spec, one per bucket per minute
// of seedRange, sorted by bucket and minute. It is deterministic: the same
// spec, end, span and seed give the same rows, and each bucket's rows
// depend on the seed and its own name only, so adding a bucket to a spec
// changes no other bucket's history.
//
// A minute's mean offered rate is the bucket's daily curve at its time of
// day, times the growth to date, times 1 ± 5 % of noise; its peak is 2 to
// 12 % above its mean. Nothing was dropped.
func Synthetic(spec []SeedBucket, end time.Time, span time.Duration, seed uint64) []history.MinuteRow {
	var rows []history.MinuteRow
	for _, b := range spec {
		from, to := seedRange(b, end, span)
		h := fnv.New64a()
		h.Write([]byte(b.Path()))
		rng := rand.New(rand.NewPCG(seed, h.Sum64()))
		for m := from; m.Before(to); m = m.Add(time.Minute) {
			weeks := to.Sub(m).Hours() / (7 * 24)
			mean := b.Peak * dailyCurve(m, b.PeakHour) * math.Pow(1+b.Growth, -weeks) * (1 + 0.1*(rng.Float64()-0.5))
			peak := mean * (1.02 + 0.1*rng.Float64())
			rows = append(rows, history.MinuteRow{Bucket: b.Bucket, Minute: m, PeakOffered: peak, MeanOffered: mean})
		}
	}
	return rows
}

// dailyCurve is the share of the daily top at t: 1 at peakHour, falling
// smoothly to a quarter of it twelve hours away, as a service's traffic
// follows its users' day.
func dailyCurve(t time.Time, peakHour int) float64 {
	const low = 0.25
	h := float64(t.UTC().Hour()) + float64(t.UTC().Minute())/60
	c := (1 + math.Cos(2*math.Pi*(h-float64(peakHour))/24)) / 2
	return low + (1-low)*c*c
}
