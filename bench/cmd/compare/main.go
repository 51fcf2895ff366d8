// Command compare runs sluice side by side with Redis + Lua (bench/compare)
// and writes the tables and plots: `make bench-compare`.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/sluicehq/sluice/bench/compare"
)

func main() {
	quick := flag.Bool("quick", false, "short runs, to check the harness; the numbers are not worth quoting")
	parts := flag.String("parts", "", "comma-separated parts to run: decisions, proxies, surge, outage (default all)")
	out := flag.String("out", "bin/bench-compare", "directory for results.md (and the plots with -quick)")
	img := flag.String("img", "docs/img", "directory for bench-compare-accuracy.png and bench-compare-outage.png (ignored with -quick)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *quick, *parts, *out, *img); err != nil {
		fmt.Fprintln(os.Stderr, "bench-compare:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, quick bool, parts, out, img string) error {
	o := compare.Options{Quick: quick, Log: os.Stderr}
	if parts != "" {
		o.Parts = strings.Split(parts, ",")
	}
	if quick {
		img = out
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	r, err := compare.Run(ctx, o)
	if err != nil {
		return err
	}
	var md strings.Builder
	r.WriteMarkdown(&md)
	path := filepath.Join(out, "results.md")
	if err := os.WriteFile(path, []byte(md.String()), 0o644); err != nil {
		return err
	}
	fmt.Print(md.String())
	fmt.Fprintf(os.Stderr, "wrote %s\n", path)
	for _, p := range []struct {
		name  string
		ok    bool
		write func(f *os.File) error
	}{
		{"bench-compare-accuracy.png", len(r.SurgeRuns) > 0, func(f *os.File) error { return r.WriteAccuracyPNG(f) }},
		{"bench-compare-outage.png", len(r.OutageRuns) > 0, func(f *os.File) error { return r.WriteOutagePNG(f) }},
	} {
		if !p.ok {
			continue
		}
		path := filepath.Join(img, p.name)
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		err = p.write(f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
		fmt.Fprintf(os.Stderr, "wrote %s\n", path)
	}
	return nil
}
