package history

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ---- bucket numbers ----

// The history tables key on buckets.id. Numbers are never changed or
// reused, so once this process has seen one it keeps it.

// bucketIDs fills ids[i] with the number of rows[i]'s bucket, numbering
// buckets new to the database.
func (p *Postgres) bucketIDs(ctx context.Context, rows []MinuteRow, ids []int32) error {
	var missing map[Bucket]bool
	p.bucketMu.RLock()
	for i := range rows {
		id, ok := p.ids[rows[i].Bucket]
		if !ok {
			if missing == nil {
				missing = map[Bucket]bool{}
			}
			missing[rows[i].Bucket] = true
		}
		ids[i] = id // 0 until found: identity numbers start at 1
	}
	p.bucketMu.RUnlock()
	if len(missing) == 0 {
		return nil
	}
	bs := make([]Bucket, 0, len(missing))
	for b := range missing {
		bs = append(bs, b)
	}
	slices.SortFunc(bs, compareBuckets) // inserted in key order: concurrent writers can not deadlock
	if err := p.loadBuckets(ctx, bs); err != nil {
		return err
	}
	callees, callers, procs := splitBuckets(p.unknown(bs))
	if len(callees) > 0 {
		// Only the buckets still unknown: ON CONFLICT DO NOTHING would use
		// up an identity number for every bucket that exists already.
		if _, err := p.pool.Exec(ctx, `
			INSERT INTO buckets (callee, caller, procedure)
			SELECT * FROM unnest($1::text[], $2::text[], $3::text[])
			ON CONFLICT (callee, caller, procedure) DO NOTHING`, callees, callers, procs); err != nil {
			return fmt.Errorf("number buckets: %w", err)
		}
		if err := p.loadBuckets(ctx, bs); err != nil {
			return err
		}
	}
	p.bucketMu.RLock()
	defer p.bucketMu.RUnlock()
	for i := range rows {
		if ids[i] == 0 {
			if ids[i] = p.ids[rows[i].Bucket]; ids[i] == 0 {
				return fmt.Errorf("number buckets: %s has no number", rows[i].Path())
			}
		}
	}
	return nil
}

// unknown returns the buckets of bs this process has no number for.
func (p *Postgres) unknown(bs []Bucket) []Bucket {
	p.bucketMu.RLock()
	defer p.bucketMu.RUnlock()
	var out []Bucket
	for _, b := range bs {
		if _, ok := p.ids[b]; !ok {
			out = append(out, b)
		}
	}
	return out
}

// loadBuckets learns the numbers of those buckets of bs that have one.
func (p *Postgres) loadBuckets(ctx context.Context, bs []Bucket) error {
	callees, callers, procs := splitBuckets(bs)
	return p.learnBuckets(ctx, `SELECT id, callee, caller, procedure FROM buckets
		WHERE (callee, caller, procedure) IN (SELECT * FROM unnest($1::text[], $2::text[], $3::text[]))`, callees, callers, procs)
}

// learnBuckets runs a query of (id, callee, caller, procedure) and
// remembers them.
func (p *Postgres) learnBuckets(ctx context.Context, sql string, args ...any) error {
	rows, err := p.pool.Query(ctx, sql, args...)
	if err != nil {
		return fmt.Errorf("read buckets: %w", err)
	}
	var (
		id int32
		b  Bucket
	)
	p.bucketMu.Lock()
	defer p.bucketMu.Unlock()
	_, err = pgx.ForEachRow(rows, []any{&id, &b.Callee, &b.Caller, &b.Procedure}, func() error {
		p.ids[b], p.names[id] = id, b
		return nil
	})
	if err != nil {
		return fmt.Errorf("read buckets: %w", err)
	}
	return nil
}

// bucketID returns b's number, or false when b has no history.
func (p *Postgres) bucketID(ctx context.Context, b Bucket) (int32, bool, error) {
	p.bucketMu.RLock()
	id, ok := p.ids[b]
	p.bucketMu.RUnlock()
	if ok {
		return id, true, nil
	}
	if err := p.loadBuckets(ctx, []Bucket{b}); err != nil {
		return 0, false, err
	}
	p.bucketMu.RLock()
	defer p.bucketMu.RUnlock()
	id, ok = p.ids[b]
	return id, ok, nil
}

