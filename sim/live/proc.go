package live

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Bounds on the waits of a live run. They are generous: a slow machine
// makes a run slower, not wrong.
const (
	buildTimeout = 5 * time.Minute  // go build of the three binaries
	startTimeout = 30 * time.Second // until a process listens, is ready, holds a policy
	stopTimeout  = 10 * time.Second // from SIGTERM to exit, then SIGKILL
)

// Binaries names the three binaries a live run starts.
var Binaries = []string{"controller", "aggregator", "sidecar"}

// Build compiles the controller, aggregator and sidecar into dir with the
// go command on PATH. It must run inside the sluice module (go run ./cmd/sim,
// go test). The binaries are built without the race detector even under
// go test -race: they are the system under measurement, and instrumenting
// them would cost the CPU that the measurement needs.
func Build(ctx context.Context, dir string) error {
	ctx, cancel := context.WithTimeout(ctx, buildTimeout)
	defer cancel()
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	for _, b := range Binaries {
		args = append(args, "github.com/sluicehq/sluice/cmd/"+b)
	}
	cmd := exec.CommandContext(ctx, "go", args...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s: %w\n%s(live mode builds the binaries from the sluice module: run it from there, or pass --bin with a directory holding controller, aggregator and sidecar, e.g. from make build)",
			strings.Join(args, " "), err, out)
	}
	return nil
}

// checkBinaries reports which of the three binaries dir lacks.
func checkBinaries(dir string) error {
	var errs []error
	for _, b := range Binaries {
		st, err := os.Stat(filepath.Join(dir, b))
		if err != nil {
			errs = append(errs, err)
		} else if st.IsDir() || st.Mode()&0o111 == 0 {
			errs = append(errs, fmt.Errorf("%s is not an executable file", filepath.Join(dir, b)))
		}
	}
	return errors.Join(errs...)
}

// childEnv is this process's environment without SLUICE_* variables, so that
// nothing set on the machine configures the processes of a run.
func childEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SLUICE_") {
			env = append(env, kv)
		}
	}
	return env
}

// logBuffer holds a process's output, up to a bound, and tells waiters
// about every write.
type logBuffer struct {
	mu      sync.Mutex // protects buf, lost and changed
	buf     []byte
	lost    int
	changed chan struct{} // closed and replaced on every write
}

const maxLog = 4 << 20

func newLogBuffer() *logBuffer { return &logBuffer{changed: make(chan struct{})} }

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := maxLog - len(b.buf); room < len(p) {
		b.buf = append(b.buf, p[:max(room, 0)]...)
		b.lost += len(p) - max(room, 0)
	} else {
		b.buf = append(b.buf, p...)
	}
	close(b.changed)
	b.changed = make(chan struct{})
	return len(p), nil
}

func (b *logBuffer) snapshot() (string, <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf), b.changed
}

// tail returns the last n lines.
func (b *logBuffer) tail(n int) string {
	s, _ := b.snapshot()
	lines := strings.SplitAfter(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "")
}

// proc is one running binary. Its listeners bind port 0 (or a port given
// again on a restart); the addresses are read from its "listening" log
// lines, so there is no race for free ports.
type proc struct {
	name   string
	binary string // controller, aggregator or sidecar
	cmd    *exec.Cmd
	out    *logBuffer
	done   chan struct{} // closed once the process has exited
	err    error         // from Wait; read only after done is closed
}

// startProc runs bin with JSON logs.
func startProc(name, bin string, args ...string) (*proc, error) {
	cmd := exec.Command(bin, append([]string{"--log-format=json"}, args...)...)
	cmd.Env = childEnv()
	cmd.SysProcAttr = sysProcAttr()
	p := &proc{name: name, binary: filepath.Base(bin), cmd: cmd, out: newLogBuffer(), done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// failure describes an exit: its status and the last lines of its output.
func (p *proc) failure(what string) error {
	return fmt.Errorf("%s %s (%v); its last output:\n%s", p.name, what, p.err, p.out.tail(20))
}

// addr waits until p logs the address of its listener ("admin", "grpc" or
// "http").
func (p *proc) addr(ctx context.Context, listener string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	for {
		text, changed := p.out.snapshot()
		if a := listeningAddr(text, listener); a != "" {
			return a, nil
		}
		select {
		case <-changed:
		case <-p.done:
			text, _ := p.out.snapshot() // Wait has copied all output: one last look
			if a := listeningAddr(text, listener); a != "" {
				return a, nil
			}
			return "", p.failure("exited before listening on " + listener)
		case <-ctx.Done():
			return "", fmt.Errorf("%s did not log its %s address within %v: %w", p.name, listener, startTimeout, ctx.Err())
		}
	}
}

// listeningAddr finds internal/process's "listening" log line of listener.
func listeningAddr(logs, listener string) string {
	for line := range strings.Lines(logs) {
		var rec struct{ Msg, Listener, Addr string }
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "listening" && rec.Listener == listener {
			return rec.Addr
		}
	}
	return ""
}

// kill sends SIGKILL and waits for the exit.
func (p *proc) kill() error {
	if p.exited() {
		return nil
	}
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kill %s: %w", p.name, err)
	}
	t := time.NewTimer(stopTimeout)
	defer t.Stop()
	select {
	case <-p.done:
		return nil
	case <-t.C:
		return fmt.Errorf("%s still running %v after SIGKILL", p.name, stopTimeout)
	}
}

// term sends SIGTERM and waits up to stopTimeout for the exit, then kills.
func (p *proc) term() error {
	if p.exited() {
		return nil
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return errors.Join(fmt.Errorf("SIGTERM %s: %w", p.name, err), p.kill())
	}
	t := time.NewTimer(stopTimeout)
	defer t.Stop()
	select {
	case <-p.done:
		return nil
	case <-t.C:
		return errors.Join(fmt.Errorf("%s did not exit within %v of SIGTERM", p.name, stopTimeout), p.kill())
	}
}

// scrapeClient reads the processes' admin endpoints. Without keep-alives:
// a scrape a second per process costs nothing to dial on loopback, and no
// idle connection (and its goroutines) outlives a run.
var scrapeClient = &http.Client{
	Timeout:   2 * time.Second,
	Transport: &http.Transport{DisableKeepAlives: true},
}

// get fetches url and returns its status and body.
func get(ctx context.Context, url string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := scrapeClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// metrics is one scrape of a /metrics page in the Prometheus text format.
type metrics string

func scrape(ctx context.Context, admin string) (metrics, error) {
	code, body, err := get(ctx, "http://"+admin+"/metrics")
	if err != nil {
		return "", err
	}
	if code != http.StatusOK {
		return "", fmt.Errorf("GET %s/metrics: %d", admin, code)
	}
	return metrics(body), nil
}

// each calls fn with every sample of the metric name: its label set (the
// text between the braces) and its value.
func (m metrics) each(name string, fn func(labels string, v float64)) {
	for line := range strings.Lines(string(m)) {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		if sp < 0 {
			continue
		}
		series, value := line[:sp], line[sp+1:]
		metric, labels, _ := strings.Cut(series, "{")
		if metric != name {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			continue
		}
		fn(strings.TrimSuffix(labels, "}"), v)
	}
}

// sum adds up the samples of name whose labels include every one of
// labels (e.g. `peer="web"`); ok is false when there is none.
func (m metrics) sum(name string, labels ...string) (sum float64, ok bool) {
	m.each(name, func(set string, v float64) {
		for _, l := range labels {
			if !strings.Contains(set, l) {
				return
			}
		}
		sum, ok = sum+v, true
	})
	return sum, ok
}
