// Package cli gives every sluice binary the same configuration handling:
// defaults < config file < environment < flags, and the same logging flags.
//
// A binary declares one flag per field of its typed config, with the field's
// default as the flag's default. Apply then fills every flag that was not set
// on the command line from SLUICE_<BINARY>_<FLAG> or, failing that, from the
// config file, a flat YAML map of flag names to values. After Apply the
// binary runs its config's Validate, which names every bad field at once.
package cli

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"
)

// ConfigFlag is the flag that names the config file.
const ConfigFlag = "config"

// EnvName is the environment variable that sets flag for binary, e.g.
// SLUICE_CONTROLLER_TICK for the controller's --tick.
func EnvName(binary, flag string) string {
	r := strings.NewReplacer("-", "_", ".", "_")
	return "SLUICE_" + strings.ToUpper(r.Replace(binary)) + "_" + strings.ToUpper(r.Replace(flag))
}

// Apply fills unset flags of fs from the environment, then from the config
// file named by --config (or its environment variable). lookupEnv is
// os.LookupEnv outside tests.
func Apply(fs *pflag.FlagSet, binary string, lookupEnv func(string) (string, bool)) error {
	var errs []error
	fromEnv := map[string]bool{}
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Changed {
			return
		}
		v, ok := lookupEnv(EnvName(binary, f.Name))
		if !ok {
			return
		}
		if err := set(f, v); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", EnvName(binary, f.Name), err))
		}
		fromEnv[f.Name] = true
	})
	if len(errs) > 0 {
		return errors.Join(errs...)
	}

	cf := fs.Lookup(ConfigFlag)
	if cf == nil || cf.Value.String() == "" {
		return nil
	}
	path := cf.Value.String()
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read config: %w", err)
	}
	values, err := parseFile(data)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	for _, name := range slices.Sorted(maps.Keys(values)) {
		f := fs.Lookup(name)
		switch {
		case f == nil || name == ConfigFlag:
			errs = append(errs, fmt.Errorf("%s: unknown setting %q", path, name))
		case f.Changed || fromEnv[name]:
			// The command line and the environment win over the file.
		default:
			if err := setValue(f, values[name]); err != nil {
				errs = append(errs, fmt.Errorf("%s: %s: %w", path, name, err))
			}
		}
	}
	return errors.Join(errs...)
}

func parseFile(data []byte) (map[string]any, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var values map[string]any
	if err := dec.Decode(&values); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("decode config: %w", err)
	}
	return values, nil
}

func setValue(f *pflag.Flag, v any) error {
	if list, ok := v.([]any); ok {
		sv, ok := f.Value.(pflag.SliceValue)
		if !ok {
			return fmt.Errorf("a list is not a valid %s", f.Value.Type())
		}
		items := make([]string, len(list))
		for i, item := range list {
			if err := scalar(item); err != nil {
				return fmt.Errorf("item %d: %w", i, err)
			}
			items[i] = fmt.Sprint(item)
		}
		return sv.Replace(items)
	}
	if err := scalar(v); err != nil {
		return err
	}
	return set(f, fmt.Sprint(v))
}

// scalar refuses what fmt.Sprint would turn into a value nobody wrote: a
// key left empty (YAML null, "<nil>"), a mapping ("map[a:1]"), a nested
// list.
func scalar(v any) error {
	switch v.(type) {
	case nil:
		return errors.New("no value (YAML null): give one, or leave the setting out")
	case map[string]any, map[any]any:
		return errors.New("a mapping is not a value: the file is a flat map of settings")
	case []any:
		return errors.New("a list is not a valid list item")
	}
	return nil
}

// set replaces a flag's value; for list flags a comma-separated string
// replaces the default rather than adding to it.
func set(f *pflag.Flag, v string) error {
	if sv, ok := f.Value.(pflag.SliceValue); ok {
		var items []string
		if v != "" {
			items = strings.Split(v, ",")
		}
		return sv.Replace(items)
	}
	return f.Value.Set(v)
}

// Logging holds the logging flags every binary has.
type Logging struct {
	Level  string
	Format string
}

// AddFlags declares --log-level and --log-format, and --config.
func (l *Logging) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&l.Level, "log-level", "info", "least severe level logged: debug, info, warn or error")
	fs.StringVar(&l.Format, "log-format", "text", "log output: text (logfmt) or json")
	fs.String(ConfigFlag, "", "YAML file of flag-name: value settings; flags and SLUICE_* environment variables win over it")
}

// Logger builds the process's logger, writing to w.
func (l *Logging) Logger(w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(l.Level)); err != nil {
		return nil, fmt.Errorf("log-level: %q is not debug, info, warn or error", l.Level)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch l.Format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("log-format: %q is not text or json", l.Format)
}

// Start is what every binary does before anything else: it settles the
// configuration from flags, environment and file, checks it with validate,
// and builds the logger and a metrics registry that already holds the Go
// runtime and process collectors and sluice_build_info. validate runs after
// the environment and file were applied: pass a closure over the config,
// not a method value of a config struct, which would copy it before they
// were.
func Start(cmd *cobra.Command, binary string, l *Logging, validate func() error) (*slog.Logger, *prometheus.Registry, error) {
	if err := Apply(cmd.Flags(), binary, os.LookupEnv); err != nil {
		return nil, nil, err
	}
	if err := validate(); err != nil {
		return nil, nil, fmt.Errorf("invalid configuration:\n%w", err)
	}
	log, err := l.Logger(cmd.ErrOrStderr())
	if err != nil {
		return nil, nil, err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), BuildInfoCollector())
	return log, reg, nil
}
