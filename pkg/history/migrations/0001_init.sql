-- 0001_init: minute history and its daily rollup, limits, proposals, and the
-- append-only audit log.
--
-- Service names are compared byte-wise (COLLATE "C") so that Postgres sorts
-- them as Go does, whatever the database's locale. Rates are finite and never
-- negative: in Postgres 'NaN' sorts above 'Infinity', so "< 'Infinity'" also
-- refuses NaN.

-- Every bucket that has load history, numbered: the history tables key on the
-- number, which makes their rows and indexes half as wide and ingest about half
-- as fast again as with the names. Rows are never deleted or changed, so a
-- writer may cache the numbers for as long as it lives.
CREATE TABLE buckets (
    id     integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    callee text COLLATE "C" NOT NULL,
    caller text COLLATE "C" NOT NULL,
    UNIQUE (callee, caller)
);

-- One row per bucket per minute. Partitioned by UTC day: the store creates a
-- day's partition when it first writes into it (minute_load_pYYYYMMDD), and
-- retention drops whole partitions instead of deleting rows. bucket has no
-- foreign key: it would cost a lookup per row, and buckets are never deleted.
CREATE TABLE minute_load (
    bucket       integer NOT NULL,
    minute       timestamptz NOT NULL,
    peak_offered double precision NOT NULL,
    mean_offered double precision NOT NULL,
    mean_dropped double precision NOT NULL,
    PRIMARY KEY (bucket, minute),
    CHECK (0 <= mean_offered AND mean_offered <= peak_offered AND peak_offered < 'Infinity'),
    CHECK (0 <= mean_dropped AND mean_dropped < 'Infinity')
) PARTITION BY RANGE (minute);

-- The rollup of each bucket's minutes per UTC day, maintained as minutes are
-- written (only from rows actually inserted, so rewrites never double count).
-- Means are kept as sums so that later minutes can be added; the mean is
-- sum / minutes.
CREATE TABLE daily_load (
    bucket           integer NOT NULL,
    day              date NOT NULL,
    peak_offered     double precision NOT NULL,
    sum_mean_offered double precision NOT NULL,
    sum_mean_dropped double precision NOT NULL,
    minutes          integer NOT NULL CHECK (minutes BETWEEN 1 AND 1440),
    PRIMARY KEY (bucket, day)
) WITH (fillfactor = 70);
-- Today's rows are updated with every batch. Only the key is indexed and the
-- fillfactor leaves room on each page, so those updates stay HOT: no new
-- index entries. (An index covering the other columns would make DailyPeaks
-- an index-only scan, but would end HOT updates.)

-- A callee's own settings. NULL rates mean none.
CREATE TABLE service_limits (
    callee        text COLLATE "C" PRIMARY KEY,
    default_limit double precision CHECK (default_limit >= 0 AND default_limit < 'Infinity'),
    capacity      double precision CHECK (capacity >= 0 AND capacity < 'Infinity'),
    mode          text NOT NULL CHECK (mode IN ('enforce', 'shadow')),
    fail_mode     text NOT NULL CHECK (fail_mode IN ('open', 'hold', 'local')),
    updated_by    text NOT NULL,
    reason        text NOT NULL,
    updated_at    timestamptz NOT NULL
);

CREATE TABLE bucket_limits (
    callee     text COLLATE "C" NOT NULL,
    caller     text COLLATE "C" NOT NULL,
    limit_rps  double precision NOT NULL CHECK (limit_rps >= 0 AND limit_rps < 'Infinity'),
    mode       text NOT NULL CHECK (mode IN ('enforce', 'shadow')),
    source     text NOT NULL CHECK (source IN ('manual', 'derived')),
    updated_by text NOT NULL,
    reason     text NOT NULL,
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (callee, caller)
);

CREATE TABLE proposals (
    id            bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    callee        text COLLATE "C" NOT NULL,
    caller        text COLLATE "C" NOT NULL,
    current_limit double precision CHECK (current_limit >= 0 AND current_limit < 'Infinity'),
    proposed      double precision NOT NULL CHECK (proposed >= 0 AND proposed < 'Infinity'),
    peak_lookback double precision NOT NULL CHECK (peak_lookback >= 0 AND peak_lookback < 'Infinity'),
    peak_recent   double precision NOT NULL CHECK (peak_recent >= 0 AND peak_recent < 'Infinity'),
    flags         text[] NOT NULL DEFAULT '{}',
    status        text NOT NULL CHECK (status IN ('pending', 'approved', 'rejected', 'superseded')),
    created_by    text NOT NULL,
    created_at    timestamptz NOT NULL,
    decided_by    text NOT NULL DEFAULT '',
    decided_at    timestamptz,
    reason        text NOT NULL DEFAULT '',
    CHECK ((status = 'pending') = (decided_at IS NULL))
);
-- At most one pending proposal per bucket, whatever the writers do.
CREATE UNIQUE INDEX proposals_one_pending ON proposals (callee, caller) WHERE status = 'pending';
CREATE INDEX proposals_bucket ON proposals (callee, caller, id);

-- Every change, forever: rows are inserted, never updated or deleted.
CREATE TABLE audit_log (
    id        bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at        timestamptz NOT NULL,
    actor     text NOT NULL CHECK (actor <> ''),
    action    text NOT NULL,
    callee    text COLLATE "C" NOT NULL,
    caller    text COLLATE "C" NOT NULL DEFAULT '', -- '' for a service-level change
    old_value text NOT NULL DEFAULT '',
    new_value text NOT NULL DEFAULT '',
    reason    text NOT NULL CHECK (reason <> '')
);
CREATE INDEX audit_log_at ON audit_log (at);

CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit_log is append-only: % refused', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$;
CREATE TRIGGER audit_log_no_update_delete BEFORE UPDATE OR DELETE ON audit_log
    FOR EACH ROW EXECUTE FUNCTION audit_log_append_only();
CREATE TRIGGER audit_log_no_truncate BEFORE TRUNCATE ON audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION audit_log_append_only();
