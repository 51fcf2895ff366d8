//go:build unix

package e2e

import (
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/loadgen"
)

// stallFor and stallAt: the sidecar is frozen (SIGSTOP) for stallFor at
// each of stallAt, seconds into the load.
const stallFor = 700 * time.Millisecond

var stallAt = []float64{2.5, 5, 7.5}

// TestSidecarStallIsNotASurge: a sidecar that gets no CPU for a while (a
// busy host, a long GC pause) serves the requests that queued meanwhile in
// a bunch once it runs again. A caller under its limit must not pay for
// that: the bunch is not a surge. Here the whole sidecar process is frozen
// three times for 700 ms while web sends 15 rps against its limit of 20;
// web keeps what it offers, and the sidecar counts the stalls. Before,
// the step that ended a stall started a check window that then held the
// whole stall's requests in a few hundredths of a second, and the surge
// projection dropped most of them.
func TestSidecarStallIsNotASurge(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end with processes: about 15 s")
	}
	retryBusy(func(t *testing.T) {
		r := startIdentRig(t, false)
		var wg sync.WaitGroup
		defer wg.Wait()
		stop := make(chan struct{})
		defer close(stop)
		wg.Go(func() {
			start := time.Now()
			for _, at := range stallAt {
				select {
				case <-stop:
					return
				case <-time.After(time.Until(start.Add(time.Duration(at * float64(time.Second))))):
				}
				if err := r.sc.Signal(syscall.SIGSTOP); err != nil {
					t.Error(err)
					return
				}
				time.Sleep(stallFor)
				if err := r.sc.Signal(syscall.SIGCONT); err != nil {
					t.Error(err)
					return
				}
			}
		})
		g := identLoad(t, r, []loadgen.Caller{{Name: "web", Rate: rate(identWebRate)}})
		requireOnSchedule(t, g, 0, identRunFor)
		web := g.Sum("web", 0, identRunFor+1)
		if web.Errors+web.Skipped > 0 {
			t.Errorf("web: %d errors, %d skipped: the rig lost requests", web.Errors, web.Skipped)
		}
		requireAllowance(t, "web", float64(web.Admitted)/identRunFor, float64(web.Sent)/identRunFor)
		stalls, _ := metric(t, r.sc.admin, "sluice_sidecar_report_stalls_total", `direction="inbound"`)
		t.Logf("sluice_sidecar_report_stalls_total %v", stalls)
		if stalls < 1 {
			t.Errorf("sluice_sidecar_report_stalls_total = %v, want at least 1 after %d freezes of %v", stalls, len(stallAt), stallFor)
		}
	})(t)
}
