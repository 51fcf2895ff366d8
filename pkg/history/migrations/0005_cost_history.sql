-- 0005_cost_history: the cost load of a callee counting cost (issue #16).
--
-- A minute row of such a callee's bucket carries, beside its request rates,
-- its offered and admitted cost rates in cost units per second (peak of the
-- minute's ticks and mean over them, as the request rates are); a row of a
-- callee counting requests has them NULL, all four or none. The daily
-- rollup keeps their peaks, the sums of their means, and how many of the
-- day's minutes had them (cost_minutes): a callee may switch units in a day.
-- New columns are NULL or have a constant default: no row or partition is
-- rewritten.
ALTER TABLE minute_load
    ADD COLUMN peak_offered_cost  double precision,
    ADD COLUMN mean_offered_cost  double precision,
    ADD COLUMN peak_admitted_cost double precision,
    ADD COLUMN mean_admitted_cost double precision,
    ADD CONSTRAINT minute_load_cost_whole CHECK (
        (peak_offered_cost IS NULL) = (mean_offered_cost IS NULL) AND
        (peak_offered_cost IS NULL) = (peak_admitted_cost IS NULL) AND
        (peak_offered_cost IS NULL) = (mean_admitted_cost IS NULL)),
    ADD CONSTRAINT minute_load_cost_rates CHECK (
        0 <= mean_offered_cost AND mean_offered_cost <= peak_offered_cost AND peak_offered_cost < 'Infinity' AND
        0 <= mean_admitted_cost AND mean_admitted_cost <= peak_admitted_cost AND peak_admitted_cost < 'Infinity');

ALTER TABLE daily_load
    ADD COLUMN peak_offered_cost      double precision,
    ADD COLUMN sum_mean_offered_cost  double precision NOT NULL DEFAULT 0,
    ADD COLUMN peak_admitted_cost     double precision,
    ADD COLUMN sum_mean_admitted_cost double precision NOT NULL DEFAULT 0,
    ADD COLUMN cost_minutes           integer NOT NULL DEFAULT 0 CHECK (cost_minutes BETWEEN 0 AND 1440);
