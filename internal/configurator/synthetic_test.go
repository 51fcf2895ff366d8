package configurator

import (
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/pgtest"
	"github.com/sluicehq/sluice/pkg/history"
)

var seedEnd = time.Date(2026, 11, 30, 3, 3, 0, 0, time.UTC)

func TestSyntheticIsDeterministic(t *testing.T) {
	spec := DefaultSeedSpec()
	a := Synthetic(spec, seedEnd, 4*Week, 1)
	if b := Synthetic(spec, seedEnd, 4*Week, 1); !reflect.DeepEqual(a, b) {
		t.Fatal("the same seed wrote different rows")
	}
	if b := Synthetic(spec, seedEnd, 4*Week, 2); reflect.DeepEqual(a, b) {
		t.Fatal("another seed wrote the same rows")
	}
	// A bucket's rows depend on its own name and the seed only.
	extra := append([]SeedBucket{{Bucket: history.Bucket{Callee: "aaa", Caller: "first"}, Peak: 5}}, spec...)
	var without []history.MinuteRow
	for _, r := range Synthetic(extra, seedEnd, 4*Week, 1) {
		if r.Callee != "aaa" {
			without = append(without, r)
		}
	}
	if !reflect.DeepEqual(without, a) {
		t.Error("adding a bucket changed the other buckets' rows")
	}
}

func TestSyntheticShape(t *testing.T) {
	spec := DefaultSeedSpec()
	rows := Synthetic(spec, seedEnd.Add(42*time.Second), 4*Week, 1) // the end is truncated to the minute
	byBucket := map[history.Bucket][]history.MinuteRow{}
	for _, r := range rows {
		byBucket[r.Bucket] = append(byBucket[r.Bucket], r)
	}
	for _, b := range spec {
		rs := byBucket[b.Bucket]
		days := 28
		if b.Days > 0 {
			days = b.Days
		}
		if len(rs) != days*1440 {
			t.Errorf("%s: %d rows, want %d", bucketString(b.Bucket), len(rs), days*1440)
			continue
		}
		if first, last := rs[0].Minute, rs[len(rs)-1].Minute; !first.Equal(seedEnd.AddDate(0, 0, -days)) || !last.Equal(seedEnd.Add(-time.Minute)) {
			t.Errorf("%s: minutes %v … %v", bucketString(b.Bucket), first, last)
		}
		var top float64
		var topAt time.Time
		firstWeek, lastWeek := 0.0, 0.0
		for i, r := range rs {
			if !(r.MeanOffered > 0 && r.PeakOffered >= r.MeanOffered*1.02 && r.PeakOffered <= r.MeanOffered*1.12 && r.MeanDropped == 0) ||
				r.Minute != r.Minute.Truncate(time.Minute) || (i > 0 && !r.Minute.Equal(rs[i-1].Minute.Add(time.Minute))) {
				t.Fatalf("%s: row %d %+v", bucketString(b.Bucket), i, r)
			}
			if r.MeanOffered > top {
				top, topAt = r.MeanOffered, r.Minute
			}
			switch {
			case i < 7*1440:
				firstWeek = max(firstWeek, r.MeanOffered)
			case i >= len(rs)-7*1440:
				lastWeek = max(lastWeek, r.MeanOffered)
			}
		}
		// The daily top is the peak, within the noise, at the peak hour.
		if top < b.Peak*0.95 || top > b.Peak*1.05 {
			t.Errorf("%s: highest mean %.1f, want %v ± 5 %%", bucketString(b.Bucket), top, b.Peak)
		}
		if d := math.Abs(float64(topAt.Hour()*60+topAt.Minute()) - float64(b.PeakHour*60)); d > 90 && d < 1440-90 {
			t.Errorf("%s: highest mean at %s, want about %02d:00", bucketString(b.Bucket), topAt.Format("15:04"), b.PeakHour)
		}
		if days == 28 {
			// Three weeks apart: 1.05³ for web, flat for the others.
			want := math.Pow(1+b.Growth, 3)
			if got := lastWeek / firstWeek; math.Abs(got-want) > 0.08 {
				t.Errorf("%s: last week's top / first week's = %.3f, want %.3f", bucketString(b.Bucket), got, want)
			}
		}
	}
}

