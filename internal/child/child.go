// Package child runs sluice's binaries as child processes, for the
// end-to-end tests and the simulator's live mode: build them, start them,
// wait until they listen, stop them, and read their metrics.
//
// Everything takes a context or a timeout from its caller and returns an
// error; the package imports no testing code, so that production code
// (go run ./cmd/sim live) can use it as well as tests.
package child

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Proc is one running binary. Its listeners bind port 0 (or a port given
// again on a restart); their addresses are read from its "listening" log
// lines, so there is no race for free ports.
type Proc struct {
	name   string
	binary string // base name of the executable
	cmd    *exec.Cmd
	out    *output
	done   chan struct{} // closed once the process has exited
	err    error         // from Wait; read only after done is closed
}

// Start runs the binary bin with JSON logs (--log-format=json, which Addr
// reads) and args, in Env's environment, with its stdout and stderr
// captured. name names the process in errors. On Linux the process dies
// with the thread that started it, and it has its own process group (see
// sysProcAttr).
func Start(name, bin string, args ...string) (*Proc, error) {
	cmd := exec.Command(bin, append([]string{"--log-format=json"}, args...)...)
	cmd.Env = Env()
	cmd.SysProcAttr = sysProcAttr()
	p := &Proc{name: name, binary: filepath.Base(bin), cmd: cmd, out: newOutput(), done: make(chan struct{})}
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

// Name is the name Start was given.
func (p *Proc) Name() string { return p.name }

// Binary is the base name of p's executable: controller, aggregator or
// sidecar.
func (p *Proc) Binary() string { return p.binary }

// Done is closed once p has exited and all its output is read.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Exited reports whether p has exited.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Err is p's exit status once it has exited: nil for status 0, an
// *exec.ExitError otherwise. It is nil while p runs.
func (p *Proc) Err() error {
	if !p.Exited() {
		return nil
	}
	return p.err
}

// Output is what p has written to stdout and stderr so far.
func (p *Proc) Output() string {
	s, _ := p.out.snapshot()
	return s
}

// Tail is the last n lines of Output.
func (p *Proc) Tail(n int) string {
	lines := strings.SplitAfter(p.Output(), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "")
}

// Failure describes p's end ("exited", "exited before ..."): its exit
// status and the last lines of its output.
func (p *Proc) Failure(what string) error {
	return fmt.Errorf("%s %s (%v); its last output:\n%s", p.name, what, p.Err(), p.Tail(20))
}

// Addr waits until p logs the address of its listener ("admin", "grpc" or
// "http"), until p exits, or until ctx ends.
func (p *Proc) Addr(ctx context.Context, listener string) (string, error) {
	began := time.Now()
	for {
		text, changed := p.out.snapshot()
		if a := listeningAddr(text, listener); a != "" {
			return a, nil
		}
		select {
		case <-changed:
		case <-p.done:
			// Wait has copied all output: one last look.
			if a := listeningAddr(p.Output(), listener); a != "" {
				return a, nil
			}
			return "", p.Failure("exited before listening on " + listener)
		case <-ctx.Done():
			return "", fmt.Errorf("%s did not log its %s address within %v: %w",
				p.name, listener, time.Since(began).Round(100*time.Millisecond), context.Cause(ctx))
		}
	}
}

// listeningAddr finds internal/process's "listening" log line of listener,
// {"msg":"listening","listener":"admin","addr":"127.0.0.1:41234",...}, in
// JSON logs.
func listeningAddr(logs, listener string) string {
	for line := range strings.Lines(logs) {
		var rec struct{ Msg, Listener, Addr string }
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "listening" && rec.Listener == listener {
			return rec.Addr
		}
	}
	return ""
}

// Signal sends sig to p.
func (p *Proc) Signal(sig os.Signal) error {
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("signal %s %v: %w", p.name, sig, err)
	}
	return nil
}

// Kill sends SIGKILL and waits up to timeout for p to exit. A process that
// has exited already is no error.
func (p *Proc) Kill(timeout time.Duration) error {
	if p.Exited() {
		return nil
	}
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("kill %s: %w", p.name, err)
	}
	if !p.wait(timeout) {
		return fmt.Errorf("%s still running %v after SIGKILL", p.name, timeout)
	}
	return nil
}

// Term sends SIGTERM and waits up to timeout for p to exit; if it does
// not, it kills p (and waits up to timeout again) and says so. Once p has
// exited, whatever its status (see Err), Term returns nil.
func (p *Proc) Term(timeout time.Duration) error {
	if p.Exited() {
		return nil
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return errors.Join(fmt.Errorf("SIGTERM %s: %w", p.name, err), p.Kill(timeout))
	}
	if !p.wait(timeout) {
		return errors.Join(fmt.Errorf("%s did not exit within %v of SIGTERM", p.name, timeout), p.Kill(timeout))
	}
	return nil
}

// wait reports whether p exits within timeout.
func (p *Proc) wait(timeout time.Duration) bool {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.done:
		return true
	case <-t.C:
		return false
	}
}

// maxOutput bounds the output kept of one process; what it writes beyond
// is counted, not kept.
const maxOutput = 4 << 20

// output holds a process's output, up to maxOutput, and tells waiters
// about every write.
type output struct {
	mu      sync.Mutex // protects buf, lost and changed
	buf     []byte
	lost    int
	changed chan struct{} // closed and replaced on every write
}

func newOutput() *output { return &output{changed: make(chan struct{})} }

func (o *output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	room := max(maxOutput-len(o.buf), 0)
	if room < len(p) {
		o.buf = append(o.buf, p[:room]...)
		o.lost += len(p) - room
	} else {
		o.buf = append(o.buf, p...)
	}
	close(o.changed)
	o.changed = make(chan struct{})
	return len(p), nil
}

// snapshot returns what was kept so far, with a last line saying how much
// was not, and a channel closed at the next write.
func (o *output) snapshot() (string, <-chan struct{}) {
	o.mu.Lock()
	defer o.mu.Unlock()
	s := string(o.buf)
	if o.lost > 0 {
		s += fmt.Sprintf("\n[%d more bytes of output, not kept]\n", o.lost)
	}
	return s, o.changed
}
