// Package pgtest gives tests a real Postgres: every call to URL returns a
// fresh, empty database, created for the test and dropped when it ends.
//
// The databases live on one server per test binary:
//
//   - SLUICE_TEST_DATABASE_URL, when set, names a server to use (its user
//     must be allowed to CREATE DATABASE). The server is never stopped.
//   - Otherwise pgtest starts a throwaway cluster: initdb into a temp dir,
//     from the binaries in PATH or the highest version under
//     /usr/lib/postgresql/*/bin, listening on 127.0.0.1 and a free port only,
//     with fsync off. It starts on the first call to URL; Main stops it and
//     removes the dir after the tests.
//
// When the binaries are missing the test is skipped, except with CI=true,
// where it fails: CI must never pass by silently testing nothing.
//
// Postgres refuses to run as root, and CI runs as root: then initdb and the
// server run as the "postgres" system user if there is one, else as
// "nobody", through exec.Cmd credentials (no sudo or su).
//
// The server is a child of the test binary with a parent-death signal, not
// a daemon started by pg_ctl: a test binary that dies from a panic or a
// -timeout takes its cluster with it instead of leaking a postmaster.
// Only its temp dir ($TMPDIR/sluice-pgtest-*) is left behind then.
package pgtest

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// EnvURL names an existing server to use instead of a throwaway cluster.
const EnvURL = "SLUICE_TEST_DATABASE_URL"

// MissingMessage is the reason a test is skipped (or, with CI=true, fails)
// when no Postgres server binaries can be found.
const MissingMessage = "Postgres server binaries not found; install the postgresql package (make test does this)"

// startTimeout bounds how long the server may take to accept connections,
// and stopTimeout how long a shutdown may take before the server is killed.
const (
	startTimeout = 60 * time.Second
	stopTimeout  = 30 * time.Second
)

var (
	mu      sync.Mutex // guards shared and its state
	shared  *server
	initErr error // why the server could not be set up; sticky
	skip    bool  // initErr means "skip", not "fail"
)

// Main runs a package's tests and then stops the throwaway cluster, if one
// was started, and removes its files. Use it as the package's TestMain:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
func Main(m *testing.M) {
	code := m.Run()
	if err := Close(); err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// Close stops the throwaway cluster, if one was started, and removes its
// files; an external server is left alone. It is for a TestMain that has
// more to clean up than Main does: call it after m.Run. A later URL starts
// a new cluster.
func Close() error {
	mu.Lock()
	defer mu.Unlock()
	if shared == nil {
		return nil
	}
	err := shared.destroy()
	shared = nil
	return err
}

// URL returns a connection URL to a new, empty database on the shared
// server. The database is dropped when t ends; connections still open then
// are terminated.
func URL(t testing.TB) string {
	t.Helper()
	s := server1(t)
	name := "sluice_test_" + randomHex(6)
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if err := s.exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("pgtest: create database %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), stopTimeout)
		defer cancel()
		// FORCE (Postgres 13+) terminates connections a test left open, so
		// a leaked pool can not keep its database alive.
		if err := s.exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("pgtest: drop database %s: %v", name, err)
		}
	})
	return s.url(name)
}

// StopServer stops the throwaway cluster (a fast shutdown: clients are
// disconnected) so that a test can check what survives a lost database.
// If the test does not start it again, the server is started at cleanup, so
// the next test finds it running. The test must not run in parallel with
// others that use the server. It skips the test when the server is an
// external one (SLUICE_TEST_DATABASE_URL), which pgtest must not stop.
func StopServer(t testing.TB) {
	t.Helper()
	s := server1(t)
	if s.external {
		t.Skipf("pgtest: the server is external (%s is set); it can not be stopped", EnvURL)
	}
	mu.Lock()
	defer mu.Unlock()
	if err := s.stop(syscall.SIGINT); err != nil {
		t.Fatalf("pgtest: stop server: %v", err)
	}
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		if s.proc == nil {
			if err := s.start(); err != nil {
				t.Errorf("pgtest: start server again at cleanup: %v", err)
			}
		}
	})
}

// StartServer starts the cluster StopServer stopped, on the same port and
// with the same data, and returns once it accepts connections.
func StartServer(t testing.TB) {
	t.Helper()
	s := server1(t)
	if s.external {
		t.Skipf("pgtest: the server is external (%s is set); it can not be started", EnvURL)
	}
	mu.Lock()
	defer mu.Unlock()
	if s.proc != nil {
		t.Fatal("pgtest: StartServer: the server is running")
	}
	if err := s.start(); err != nil {
		t.Fatalf("pgtest: start server: %v", err)
	}
}

