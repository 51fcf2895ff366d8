package configurator

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/pkg/history"
)

// dayRow is a day of history in JSON and YAML, rates rounded as the table
// shows them.
type dayRow struct {
	Day         string  `json:"day" yaml:"day"`
	PeakOffered float64 `json:"peak_offered" yaml:"peak_offered"`
	MeanOffered float64 `json:"mean_offered" yaml:"mean_offered"`
	MeanDropped float64 `json:"mean_dropped" yaml:"mean_dropped"`
	Minutes     int     `json:"minutes" yaml:"minutes"`
}

func (a *app) historyCommand() *cobra.Command {
	var (
		ndays = 28
		png   string
		out   format
	)
	cmd := &cobra.Command{
		Use:   "history callee/caller[/procedure]",
		Short: "a bucket's daily peaks, as a table and a sparkline",
		Long: `Prints a bucket's daily rollup for the last --days UTC days, today included:
peak and mean offered rate, mean dropped rate (rps) and coverage (minutes of the
day's 1440 with history), then the daily peaks as a sparkline (scaled from 0 to
the highest; a blank is a day without history) and the limit in force.
--png also writes a plot of daily peak and mean with the limit as a line.`,
		Example: `  configurator history checkout/web
  configurator history checkout/*/create-charge
  configurator history checkout/web --days 90 --png checkout-web.png`,
		Args: cobra.ExactArgs(1),
		RunE: a.withStore(func(cmd *cobra.Command, args []string, st history.Store) error {
			t, err := parseTarget(args[0], false)
			if err != nil {
				return err
			}
			if ndays < 1 {
				return fmt.Errorf("--days %d is below 1", ndays)
			}
			ctx := cmd.Context()
			to := startOfDay(a.clock()).Add(Day)
			from := to.AddDate(0, 0, -ndays)
			rows, err := st.DailyPeaks(ctx, t.filter(), from, to)
			if err != nil {
				return fmt.Errorf("read daily peaks: %w", err)
			}
			rows = slices.DeleteFunc(rows, func(r history.DailyPeak) bool { return !t.selects(r.Bucket) })
			if len(rows) == 0 {
				return fmt.Errorf("unknown bucket %s: no history in the last %d days (the controller writes history when run with --database-url; for a demo, history seed --synthetic 4w)", t, ndays)
			}
			lim, err := st.Limits(ctx)
			if err != nil {
				return fmt.Errorf("read limits: %w", err)
			}
			var limit *float64
			if l, ok := newLimitIndex(lim).inForce(t.Bucket); ok {
				limit = &l
			}

			days, peak, mean := dailySeries(rows, from, ndays)
			if png != "" {
				var buf bytes.Buffer
				if err := writePNG(&buf, fmt.Sprintf("%s: daily offered rate", t), days, peak, mean, limit); err != nil {
					return err
				}
				if err := os.WriteFile(png, buf.Bytes(), 0o644); err != nil {
					return fmt.Errorf("--png: %w", err)
				}
			}

			w := cmd.OutOrStdout()
			if out != formatTable {
				rs := make([]dayRow, len(rows))
				for i, r := range rows {
					rs[i] = dayRow{Day: r.Day.UTC().Format(time.DateOnly), PeakOffered: roundRate(r.PeakOffered),
						MeanOffered: roundRate(r.MeanOffered), MeanDropped: roundRate(r.MeanDropped), Minutes: r.Minutes}
				}
				return encode(w, out, rs)
			}
			tb := newTable(w, "DAY", "PEAK", "MEAN", "DROPPED", "COVERAGE")
			top, topDay := math.Inf(-1), time.Time{}
			for _, r := range rows {
				tb.row(r.Day.UTC().Format(time.DateOnly), formatRate(r.PeakOffered), formatRate(r.MeanOffered),
					formatRate(r.MeanDropped), fmt.Sprintf("%s (%d min)", formatPercent(float64(r.Minutes)/1440), r.Minutes))
				if r.PeakOffered > top {
					top, topDay = r.PeakOffered, r.Day
				}
			}
			if err := tb.flush(); err != nil {
				return err
			}
			fmt.Fprintf(w, "\n%s … %s  %s\n", days[0].Format("Jan 2"), days[len(days)-1].Format("Jan 2"), sparkline(peak))
			fmt.Fprintf(w, "peak %s rps on %s", formatRate(top), topDay.UTC().Format(time.DateOnly))
			switch {
			case limit != nil && top > 0:
				fmt.Fprintf(w, "; limit %s rps (%s of the peak)", formatRate(*limit), formatPercent(*limit/top))
			case limit != nil:
				fmt.Fprintf(w, "; limit %s rps", formatRate(*limit))
			default:
				fmt.Fprint(w, "; no limit")
			}
			fmt.Fprintln(w)
			if png != "" {
				fmt.Fprintf(w, "plot written to %s\n", png)
			}
			return nil
		}),
	}
	cmd.AddCommand(a.seedCommand())
	cmd.Flags().IntVar(&ndays, "days", ndays, "UTC days to show, today included")
	cmd.Flags().StringVar(&png, "png", "", "also write a plot to this PNG file")
	addOutput(cmd, &out)
	return cmd
}
