//go:build unix

package child

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// Bounds on the waits of these tests; generous, for a busy machine.
const (
	waitTimeout = 30 * time.Second
	stopTimeout = 10 * time.Second
)

// script writes a shell script standing in for a binary (it ignores the
// --log-format=json that Start passes) and returns its path.
func script(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "fake")
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// listening is internal/process's log line for listener on addr.
func listening(listener, addr string) string {
	return `echo '{"time":"2025-01-01T00:00:00Z","level":"INFO","msg":"listening","listener":"` + listener + `","addr":"` + addr + `"}'`
}

// idle keeps a script running until it is signalled.
const idle = "while :; do sleep 0.1; done"

func start(t *testing.T, body string) *Proc {
	t.Helper()
	p, err := Start("fake", script(t, body))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Kill(stopTimeout); err != nil {
			t.Error(err)
		}
	})
	return p
}

func addr(t *testing.T, p *Proc, listener string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	a, err := p.Addr(ctx, listener)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestStartAddrTerm: Addr finds each listener's line among other output,
// including a line logged a while after the first; SIGTERM stops a
// process that handles it, with its own exit status.
func TestStartAddrTerm(t *testing.T) {
	p := start(t, strings.Join([]string{
		"echo 'not JSON'",
		`echo '{"msg":"starting","listener":"http","addr":"wrong:1"}'`,
		listening("admin", "127.0.0.1:1001"),
		"sleep 0.2",
		listening("http", "127.0.0.1:1002"),
		"trap 'echo stopping; exit 0' TERM",
		listening("ready", "-"),
		idle,
	}, "\n"))
	if p.Name() != "fake" || p.Binary() != "fake" {
		t.Errorf("Name %q, Binary %q; want fake, fake", p.Name(), p.Binary())
	}
	if a := addr(t, p, "admin"); a != "127.0.0.1:1001" {
		t.Errorf("admin address %q, want 127.0.0.1:1001", a)
	}
	if a := addr(t, p, "http"); a != "127.0.0.1:1002" {
		t.Errorf("http address %q, want 127.0.0.1:1002", a)
	}
	addr(t, p, "ready") // the trap is set
	if p.Exited() || p.Err() != nil {
		t.Fatalf("exited %v (%v) while running", p.Exited(), p.Err())
	}
	if err := p.Term(stopTimeout); err != nil {
		t.Fatal(err)
	}
	if !p.Exited() || p.Err() != nil {
		t.Errorf("after Term: exited %v, status %v; want exited with status 0", p.Exited(), p.Err())
	}
	select {
	case <-p.Done():
	default:
		t.Error("Done is open after Term")
	}
	if !strings.Contains(p.Output(), "stopping") {
		t.Errorf("the process did not handle SIGTERM; output:\n%s", p.Output())
	}
	if err := p.Term(stopTimeout); err != nil {
		t.Errorf("Term of an exited process: %v", err)
	}
	if err := p.Kill(stopTimeout); err != nil {
		t.Errorf("Kill of an exited process: %v", err)
	}
	if err := p.Signal(os.Interrupt); !errors.Is(err, os.ErrProcessDone) {
		t.Errorf("Signal to an exited process: %v, want os.ErrProcessDone", err)
	}
}

// TestAddrExited: a process that exits before it listens is an error with
// its status and last output; a line it logged before exiting is still
// found.
func TestAddrExited(t *testing.T) {
	p := start(t, listening("admin", "127.0.0.1:1001")+"\necho 'tick: 0s is below 10ms' >&2\nexit 3")
	ctx, cancel := context.WithTimeout(t.Context(), waitTimeout)
	defer cancel()
	_, err := p.Addr(ctx, "grpc")
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"fake exited before listening on grpc", "exit status 3", "tick: 0s is below 10ms"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %q:\n%v", want, err)
		}
	}
	if a := addr(t, p, "admin"); a != "127.0.0.1:1001" {
		t.Errorf("admin address %q after the exit, want 127.0.0.1:1001", a)
	}
	var exit *exec.ExitError
	if !errors.As(p.Err(), &exit) || exit.ExitCode() != 3 {
		t.Errorf("Err %v, want exit status 3", p.Err())
	}
	if err := p.Failure("exited"); !strings.Contains(err.Error(), "fake exited (exit status 3); its last output:\n") {
		t.Errorf("Failure: %v", err)
	}
}