// bucketNames returns the buckets of ids.
func (p *Postgres) bucketNames(ctx context.Context, ids []int32) (map[int32]Bucket, error) {
	var missing []int32
	p.bucketMu.RLock()
	for _, id := range ids {
		if _, ok := p.names[id]; !ok {
			missing = append(missing, id)
		}
	}
	p.bucketMu.RUnlock()
	if len(missing) > 0 {
		if err := p.learnBuckets(ctx, `SELECT id, callee, caller, procedure FROM buckets WHERE id = ANY($1)`, missing); err != nil {
			return nil, err
		}
	}
	p.bucketMu.RLock()
	defer p.bucketMu.RUnlock()
	out := make(map[int32]Bucket, len(ids))
	for _, id := range ids {
		b, ok := p.names[id]
		if !ok {
			return nil, fmt.Errorf("read buckets: no bucket numbered %d", id)
		}
		out[id] = b
	}
	return out, nil
}

// ---- minute rows ----

// minuteRow is a MinuteRow as minute_load stores it.
type minuteRow struct {
	bucket              int32
	day                 int64 // Unix seconds of the UTC midnight starting minute
	minute              time.Time
	peak, mean, dropped float64
	cost                *CostLoad // nil: NULL
	ord                 int64     // position in the caller's batch: the first of a repeated key wins
}

func compareMinuteRows(a, b minuteRow) int {
	return cmp.Or(cmp.Compare(a.bucket, b.bucket), a.minute.Compare(b.minute), cmp.Compare(a.ord, b.ord))
}

// WriteMinutes implements LoadStore.
//
// The usual batch holds only new minutes, and takes the fast path: one
// COPY straight into minute_load, and the daily rollup of the batch,
// summed here, upserted in one statement. A batch that repeats a stored
// minute (a retry, an overlap) makes that COPY fail on the primary key; it
// then takes the careful path, in the same transaction: COPY into a
// temporary staging table, INSERT … ON CONFLICT DO NOTHING, and the rollup
// of only the rows actually inserted, so a rewrite never double counts.
func (p *Postgres) WriteMinutes(ctx context.Context, rows []MinuteRow) error {
	if err := checkMinutes(rows); err != nil {
		return err
	}
	if len(rows) == 0 {
		return nil
	}
	ids := make([]int32, len(rows))
	if err := p.bucketIDs(ctx, rows, ids); err != nil {
		return fmt.Errorf("write minutes: %w", err)
	}
	enc := make([]minuteRow, len(rows))
	days := map[int64]bool{}
	for i, r := range rows {
		day := dayOf(r.Minute).Unix()
		days[day] = true
		enc[i] = minuteRow{bucket: ids[i], day: day, minute: r.Minute, peak: r.PeakOffered, mean: r.MeanOffered, dropped: r.MeanDropped, cost: r.Cost, ord: int64(i)}
	}
	// Writers insert in key order, so that two writing overlapping rows
	// wait for each other instead of deadlocking; and the rollup is then
	// one pass over runs of a bucket's day.
	if !slices.IsSortedFunc(enc, compareMinuteRows) {
		slices.SortFunc(enc, compareMinuteRows)
	}
	for attempt := 0; ; attempt++ {
		if err := p.ensurePartitions(ctx, days); err != nil {
			return fmt.Errorf("write minutes: %w", err)
		}
		err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error { return writeMinutes(ctx, tx, enc) })
		if attempt == 0 && isNoPartition(err) {
			// Another process's Retain dropped a partition this process
			// thought it had: find out again, once.
			p.forgetPartitions()
			continue
		}
		if err != nil {
			return fmt.Errorf("write minutes: %w", err)
		}
		return nil
	}
}

var minuteColumns = []string{"bucket", "minute", "peak_offered", "mean_offered", "mean_dropped",
	"peak_offered_cost", "mean_offered_cost", "peak_admitted_cost", "mean_admitted_cost"}