func TestParseSeedBucket(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want SeedBucket
		err  string
	}{
		{in: "checkout/web=1000", want: SeedBucket{Bucket: web, Peak: 1000, PeakHour: 18}},
		{in: "checkout/web=1000,growth=5%,days=3,peak-hour=9", want: SeedBucket{Bucket: web, Peak: 1000, Growth: 0.05, Days: 3, PeakHour: 9}},
		{in: "checkout/web=12.5,growth=-0.1", want: SeedBucket{Bucket: web, Peak: 12.5, Growth: -0.1, PeakHour: 18}},
		{in: "checkout/web", err: "want callee/caller=PEAK"},
		{in: "checkout=5", err: "want callee/caller"},
		{in: "checkout/web=lots", err: `peak "lots" is not a number`},
		{in: "checkout/web=0", err: "peak 0 is outside"},
		{in: "checkout/web=5,growth=x%", err: `growth "x%"`},
		{in: "checkout/web=5,days=-1", err: "days -1 is negative"},
		{in: "checkout/web=5,peak-hour=24", err: "peak hour 24 is outside 0 to 23"},
		{in: "checkout/web=5,color=red", err: `unknown option "color"`},
	} {
		got, err := parseSeedBucket(tc.in)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("parseSeedBucket(%q): %v, want an error with %q", tc.in, err, tc.err)
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("parseSeedBucket(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

func TestParseSeedFile(t *testing.T) {
	got, err := parseSeedFile(strings.NewReader(`buckets:
  checkout/web: {peak: 1000, growth: 0.05, peak_hour: 19}
  checkout/batch: {peak: 60, days: 3}
`))
	want := []SeedBucket{
		{Bucket: batch, Peak: 60, Days: 3, PeakHour: 18},
		{Bucket: web, Peak: 1000, Growth: 0.05, PeakHour: 19},
	}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("parseSeedFile = %+v, %v; want %+v", got, err, want)
	}
	_, err = parseSeedFile(strings.NewReader(`buckets:
  checkout/web: {growth: 0.05}
  checkout: {peak: 5}
  checkout/mobile: {peak: -1, peak_hour: 30}
`))
	for _, want := range []string{"buckets.checkout/web.peak: required", "buckets.checkout: ", "peak -1 is outside", "peak hour 30"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("parseSeedFile of a bad spec: %v; want it to name %q", err, want)
		}
	}
	if _, err := parseSeedFile(strings.NewReader("buckets:\n  checkout/web: {peak: 5, colour: red}\n")); err == nil || !strings.Contains(err.Error(), "colour") {
		t.Errorf("unknown field: %v", err)
	}
	if _, err := parseSeedFile(strings.NewReader("")); err == nil {
		t.Error("an empty spec was accepted")
	}
}

