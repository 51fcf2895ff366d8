-- 0006_burst_payback: a limit's burst and payback (issue #17), what the
-- limits file's burst: and payback: say of a caller's limit.
--
-- burst is how far above its limit a bucket may admit after a quiet
-- period, in its callee's units; payback_ms the window, in milliseconds,
-- over which it pays back what it admitted above its limit. 0 is the
-- limits file's default for both: the tightest edge, nothing paid back.
-- Existing rows get 0: they behave as they did. Columns with a constant
-- default: no row is rewritten.
ALTER TABLE bucket_limits
    ADD COLUMN burst      double precision NOT NULL DEFAULT 0 CHECK (burst >= 0 AND burst < 'Infinity'),
    ADD COLUMN payback_ms bigint NOT NULL DEFAULT 0 CHECK (payback_ms BETWEEN 0 AND 3600000);