func writeMinutes(ctx context.Context, tx pgx.Tx, rows []minuteRow) error {
	// The fast path, in a savepoint: a duplicate key undoes only it.
	sp, err := tx.Begin(ctx)
	if err != nil {
		return err
	}
	_, err = sp.CopyFrom(ctx, pgx.Identifier{"minute_load"}, minuteColumns, &minuteSource{rows: rows})
	if err == nil {
		if err := sp.Commit(ctx); err != nil {
			return err
		}
		return addToRollup(ctx, tx, rows)
	}
	if !isUniqueViolation(err) {
		return fmt.Errorf("copy: %w", err)
	}
	if err := sp.Rollback(ctx); err != nil {
		return err
	}
	return mergeMinutes(ctx, tx, rows)
}

// addToRollup adds rows, all newly inserted and sorted, to the daily rollup.
func addToRollup(ctx context.Context, tx pgx.Tx, rows []minuteRow) error {
	var (
		buckets               []int32
		days                  []time.Time
		peaks, sumOff, sumDrp []float64
		minutes               []int32
		// the cost rollup: peaks NULL while no minute has a cost load
		cPeakOff, cPeakAdm []*float64
		cSumOff, cSumAdm   []float64
		cMinutes           []int32
	)
	for i, r := range rows {
		if i == 0 || r.bucket != rows[i-1].bucket || r.day != rows[i-1].day {
			buckets, days, minutes = append(buckets, r.bucket), append(days, time.Unix(r.day, 0).UTC()), append(minutes, 0)
			peaks, sumOff, sumDrp = append(peaks, r.peak), append(sumOff, 0), append(sumDrp, 0)
			cPeakOff, cPeakAdm, cSumOff, cSumAdm, cMinutes = append(cPeakOff, nil), append(cPeakAdm, nil), append(cSumOff, 0), append(cSumAdm, 0), append(cMinutes, 0)
		}
		n := len(buckets) - 1
		peaks[n] = max(peaks[n], r.peak)
		sumOff[n] += r.mean
		sumDrp[n] += r.dropped
		minutes[n]++
		if c := r.cost; c != nil {
			if cPeakOff[n] == nil {
				cPeakOff[n], cPeakAdm[n] = new(c.PeakOffered), new(c.PeakAdmitted)
			}
			*cPeakOff[n], *cPeakAdm[n] = max(*cPeakOff[n], c.PeakOffered), max(*cPeakAdm[n], c.PeakAdmitted)
			cSumOff[n] += c.MeanOffered
			cSumAdm[n] += c.MeanAdmitted
			cMinutes[n]++
		}
	}
	_, err := tx.Exec(ctx, `
		INSERT INTO daily_load AS d (bucket, day, peak_offered, sum_mean_offered, sum_mean_dropped, minutes,
			peak_offered_cost, sum_mean_offered_cost, peak_admitted_cost, sum_mean_admitted_cost, cost_minutes)
		SELECT * FROM unnest($1::int4[], $2::date[], $3::float8[], $4::float8[], $5::float8[], $6::int4[],
			$7::float8[], $8::float8[], $9::float8[], $10::float8[], $11::int4[])
		`+rollupConflict, buckets, days, peaks, sumOff, sumDrp, minutes, cPeakOff, cSumOff, cPeakAdm, cSumAdm, cMinutes)
	if err != nil {
		return fmt.Errorf("rollup: %w", err)
	}
	return nil
}

// rollupConflict adds a batch's rollup of a day to what the day has.
const rollupConflict = `ON CONFLICT (bucket, day) DO UPDATE SET
	peak_offered = greatest(d.peak_offered, excluded.peak_offered),
	sum_mean_offered = d.sum_mean_offered + excluded.sum_mean_offered,
	sum_mean_dropped = d.sum_mean_dropped + excluded.sum_mean_dropped,
	minutes = d.minutes + excluded.minutes,
	peak_offered_cost = greatest(d.peak_offered_cost, excluded.peak_offered_cost),
	sum_mean_offered_cost = d.sum_mean_offered_cost + excluded.sum_mean_offered_cost,
	peak_admitted_cost = greatest(d.peak_admitted_cost, excluded.peak_admitted_cost),
	sum_mean_admitted_cost = d.sum_mean_admitted_cost + excluded.sum_mean_admitted_cost,
	cost_minutes = d.cost_minutes + excluded.cost_minutes`

