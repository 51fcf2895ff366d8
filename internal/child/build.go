package child

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// Binaries names the binaries the end-to-end tests and live mode start.
var Binaries = []string{"controller", "aggregator", "sidecar"}

// Build compiles binaries (names of commands under cmd/, e.g. "sidecar",
// or paths of commands in the module, e.g. "internal/tools/loadrig") into
// dir with the go command on PATH, with the race detector if race. It
// must run inside the sluice module (go run ./cmd/sim, go test); ctx bounds
// the build.
func Build(ctx context.Context, dir string, race bool, binaries ...string) error {
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	if race {
		args = append(args, "-race")
	}
	for _, b := range binaries {
		if !strings.Contains(b, "/") {
			b = "cmd/" + b
		}
		args = append(args, "github.com/sluicehq/sluice/"+b)
	}
	cmd := exec.CommandContext(ctx, "go", args...) // go test puts its own go first on PATH
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// Check reports which of binaries dir lacks or holds as something other
// than an executable file.
func Check(dir string, binaries ...string) error {
	var errs []error
	for _, b := range binaries {
		path := filepath.Join(dir, b)
		st, err := os.Stat(path)
		if err != nil {
			errs = append(errs, err)
		} else if st.IsDir() || st.Mode()&0o111 == 0 {
			errs = append(errs, fmt.Errorf("%s is not an executable file", path))
		}
	}
	return errors.Join(errs...)
}

// Built is Binaries built once, on first use, into a new temporary
// directory: for a package's tests, whose TestMain calls Remove. The zero
// value builds without the race detector and without a bound.
type Built struct {
	Race    bool          // build with the race detector
	Timeout time.Duration // bound on the build; 0 for none
	// Extra are built beside Binaries, named as Build takes them.
	Extra []string

	once sync.Once
	dir  string // "" until the temporary directory exists
	err  error
}

// Dir builds the binaries if no call did before, and returns their
// directory, or the error of that one build.
func (b *Built) Dir() (string, error) {
	b.once.Do(func() {
		b.dir, b.err = os.MkdirTemp("", "sluice-bin-")
		if b.err != nil {
			return
		}
		ctx := context.Background()
		if b.Timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, b.Timeout)
			defer cancel()
		}
		b.err = Build(ctx, b.dir, b.Race, append(slices.Clone(Binaries), b.Extra...)...)
	})
	return b.dir, b.err
}

// Remove removes the directory, if Dir made one.
func (b *Built) Remove() error {
	if b.dir == "" {
		return nil
	}
	return os.RemoveAll(b.dir)
}

// Env is this process's environment without SLUICE_* variables, so that
// nothing set on the machine configures a child process, followed by
// extra ("KEY=value").
func Env(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SLUICE_") {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}