// TestSeedCommandPostgres writes synthetic history through the store's
// COPY path into a real Postgres, and refuses to mix it into history a
// bucket has.
func TestSeedCommandPostgres(t *testing.T) {
	url := pgtest.URL(t)
	mustPG(t, url, "migrate")
	now := "--now=" + seedEnd.Format(time.RFC3339)

	if _, err := runPG(t, url, "history", "seed", "--reason", "r", now); err == nil || !strings.Contains(err.Error(), "--synthetic DURATION is required") {
		t.Errorf("seed without --synthetic: %v", err)
	}
	if _, err := runPG(t, url, "history", "seed", "--synthetic", "4w", now); err == nil || !strings.Contains(err.Error(), "--reason is required") {
		t.Errorf("seed without --reason: %v", err)
	}
	if _, err := runPG(t, url, "history", "seed", "--synthetic", "2000d", "--reason", "r"); err == nil || !strings.Contains(err.Error(), "--synthetic 2000d is outside") {
		t.Errorf("seed of 2000 days: %v", err)
	}

	out := mustPG(t, url, "history", "seed", "--synthetic", "4w", "--reason", "try it", now, "--bucket", "search/web=50,days=1")
	for _, want := range []string{
		"wrote 126,720 minute rows of SYNTHETIC history (seed 1), 2026-11-02 03:03:00Z … 2026-11-30 03:03:00Z:",
		"checkout/batch   60 rps      none      03:00Z     2026-11-27 03:03:00Z  4,320",
		"checkout/web     900 rps     +5%/week  19:00Z     2026-11-02 03:03:00Z  40,320",
		"search/web       50 rps      none      18:00Z     2026-11-29 03:03:00Z  1,440",
		"audited as write_history by carol",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("seed output lacks %q:\n%s", want, out)
		}
	}
	st, err := history.Open(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	count := func() map[history.Bucket]int {
		peaks, err := st.DailyPeaks(t.Context(), history.Filter{}, seedEnd.AddDate(0, 0, -60), seedEnd.AddDate(0, 0, 1))
		if err != nil {
			t.Fatal(err)
		}
		n := map[history.Bucket]int{}
		for _, p := range peaks {
			n[p.Bucket] += p.Minutes
		}
		return n
	}
	wantRows := map[history.Bucket]int{web: 40320, mobile: 40320, batch: 4320, {Callee: "orders", Caller: "checkout"}: 40320, {Callee: "search", Caller: "web"}: 1440}
	if got := count(); !reflect.DeepEqual(got, wantRows) {
		t.Errorf("rows per bucket %v, want %v", got, wantRows)
	}
	// The rows stored are the rows Synthetic made.
	spec := mergeSeedBuckets(DefaultSeedSpec(), []SeedBucket{{Bucket: history.Bucket{Callee: "search", Caller: "web"}, Peak: 50, Days: 1, PeakHour: 18}})
	var wantWeb []history.MinuteRow
	for _, r := range Synthetic(spec, seedEnd, 4*Week, 1) {
		if r.Bucket == web {
			wantWeb = append(wantWeb, r)
		}
	}
	gotWeb, err := st.Minutes(t.Context(), web, seedEnd.AddDate(0, 0, -28), seedEnd)
	if err != nil || !reflect.DeepEqual(gotWeb, wantWeb) {
		t.Errorf("stored web minutes differ from Synthetic's (%d vs %d rows): %v", len(gotWeb), len(wantWeb), err)
	}
	es, err := st.Audit(t.Context(), history.Filter{}, time.Time{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 5 || es[0].Action != "write_history" || es[0].Actor != "carol" || es[0].Reason != "try it" ||
		es[0].Bucket != (history.Bucket{Callee: "search", Caller: "web"}) || es[0].New != "synthetic: 1,440 minutes from 2026-11-29 03:03Z, seed 1" {
		t.Errorf("audit after seed: %+v", es)
	}

	// Again: refused, naming the buckets; nothing written.
	_, err = runPG(t, url, "history", "seed", "--synthetic", "1w", "--reason", "again", now, "--seed", "2")
	if err == nil || !strings.Contains(err.Error(), "refusing to seed: checkout/batch (4 days), checkout/mobile (8 days)") || !strings.Contains(err.Error(), "--force") {
		t.Errorf("seeding over history: %v", err)
	}
	// With --force it writes, and existing minutes keep their rows.
	mustPG(t, url, "history", "seed", "--synthetic", "5w", "--reason", "more", now, "--seed", "2", "--force")
	wantRows[web], wantRows[mobile] = 50400, 50400
	wantRows[history.Bucket{Callee: "orders", Caller: "checkout"}] = 50400
	if got := count(); !reflect.DeepEqual(got, wantRows) {
		t.Errorf("rows per bucket after --force %v, want %v", got, wantRows)
	}
	if again, err := st.Minutes(t.Context(), web, seedEnd.AddDate(0, 0, -28), seedEnd); err != nil || !reflect.DeepEqual(again, wantWeb) {
		t.Errorf("--force changed minutes that had rows: %v", err)
	}

	// A spec file replaces the default buckets.
	spec2 := filepath.Join(t.TempDir(), "spec.yaml")
	if err := os.WriteFile(spec2, []byte("buckets:\n  pay/api: {peak: 10}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out = mustPG(t, url, "history", "seed", "--synthetic", "1d", "--spec", spec2, "--reason", "r", now)
	if !strings.Contains(out, "wrote 1,440 minute rows") || strings.Contains(out, "checkout") {
		t.Errorf("seed --spec:\n%s", out)
	}
}