// stageSQL makes the staging table. ON COMMIT DROP: it lives for one
// write, so a pooled connection carries nothing over to the next user.
const stageSQL = `CREATE TEMP TABLE minute_stage (
	ord          bigint,
	bucket       integer,
	minute       timestamptz,
	peak_offered double precision,
	mean_offered double precision,
	mean_dropped double precision,
	peak_offered_cost  double precision,
	mean_offered_cost  double precision,
	peak_admitted_cost double precision,
	mean_admitted_cost double precision
) ON COMMIT DROP`

// mergeSQL moves the staged rows in, in key order, the first staged row of
// a repeated key first, and adds what it inserted to the daily rollup.
const mergeSQL = `WITH inserted AS (
	INSERT INTO minute_load (bucket, minute, peak_offered, mean_offered, mean_dropped,
		peak_offered_cost, mean_offered_cost, peak_admitted_cost, mean_admitted_cost)
	SELECT bucket, minute, peak_offered, mean_offered, mean_dropped,
		peak_offered_cost, mean_offered_cost, peak_admitted_cost, mean_admitted_cost
	FROM minute_stage
	ORDER BY bucket, minute, ord
	ON CONFLICT (bucket, minute) DO NOTHING
	RETURNING bucket, minute, peak_offered, mean_offered, mean_dropped,
		peak_offered_cost, mean_offered_cost, peak_admitted_cost, mean_admitted_cost
)
INSERT INTO daily_load AS d (bucket, day, peak_offered, sum_mean_offered, sum_mean_dropped, minutes,
	peak_offered_cost, sum_mean_offered_cost, peak_admitted_cost, sum_mean_admitted_cost, cost_minutes)
SELECT bucket, (minute AT TIME ZONE 'UTC')::date,
	max(peak_offered), sum(mean_offered), sum(mean_dropped), count(*),
	max(peak_offered_cost), coalesce(sum(mean_offered_cost), 0),
	max(peak_admitted_cost), coalesce(sum(mean_admitted_cost), 0), count(peak_offered_cost)
FROM inserted
GROUP BY 1, 2
ORDER BY 1, 2
` + rollupConflict

// mergeMinutes is the careful path, for a batch that repeats stored rows.
func mergeMinutes(ctx context.Context, tx pgx.Tx, rows []minuteRow) error {
	if _, err := tx.Exec(ctx, stageSQL); err != nil {
		return fmt.Errorf("create staging table: %w", err)
	}
	src := &minuteSource{rows: rows, ord: true}
	if _, err := tx.CopyFrom(ctx, pgx.Identifier{"minute_stage"}, append([]string{"ord"}, minuteColumns...), src); err != nil {
		return fmt.Errorf("copy to staging: %w", err)
	}
	if _, err := tx.Exec(ctx, mergeSQL); err != nil {
		return fmt.Errorf("merge: %w", err)
	}
	return nil
}

// minuteSource feeds rows to COPY, with their position first when ord is
// set. CopyFrom encodes each row before asking for the next, so one values
// array serves them all.
type minuteSource struct {
	rows []minuteRow
	ord  bool
	i    int
	vals [10]any
}

func (s *minuteSource) Next() bool { s.i++; return s.i <= len(s.rows) }
func (s *minuteSource) Err() error { return nil }
func (s *minuteSource) Values() ([]any, error) {
	r := &s.rows[s.i-1]
	s.vals = [10]any{r.ord, r.bucket, r.minute, r.peak, r.mean, r.dropped, nil, nil, nil, nil}
	if c := r.cost; c != nil {
		s.vals[6], s.vals[7], s.vals[8], s.vals[9] = c.PeakOffered, c.MeanOffered, c.PeakAdmitted, c.MeanAdmitted
	}
	if s.ord {
		return s.vals[:], nil
	}
	return s.vals[1:], nil
}

func isUniqueViolation(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23505"
}

// isNoPartition reports the error of a row that has no partition to go to.
func isNoPartition(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23514" && strings.Contains(pgErr.Message, "no partition")
}