// TestAddrContext: Addr gives up when its context ends, and says which
// listener it waited for.
func TestAddrContext(t *testing.T) {
	p := start(t, idle)
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	_, err := p.Addr(ctx, "admin")
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "fake did not log its admin address within") {
		t.Errorf("got %v, want a deadline naming the admin address", err)
	}
	if err := p.Kill(stopTimeout); err != nil {
		t.Fatal(err)
	}
	if !p.Exited() || p.Err() == nil {
		t.Errorf("after Kill: exited %v, status %v; want killed", p.Exited(), p.Err())
	}
}

// TestTermKills: a process that ignores SIGTERM is killed after the
// timeout, and Term says so.
func TestTermKills(t *testing.T) {
	p := start(t, "trap '' TERM\n"+listening("ready", "-")+"\n"+idle)
	addr(t, p, "ready")
	err := p.Term(time.Second)
	if err == nil || !strings.Contains(err.Error(), "fake did not exit within 1s of SIGTERM") {
		t.Errorf("Term: %v, want it to say the process did not exit", err)
	}
	if !p.Exited() {
		t.Error("still running after Term")
	}
}

// TestEnv: children get no SLUICE_* variable of this process.
func TestEnv(t *testing.T) {
	t.Setenv("SLUICE_CONTROLLER_TICK", "1s")
	t.Setenv("CHILD_TEST_OTHER", "kept")
	env := Env("EXTRA=1")
	if !slices.Contains(env, "CHILD_TEST_OTHER=kept") || env[len(env)-1] != "EXTRA=1" {
		t.Errorf("Env lost a variable or the extra one: %v", env)
	}
	for _, kv := range env {
		if strings.HasPrefix(kv, "SLUICE_") {
			t.Errorf("Env keeps %s", kv)
		}
	}
	p := start(t, `echo '{"msg":"listening","listener":"env","addr":"'"${SLUICE_CONTROLLER_TICK:-unset}"'"}'`+"\n"+idle)
	if got := addr(t, p, "env"); got != "unset" {
		t.Errorf("the child sees SLUICE_CONTROLLER_TICK=%s", got)
	}
}

func TestTail(t *testing.T) {
	p := start(t, "printf 'one\\ntwo\\nthree\\n'\n"+listening("done", "-")+"\n"+idle)
	addr(t, p, "done")
	if got := p.Tail(3); !strings.HasPrefix(got, "three\n{") {
		t.Errorf("Tail(3) = %q, want the last two lines", got)
	}
}

// TestOutputBound: output beyond the bound is counted, not kept.
func TestOutputBound(t *testing.T) {
	o := newOutput()
	_, changed := o.snapshot()
	o.Write(make([]byte, maxOutput-2))
	select {
	case <-changed:
	default:
		t.Error("a write did not signal")
	}
	o.Write([]byte("abcde\n"))
	s, _ := o.snapshot()
	if want := "ab\n[4 more bytes of output, not kept]\n"; !strings.HasSuffix(s, want) || len(s) != maxOutput+len(want)-2 {
		t.Errorf("output ends %q, want %q", s[len(s)-50:], want)
	}
}

func TestCheck(t *testing.T) {
	dir := t.TempDir()
	for name, mode := range map[string]os.FileMode{"controller": 0o755, "aggregator": 0o644} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, mode); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "sidecar"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := Check(dir, "controller"); err != nil {
		t.Errorf("Check of an executable: %v", err)
	}
	err := Check(dir, "controller", "aggregator", "sidecar", "injector")
	if err == nil {
		t.Fatal("no error")
	}
	for _, want := range []string{"aggregator is not an executable file", "sidecar is not an executable file", "injector: no such file"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %q:\n%v", want, err)
		}
	}
	if strings.Contains(err.Error(), "controller") {
		t.Errorf("error names the controller, an executable file:\n%v", err)
	}
}

// TestBuildFails: a build failure names the command and carries go's
// output.
func TestBuildFails(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	err := Build(ctx, t.TempDir(), false, "no-such-binary")
	if err == nil || !strings.Contains(err.Error(), "go build -o") || !strings.Contains(err.Error(), "cmd/no-such-binary") {
		t.Errorf("got %v, want go build's failure naming cmd/no-such-binary", err)
	}
}
