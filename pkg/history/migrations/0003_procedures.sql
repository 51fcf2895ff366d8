-- 0003_procedures: the bucket key's third part, the procedure (issue #14).
--
-- Every table that names a bucket gains a procedure column, '' for the rows
-- it has: a (callee, caller) bucket of a callee that declares no procedures,
-- exactly what they meant before. A callee that declares procedures has
-- leaves (callee, caller, procedure) and, with caller '*', each procedure's
-- own level: its capacity in bucket_limits, the sum of its leaves' load in
-- the history. (callee, caller, '') stays the caller's limit, across the
-- callee's procedures when it declares some.
--
-- minute_load and daily_load key on buckets.id, so they keep their rows and
-- their shape: only buckets learns the procedure, and no partition is
-- rewritten.
--
-- Procedures are names.CheckProcedure's (a gRPC full method "/pkg.Svc/M" is
-- one), compared byte-wise like service names.

ALTER TABLE buckets ADD COLUMN procedure text COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE buckets DROP CONSTRAINT buckets_callee_caller_key;
ALTER TABLE buckets ADD CONSTRAINT buckets_callee_caller_procedure_key UNIQUE (callee, caller, procedure);
-- '*' is no service name: it stands for every caller of a procedure only.
ALTER TABLE buckets ADD CONSTRAINT buckets_any_caller_has_procedure CHECK (caller <> '*' OR procedure <> '');

ALTER TABLE bucket_limits ADD COLUMN procedure text COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE bucket_limits DROP CONSTRAINT bucket_limits_pkey;
ALTER TABLE bucket_limits ADD PRIMARY KEY (callee, caller, procedure);
ALTER TABLE bucket_limits ADD CONSTRAINT bucket_limits_any_caller_has_procedure CHECK (caller <> '*' OR procedure <> '');

ALTER TABLE proposals ADD COLUMN procedure text COLLATE "C" NOT NULL DEFAULT '';
DROP INDEX proposals_one_pending;
DROP INDEX proposals_bucket;
CREATE UNIQUE INDEX proposals_one_pending ON proposals (callee, caller, procedure) WHERE status = 'pending';
CREATE INDEX proposals_bucket ON proposals (callee, caller, procedure, id);

-- A new column with a constant default rewrites no row, so the append-only
-- triggers do not fire: old entries read back with procedure ''.
ALTER TABLE audit_log ADD COLUMN procedure text COLLATE "C" NOT NULL DEFAULT '';

-- A callee's HTTP routes, in order (position 0 first): the first whose
-- pattern matches a request names its procedure (pkg/routes). The store
-- writes a callee's routes whole, checked by routes.CompileRoutes; a callee
-- without rows has none. At most routes.MaxRoutes per callee.
CREATE TABLE routes (
    callee    text COLLATE "C" NOT NULL,
    position  integer NOT NULL CHECK (position >= 0 AND position < 256),
    pattern   text NOT NULL,
    procedure text COLLATE "C" NOT NULL CHECK (procedure <> ''),
    PRIMARY KEY (callee, position)
);
