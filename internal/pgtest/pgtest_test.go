package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) { Main(m) }

func connect(t *testing.T, u string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatalf("connect %s: %v", u, err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func TestURLGivesFreshEmptyDatabases(t *testing.T) {
	a, b := URL(t), URL(t)
	if a == b {
		t.Fatalf("two calls returned the same URL %s", a)
	}
	ca, cb := connect(t, a), connect(t, b)
	ctx := t.Context()

	for _, c := range []*pgx.Conn{ca, cb} {
		var tables int
		if err := c.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'public'`).Scan(&tables); err != nil {
			t.Fatal(err)
		}
		if tables != 0 {
			t.Errorf("new database has %d tables, want none", tables)
		}
	}
	if _, err := ca.Exec(ctx, `CREATE TABLE t (x int)`); err != nil {
		t.Fatal(err)
	}
	var found *string
	if err := cb.QueryRow(ctx, `SELECT to_regclass('t')::text`).Scan(&found); err != nil {
		t.Fatal(err)
	}
	if found != nil {
		t.Errorf("a table created in one database is visible in the other")
	}
}

func TestURLServesParallelTests(t *testing.T) {
	for i := range 4 {
		t.Run("", func(t *testing.T) {
			t.Parallel()
			c := connect(t, URL(t))
			var n int
			if err := c.QueryRow(t.Context(), `SELECT $1::int + 1`, i).Scan(&n); err != nil || n != i+1 {
				t.Fatalf("SELECT %d+1 = %d, %v", i, n, err)
			}
		})
	}
}

func TestDatabaseDroppedAtCleanup(t *testing.T) {
	var name string
	t.Run("uses", func(t *testing.T) {
		u, err := url.Parse(URL(t))
		if err != nil {
			t.Fatal(err)
		}
		name = u.Path[1:]
		connect(t, u.String()) // left open: cleanup must drop it anyway
	})
	if name == "" {
		t.Fatal("subtest did not get a database")
	}
	c := connect(t, URL(t))
	var exists bool
	if err := c.QueryRow(t.Context(), `SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Errorf("database %s still exists after its test ended", name)
	}
}

func TestStopStartKeepsPortAndData(t *testing.T) {
	u := URL(t)
	c := connect(t, u)
	ctx := t.Context()
	if _, err := c.Exec(ctx, `CREATE TABLE t (x int); INSERT INTO t VALUES (42)`); err != nil {
		t.Fatal(err)
	}

	StopServer(t)
	if err := c.Ping(ctx); err == nil {
		t.Fatal("ping succeeded on a stopped server")
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	if c2, err := pgx.Connect(cctx, u); err == nil {
		c2.Close(ctx)
		t.Fatal("connected to a stopped server")
	}
	cancel()

	StartServer(t)
	var x int
	if err := connect(t, u).QueryRow(ctx, `SELECT x FROM t`).Scan(&x); err != nil || x != 42 {
		t.Fatalf("after restart, SELECT x = %d, %v; want 42", x, err)
	}
}

func TestStopServerRestartsAtCleanup(t *testing.T) {
	u := URL(t)
	t.Run("stops and forgets", func(t *testing.T) { StopServer(t) })
	connect(t, u) // fails the test if the server stayed down
}

func TestFindBinaries(t *testing.T) {
	mk := func(dir string, names ...string) string {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for _, n := range names {
			if err := os.WriteFile(filepath.Join(dir, n), []byte("#!/bin/sh\n"), 0o755); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	tmp := t.TempDir()
	root := filepath.Join(tmp, "lib")
	mk(filepath.Join(root, "9.6", "bin"), "initdb", "postgres")
	mk(filepath.Join(root, "15", "bin"), "initdb", "postgres")
	mk(filepath.Join(root, "10", "bin"), "initdb", "postgres")
	mk(filepath.Join(root, "16", "bin"), "initdb") // incomplete: no server
	mk(filepath.Join(root, "notes"))
	onlyInitdb := mk(filepath.Join(tmp, "path1"), "initdb")
	both := mk(filepath.Join(tmp, "path2"), "initdb", "postgres")
	empty := mk(filepath.Join(tmp, "empty"))

	for _, tc := range []struct {
		name, path, root, want string
	}{
		{"PATH first", onlyInitdb + ":" + both, root, both},
		{"highest complete version", onlyInitdb, root, filepath.Join(root, "15", "bin")},
		{"none", empty, filepath.Join(tmp, "nothing"), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := findBinaries(tc.path, tc.root)
			if tc.want == "" {
				if err == nil || err.Error() != MissingMessage {
					t.Fatalf("findBinaries = %q, %v; want the error %q", got, err, MissingMessage)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("findBinaries = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestIsCI(t *testing.T) {
	for v, want := range map[string]bool{"true": true, "1": true, "TRUE": true, "": false, "false": false, "yes please": false} {
		if got := isCI(v); got != want {
			t.Errorf("isCI(%q) = %v, want %v", v, got, want)
		}
	}
}

func TestCredentialIsUnprivileged(t *testing.T) {
	cred, err := credential()
	if err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() != 0 {
		if cred != nil {
			t.Errorf("not root, yet credential() = %+v; want nil (run as ourselves)", cred)
		}
		return
	}
	if cred == nil || cred.Uid == 0 || cred.Gid == 0 || len(cred.Groups) != 0 {
		t.Errorf("as root, credential() = %+v; want a non-root uid and gid and no supplementary groups", cred)
	}
}

// TestServerDiesWithTestBinary runs a test binary that starts a cluster and
// then panics, as a failing test or a -timeout does, skipping Main's
// cleanup: its server must not outlive it.
func TestServerDiesWithTestBinary(t *testing.T) {
	if os.Getenv(EnvURL) != "" {
		t.Skipf("%s is set: no throwaway cluster to test", EnvURL)
	}
	URL(t) // skips here, as the child would, when there are no binaries

	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestHelperPanics$", "-test.count=1")
	cmd.Env = append(os.Environ(), "PGTEST_HELPER=panic")
	out, err := cmd.Output()
	if err == nil {
		t.Fatalf("helper exited cleanly; want a panic. Output:\n%s", out)
	}
	var pid int
	var dir string
	for _, line := range strings.Split(string(out), "\n") {
		if _, err := fmt.Sscanf(line, "postmaster %d %s", &pid, &dir); err == nil {
			break
		}
	}
	if pid == 0 || !strings.Contains(dir, "sluice-pgtest-") {
		t.Fatalf("helper did not report its server. Output:\n%s", out)
	}
	t.Cleanup(func() { os.RemoveAll(dir) }) // the one thing a panic leaks

	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !gone(pid) {
		select {
		case <-deadline.C:
			t.Fatalf("postmaster %d still running 30s after its test binary died", pid)
		case <-tick.C:
		}
	}
}

// gone reports whether pid has exited; a zombie counts, since a container's
// init may never reap it.
func gone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
	}
	// pid (comm) state …: the state follows the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i >= 0 && i+2 < len(s) && s[i+2] == 'Z'
}

func TestHelperPanics(t *testing.T) {
	if os.Getenv("PGTEST_HELPER") != "panic" {
		t.Skip("helper for TestServerDiesWithTestBinary")
	}
	URL(t)
	mu.Lock()
	fmt.Printf("postmaster %d %s\n", shared.proc.Pid, shared.dir)
	mu.Unlock()
	panic("helper: dying without cleanup")
}

// TestMissingBinaries runs a test that needs Postgres where none can be
// found: skipped on a laptop, failed in CI, with the same message.
func TestMissingBinaries(t *testing.T) {
	for _, tc := range []struct {
		ci       string
		wantFail bool
		verdict  string
	}{
		{"", false, "--- SKIP"},
		{"false", false, "--- SKIP"},
		{"true", true, "--- FAIL"},
	} {
		t.Run("CI="+tc.ci, func(t *testing.T) {
			cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^TestHelperMissing$", "-test.count=1", "-test.v")
			cmd.Env = append(os.Environ(), "PGTEST_HELPER=missing", "CI="+tc.ci)
			out, err := cmd.CombinedOutput()
			if failed := err != nil; failed != tc.wantFail {
				t.Errorf("helper failed = %v (%v), want %v. Output:\n%s", failed, err, tc.wantFail, out)
			}
			if !strings.Contains(string(out), tc.verdict) || !strings.Contains(string(out), MissingMessage) {
				t.Errorf("helper output lacks %q and the message %q:\n%s", tc.verdict, MissingMessage, out)
			}
		})
	}
}

func TestHelperMissing(t *testing.T) {
	if os.Getenv("PGTEST_HELPER") != "missing" {
		t.Skip("helper for TestMissingBinaries")
	}
	mu.Lock()
	shared, initErr, skip = nil, errors.New(MissingMessage), true // as setup reports no binaries
	mu.Unlock()
	URL(t)
	t.Error("URL returned without binaries")
}