// server1 returns the shared server, setting it up on first use, or ends
// the test: skipped when there are no binaries (failed with CI=true), failed
// on any other error.
func server1(t testing.TB) *server {
	t.Helper()
	mu.Lock()
	defer mu.Unlock()
	if shared == nil && initErr == nil {
		shared, initErr, skip = setup()
	}
	if initErr != nil {
		if skip && !isCI(os.Getenv("CI")) {
			t.Skip("pgtest: " + initErr.Error())
		}
		t.Fatal("pgtest: " + initErr.Error())
	}
	return shared
}

// isCI reports whether the CI variable's value says this is a CI run.
func isCI(v string) bool {
	ci, _ := strconv.ParseBool(v)
	return ci
}

// setup connects to the external server or starts a cluster. skip says that
// err is about missing binaries.
func setup() (s *server, err error, skip bool) {
	if raw := os.Getenv(EnvURL); raw != "" {
		s, err := external(raw)
		return s, err, false
	}
	bin, err := findBinaries(os.Getenv("PATH"), "/usr/lib/postgresql")
	if err != nil {
		return nil, err, true
	}
	s, err = startCluster(bin)
	return s, err, false
}

// server is the Postgres that URL creates databases in.
type server struct {
	admin    *url.URL // the maintenance database, for CREATE/DROP DATABASE
	external bool

	// A throwaway cluster only. Fields below are guarded by mu.
	bin  string              // dir of initdb and postgres
	dir  string              // temp dir: data/, the socket, the log
	port int                 // the same across restarts
	cred *syscall.Credential // nil unless running as root
	proc *os.Process         // nil while stopped
	done chan error          // receives the server's exit
}

// external uses the server at raw.
func external(raw string) (*server, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return nil, fmt.Errorf("%s must be a postgres:// URL", EnvURL)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/postgres"
	}
	s := &server{admin: u, external: true}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	if err := s.exec(ctx, "SELECT 1"); err != nil {
		return nil, fmt.Errorf("connect to %s: %w", EnvURL, err)
	}
	return s, nil
}

// url is the URL of database name on s.
func (s *server) url(name string) string {
	u := *s.admin
	u.Path = "/" + name
	return u.String()
}

// exec runs one statement in the maintenance database.
func (s *server) exec(ctx context.Context, sql string) error {
	conn, err := pgx.Connect(ctx, s.admin.String())
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	_, err = conn.Exec(ctx, sql)
	return err
}

// binaries is what a cluster needs, found in one directory.
var binaries = []string{"initdb", "postgres"}

// findBinaries returns the directory holding the server binaries: the
// first PATH entry that has them all, else the highest version under root
// (root/<version>/bin, Debian's layout).
func findBinaries(path, root string) (string, error) {
	has := func(dir string) bool {
		for _, b := range binaries {
			fi, err := os.Stat(filepath.Join(dir, b))
			if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
				return false
			}
		}
		return true
	}
	for _, dir := range filepath.SplitList(path) {
		if dir != "" && has(dir) {
			return dir, nil
		}
	}
	entries, _ := os.ReadDir(root)
	var versions []string
	for _, e := range entries {
		if _, err := strconv.ParseFloat(e.Name(), 64); err == nil && has(filepath.Join(root, e.Name(), "bin")) {
			versions = append(versions, e.Name())
		}
	}
	if len(versions) == 0 {
		return "", errors.New(MissingMessage)
	}
	// Compare as numbers, part by part: 9.6 < 10 < 15.
	slices.SortFunc(versions, compareVersions)
	return filepath.Join(root, versions[len(versions)-1], "bin"), nil
}

// compareVersions orders "9.6" before "10" before "15".
func compareVersions(a, b string) int {
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(pa) || i < len(pb); i++ {
		var x, y int
		if i < len(pa) {
			x, _ = strconv.Atoi(pa[i])
		}
		if i < len(pb) {
			y, _ = strconv.Atoi(pb[i])
		}
		if x != y {
			return x - y
		}
	}
	return 0
}

// startCluster initialises a cluster in a new temp dir and starts it.
func startCluster(bin string) (s *server, err error) {
	cred, err := credential()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(tempBase(cred != nil), "sluice-pgtest-")
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			os.RemoveAll(dir)
		}
	}()
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, err
		}
	}
	s = &server{bin: bin, dir: dir, cred: cred}

	out, err := s.command("initdb", "-D", s.data(), "-U", "postgres", "--auth=trust",
		"-E", "UTF8", "--locale=C", "--no-sync").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("initdb: %w\n%s", err, out)
	}

	// A free port can be taken between finding it and binding it; try a
	// few before giving up.
	for attempt := 0; ; attempt++ {
		if s.port, err = freePort(); err != nil {
			return nil, err
		}
		s.admin = &url.URL{
			Scheme:   "postgres",
			User:     url.User("postgres"),
			Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)),
			Path:     "/postgres",
			RawQuery: "sslmode=disable",
		}
		if err = s.start(); err == nil || attempt == 2 {
			return s, err
		}
	}
}