// ---- partitions ----

// partitionName is the minute_load partition of a UTC day.
func partitionName(day time.Time) string { return "minute_load_p" + day.UTC().Format("20060102") }

// partitionDay parses a name partitionName made.
func partitionDay(name string) (time.Time, bool) {
	s, ok := strings.CutPrefix(name, "minute_load_p")
	if !ok || len(s) != 8 {
		return time.Time{}, false
	}
	d, err := time.Parse("20060102", s)
	return d, err == nil
}

// ensurePartitions creates the partitions of days that this process does
// not know to exist. It runs in a transaction of its own, before the write:
// creating a partition locks the parent table, and that lock should not be
// held while the batch is written.
func (p *Postgres) ensurePartitions(ctx context.Context, days map[int64]bool) error {
	p.partMu.Lock()
	var missing []time.Time
	for d := range days {
		if !p.parts[d] {
			missing = append(missing, time.Unix(d, 0).UTC())
		}
	}
	p.partMu.Unlock()
	if len(missing) == 0 {
		return nil
	}
	slices.SortFunc(missing, time.Time.Compare)
	err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		// Two sessions creating the same partition at once can fail even
		// with IF NOT EXISTS; the lock makes them take turns.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, $2)`, lockNamespace, lockPartitions); err != nil {
			return err
		}
		for _, d := range missing {
			sql := fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s PARTITION OF minute_load FOR VALUES FROM ('%s') TO ('%s')`,
				pgx.Identifier{partitionName(d)}.Sanitize(),
				d.Format("2006-01-02 15:04:05+00"), d.AddDate(0, 0, 1).Format("2006-01-02 15:04:05+00"))
			if _, err := tx.Exec(ctx, sql); err != nil {
				return fmt.Errorf("create partition %s: %w", partitionName(d), err)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	p.partMu.Lock()
	for _, d := range missing {
		p.parts[d.Unix()] = true
	}
	p.partMu.Unlock()
	return nil
}

func (p *Postgres) forgetPartitions() {
	p.partMu.Lock()
	clear(p.parts)
	p.partMu.Unlock()
}

// ---- reads ----

// Minutes implements LoadStore. It scans by hand, not by reflection: it is
// what a backtest reads, 40,320 rows for one bucket over 4 weeks.
func (p *Postgres) Minutes(ctx context.Context, b Bucket, from, to time.Time) ([]MinuteRow, error) {
	if err := checkBucket("bucket.", b); err != nil {
		return nil, err
	}
	id, ok, err := p.bucketID(ctx, b)
	if err != nil || !ok {
		return nil, err
	}
	rows, err := p.pool.Query(ctx, `
		SELECT minute, peak_offered, mean_offered, mean_dropped,
			peak_offered_cost, mean_offered_cost, peak_admitted_cost, mean_admitted_cost FROM minute_load
		WHERE bucket = $1 AND minute >= $2 AND minute < $3
		ORDER BY minute`, id, from, to)
	if err != nil {
		return nil, fmt.Errorf("read minutes: %w", err)
	}
	var (
		out                []MinuteRow
		r                  = MinuteRow{Bucket: b}
		cpo, cmo, cpa, cma *float64
	)
	_, err = pgx.ForEachRow(rows, []any{&r.Minute, &r.PeakOffered, &r.MeanOffered, &r.MeanDropped, &cpo, &cmo, &cpa, &cma}, func() error {
		r.Cost = nil
		if cpo != nil && cmo != nil && cpa != nil && cma != nil { // all or none: minute_load_cost_whole
			r.Cost = &CostLoad{PeakOffered: *cpo, MeanOffered: *cmo, PeakAdmitted: *cpa, MeanAdmitted: *cma}
		}
		out = append(out, r)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read minutes: %w", err)
	}
	return out, nil
}

// DailyPeaks implements LoadStore. It is the configurator's big read (10k
// buckets × 28 days): rows come back by bucket number, with no names, and
// are put in name order here, a bucket at a time.
func (p *Postgres) DailyPeaks(ctx context.Context, f Filter, from, to time.Time) ([]DailyPeak, error) {
	if err := checkFilter(f); err != nil {
		return nil, err
	}
	sql, args := `
		SELECT bucket, day, peak_offered, sum_mean_offered, sum_mean_dropped, minutes,
			coalesce(peak_offered_cost, 0), sum_mean_offered_cost, coalesce(peak_admitted_cost, 0), sum_mean_admitted_cost, cost_minutes
		FROM daily_load WHERE day >= $1 AND day < $2`, []any{ceilDay(from), ceilDay(to)}
	if f != (Filter{}) {
		var sub string
		sub, args = filterSQL(`SELECT id FROM buckets WHERE true`, args, f)
		sql += ` AND bucket = ANY(ARRAY(` + sub + `))`
	}
	rows, err := p.pool.Query(ctx, sql+` ORDER BY bucket, day`, args...)
	if err != nil {
		return nil, fmt.Errorf("read daily peaks: %w", err)
	}
	type run struct {
		bucket     int32
		start, end int // of the bucket's rows in got
	}
	var (
		got            []DailyPeak
		runs           []run
		id             int32
		d              DailyPeak
		sumOff, sumDrp float64
		c              CostLoad // peaks, then sums of means
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &d.Day, &d.PeakOffered, &sumOff, &sumDrp, &d.Minutes,
		&c.PeakOffered, &c.MeanOffered, &c.PeakAdmitted, &c.MeanAdmitted, &d.CostMinutes}, func() error {
		d.MeanOffered, d.MeanDropped = sumOff/float64(d.Minutes), sumDrp/float64(d.Minutes)
		d.Cost = nil
		if n := float64(d.CostMinutes); n > 0 {
			d.Cost = &CostLoad{PeakOffered: c.PeakOffered, MeanOffered: c.MeanOffered / n, PeakAdmitted: c.PeakAdmitted, MeanAdmitted: c.MeanAdmitted / n}
		}
		if len(runs) == 0 || runs[len(runs)-1].bucket != id {
			runs = append(runs, run{bucket: id, start: len(got)})
		}
		got = append(got, d)
		runs[len(runs)-1].end = len(got)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read daily peaks: %w", err)
	}
	if len(got) == 0 {
		return nil, nil
	}
	ids := make([]int32, len(runs))
	for i, r := range runs {
		ids[i] = r.bucket
	}
	names, err := p.bucketNames(ctx, ids)
	if err != nil {
		return nil, fmt.Errorf("read daily peaks: %w", err)
	}
	slices.SortFunc(runs, func(a, b run) int { return compareBuckets(names[a.bucket], names[b.bucket]) })
	out := make([]DailyPeak, 0, len(got))
	for _, r := range runs {
		for _, d := range got[r.start:r.end] {
			d.Bucket = names[r.bucket]
			out = append(out, d)
		}
	}
	return out, nil
}

// Retain implements LoadStore. Bucket numbers stay: they are few, and a
// bucket may come back.
func (p *Postgres) Retain(ctx context.Context, before time.Time) (int, error) {
	cut := dayOf(before)
	var dropped []time.Time
	err := pgx.BeginFunc(ctx, p.pool, func(tx pgx.Tx) error {
		dropped = dropped[:0]
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1, $2)`, lockNamespace, lockPartitions); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, `
			SELECT c.relname::text FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
			WHERE i.inhparent = 'minute_load'::regclass`)
		if err != nil {
			return err
		}
		parts, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		for _, name := range parts {
			day, ok := partitionDay(name)
			if !ok || !day.Before(cut) {
				continue // not one of ours, or not old enough
			}
			if _, err := tx.Exec(ctx, `DROP TABLE `+pgx.Identifier{name}.Sanitize()); err != nil {
				return fmt.Errorf("drop partition %s: %w", name, err)
			}
			dropped = append(dropped, day)
		}
		_, err = tx.Exec(ctx, `DELETE FROM daily_load WHERE day < $1`, cut)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("retain: %w", err)
	}
	p.partMu.Lock()
	for _, d := range dropped {
		delete(p.parts, d.Unix())
	}
	p.partMu.Unlock()
	return len(dropped), nil
}
