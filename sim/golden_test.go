package sim

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the simulator's output")

// run simulates sc with seed and, should the test fail, says which seed to
// replay it with.
func run(t *testing.T, sc *Scenario, seed uint64) *Result {
	t.Helper()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("scenario %s, seed %d: replay with `go run ./cmd/sim run %s --seed %d`", sc.Name, seed, sc.Name, seed)
		}
	})
	r, err := Run(sc, seed, Options{})
	if err != nil {
		t.Fatalf("seed %d: %v", seed, err)
	}
	return r
}

func loadBuiltin(t *testing.T, name string) *Scenario {
	t.Helper()
	sc, err := LoadBuiltin(name)
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

// TestScenarios runs every built-in scenario with its own seed and compares
// its summary with testdata/<scenario>.golden.
func TestScenarios(t *testing.T) {
	names := Builtin()
	if len(names) < 7 {
		t.Fatalf("built-in scenarios: %v; want at least the seven of the issue", names)
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			sc := loadBuiltin(t, name)
			if sc.Tenants != nil {
				t.Skip("not repeatable byte for byte: TestTenantsZipf runs it")
			}
			r := run(t, sc, sc.Seed)
			var got bytes.Buffer
			if err := WriteSummary(&got, r); err != nil {
				t.Fatal(err)
			}
			checkInvariants(t, r)
			golden(t, filepath.Join("testdata", name+".golden"), got.Bytes(), sc.Seed)
		})
	}
}

func golden(t *testing.T, path string, got []byte, seed uint64) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run `go test ./sim -update` to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("seed %d: summary differs from %s (if the change is intended, run `go test ./sim -update` and review the diff):\n--- got\n%s--- want\n%s",
			seed, path, got, want)
	}
}

// checkInvariants holds for every run: every request is admitted or
// dropped, every decision is counted, drop ratios are ratios.
func checkInvariants(t *testing.T, r *Result) {
	t.Helper()
	total := 0.0
	for _, b := range r.Buckets {
		for i := range b.Offered {
			if b.Admitted[i]+b.Dropped[i] != b.Offered[i] {
				t.Fatalf("seed %d: %s second %d: admitted %v + dropped %v != offered %v",
					r.Seed, b.Bucket(), i, b.Admitted[i], b.Dropped[i], b.Offered[i])
			}
			if b.Retries[i] > b.Offered[i] {
				t.Fatalf("seed %d: %s second %d: %v retries of %v offered", r.Seed, b.Bucket(), i, b.Retries[i], b.Offered[i])
			}
			if !(b.Ratio[i] >= 0 && b.Ratio[i] < 1) {
				t.Fatalf("seed %d: %s second %d: ratio %v", r.Seed, b.Bucket(), i, b.Ratio[i])
			}
			total += b.Offered[i]
		}
	}
	if int64(total) != r.Decisions {
		t.Fatalf("seed %d: %v requests offered, %d decided", r.Seed, total, r.Decisions)
	}
	if fp := r.FastPath; fp.SurgeReports > r.ControlPlane.Reports.Messages {
		t.Fatalf("seed %d: %d surge reports of %d reports", r.Seed, fp.SurgeReports, r.ControlPlane.Reports.Messages)
	}
	if r.ControlPlane.Reports.Bytes == 0 || r.ControlPlane.ZoneLoads.Bytes == 0 || r.ControlPlane.Policies.Bytes == 0 {
		t.Fatalf("seed %d: a tier sent nothing: %+v", r.Seed, r.ControlPlane)
	}
}

// TestDeterminism runs one scenario twice with one seed, and once with
// another: the same seed gives the same bytes, in every output; another
// seed gives other bytes but the same story.
func TestDeterminism(t *testing.T) {
	t.Parallel()
	sc, err := LoadFile(filepath.Join("testdata", "determinism.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	outputs := func(seed uint64) (summary, csv, png []byte, s Summary) {
		r := run(t, sc, seed)
		var a, b, c bytes.Buffer
		if err := WriteSummary(&a, r); err != nil {
			t.Fatal(err)
		}
		if err := WriteCSV(&b, r); err != nil {
			t.Fatal(err)
		}
		if err := WritePNG(&c, r); err != nil {
			t.Fatal(err)
		}
		return a.Bytes(), b.Bytes(), c.Bytes(), Summarize(r)
	}
	sum1, csv1, png1, s1 := outputs(11)
	sum2, csv2, png2, _ := outputs(11)
	if !bytes.Equal(csv1, csv2) {
		t.Errorf("seed 11: two runs wrote different CSV")
	}
	if !bytes.Equal(sum1, sum2) {
		t.Errorf("seed 11: two runs wrote different summaries:\n%s\n%s", sum1, sum2)
	}
	if !bytes.Equal(png1, png2) {
		t.Errorf("seed 11: two runs drew different PNGs")
	}
	if !bytes.Contains(sum1, []byte("seed 11")) || !bytes.Contains(csv1, []byte("determinism,11,")) {
		t.Errorf("the outputs do not name seed 11")
	}

	_, csv3, _, s3 := outputs(12)
	if bytes.Equal(csv1, csv3) {
		t.Errorf("seeds 11 and 12 wrote the same CSV: the seed does not reach the random source")
	}
	for i := range s1.Callers {
		a, b := s1.Callers[i], s3.Callers[i]
		if a.Over() != b.Over() || a.Episodes != b.Episodes {
			t.Errorf("%s: seed 11 over limit %v in %d episodes, seed 12 %v in %d", a.Bucket, a.Over(), a.Episodes, b.Over(), b.Episodes)
		}
		// The phases decide how much of the pipeline a surge waits for:
		// at most a report, a flush and a tick interval.
		if a.Over() && (a.TimeToEnforce < 0 || b.TimeToEnforce < 0) {
			t.Errorf("%s: time to enforce %v with seed 11, %v with seed 12: never enforced", a.Bucket, a.TimeToEnforce, b.TimeToEnforce)
		}
		if d := a.TimeToEnforce - b.TimeToEnforce; d < -3*Bin || d > 3*Bin {
			t.Errorf("%s: time to enforce %v with seed 11, %v with seed 12: more than three intervals apart", a.Bucket, a.TimeToEnforce, b.TimeToEnforce)
		}
		for _, m := range []struct {
			name string
			x, y float64
		}{
			{"steady-state error", a.SteadyStateError, b.SteadyStateError},
			{"collateral", a.Collateral, b.Collateral},
			{"wrongly dropped", a.WronglyDropped, b.WronglyDropped},
			{"wrongly allowed", a.WronglyAllowed, b.WronglyAllowed},
		} {
			if d := m.x - m.y; !(d >= -0.01 && d <= 0.01) && !(m.x != m.x && m.y != m.y) {
				t.Errorf("%s: %s %v with seed 11, %v with seed 12: more than 1 point apart", a.Bucket, m.name, m.x, m.y)
			}
		}
	}
	if s1.BystanderCollateral != 0 || s3.BystanderCollateral != 0 {
		t.Errorf("bystanders lost requests: %v with seed 11, %v with seed 12", s1.BystanderCollateral, s3.BystanderCollateral)
	}
}