// credential is who runs initdb and the server: nil (this process's user)
// unless this process is root, which Postgres refuses.
func credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 != nil || err2 != nil {
			continue
		}
		// Groups empty: drop root's supplementary groups too.
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), Groups: []uint32{}}, nil
	}
	return nil, errors.New("running as root, and there is neither a postgres nor a nobody user to run Postgres as")
}

// tempBase is where the cluster's dir goes: the usual temp dir, unless the
// server runs as another user who could not reach it.
func tempBase(otherUser bool) string {
	base := os.TempDir()
	if !otherUser {
		return base
	}
	for d := base; ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil || fi.Mode().Perm()&0o001 == 0 {
			return "/tmp"
		}
		if d == filepath.Dir(d) {
			return base
		}
	}
}

func (s *server) data() string { return filepath.Join(s.dir, "data") }

// command prepares a binary of the cluster to run as the cluster's user.
func (s *server) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(s.bin, name), args...)
	cmd.Dir = s.dir // the server's user may not be able to enter ours
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "PG") // PGDATA, PGPORT… would override ours
	})
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	return cmd
}

// freePort returns a port on 127.0.0.1 that nothing listens on right now.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// start runs the server as a child of this process and waits until it
// accepts connections. Caller holds mu (or owns s alone).
func (s *server) start() error {
	logPath := filepath.Join(s.dir, "postgres.log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logFile.Close() // the child has its own copy
	st, err := logFile.Stat()
	if err != nil {
		return err
	}
	logStart := st.Size() // errors show this start's lines only

	cmd := s.command("postgres", "-D", s.data(),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "port="+strconv.Itoa(s.port),
		"-c", "unix_socket_directories="+s.dir,
		// Durability is worthless for a throwaway cluster; speed is not.
		"-c", "fsync=off",
		"-c", "synchronous_commit=off",
		"-c", "full_page_writes=off",
		"-c", "max_connections=200",
	)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// SIGQUIT is Postgres' immediate shutdown: if this process dies, the
	// server follows instead of lingering.
	cmd.SysProcAttr.Pdeathsig = syscall.SIGQUIT

	// The parent-death signal fires when the *thread* that started the
	// child exits. Go may retire threads, so the child is started from a
	// goroutine locked to its thread for as long as the child lives.
	started := make(chan error, 1)
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread dies with the goroutine, after the child
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		done <- cmd.Wait()
	}()
	if err := <-started; err != nil {
		return fmt.Errorf("start postgres: %w", err)
	}
	s.proc, s.done = cmd.Process, done

	if err := s.waitReady(cmd.Process.Pid); err != nil {
		if s.proc != nil {
			s.kill()
		}
		return fmt.Errorf("%w\nserver log:\n%s", err, tail(logPath, logStart))
	}
	return nil
}

// waitReady waits, as pg_ctl -w does, until postmaster.pid says the server
// with this pid is ready for connections.
func (s *server) waitReady(pid int) error {
	deadline := time.NewTimer(startTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-s.done:
			s.proc = nil
			return fmt.Errorf("postgres exited before it was ready: %v", err)
		case <-deadline.C:
			return fmt.Errorf("postgres not ready after %v", startTimeout)
		case <-tick.C:
			if ready(filepath.Join(s.data(), "postmaster.pid"), pid) {
				return nil
			}
		}
	}
}

// ready reads a postmaster.pid: line 1 is the pid, line 8 the status.
func ready(path string, pid int) bool {
	b, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	lines := strings.Split(string(b), "\n")
	return len(lines) >= 8 && strings.TrimSpace(lines[0]) == strconv.Itoa(pid) &&
		strings.TrimSpace(lines[7]) == "ready"
}

// stop shuts the server down with sig (SIGINT: fast, SIGQUIT: immediate)
// and waits for it to exit, killing it if it takes too long.
func (s *server) stop(sig syscall.Signal) error {
	if s.proc == nil {
		return nil
	}
	if err := s.proc.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	timer := time.NewTimer(stopTimeout)
	defer timer.Stop()
	select {
	case <-s.done:
		s.proc = nil
		return nil
	case <-timer.C:
		s.kill()
		return fmt.Errorf("postgres did not stop within %v; killed", stopTimeout)
	}
}

// kill ends the server at once and waits for it.
func (s *server) kill() {
	s.proc.Kill()
	<-s.done
	s.proc = nil
}

// destroy stops the server at once and removes its files.
func (s *server) destroy() error {
	if s.external {
		return nil
	}
	err := s.stop(syscall.SIGQUIT)
	return errors.Join(err, os.RemoveAll(s.dir))
}

// tail returns the log written since offset, at most its last 40 lines.
func tail(path string, offset int64) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return err.Error()
	}
	var lines []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if n := len(lines); n > 40 {
		lines = lines[n-40:]
	}
	return strings.Join(lines, "\n")
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
