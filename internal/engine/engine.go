// Package engine proves, on the server a pool reaches, the server-side
// behaviour pglocks relies on but cannot read from a version string:
// that a session advisory lock taken by one session is refused to another
// and freed by pg_advisory_unlock, that a transaction advisory lock is
// refused to another session while its transaction is open, and that
// clock_timestamp() advances within a transaction (a lease's expiry is
// judged by it). PostgreSQL-compatible engines differ exactly there:
// CockroachDB's session advisory-lock functions return success without
// locking, and a database whose search_path puts a schema before
// pg_catalog can shadow every one of these functions.
//
// The probe calls the functions unqualified, as pglocks' own statements
// do, so it sees what those statements would see. It runs on a connection
// the caller already has and one more short-lived connection of its own
// (the second session a lock must exclude), on random keys that no other
// client uses. Each finding is done (Ok, or a named [Failure]) or, when a
// statement failed on the way, an error: a transport or server error is
// no verdict, and the caller must not take it for one.
package engine

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/internal/dial"
)

// Primitive names one server-side behaviour the probe checks.
type Primitive string

// The behaviours probed.
const (
	SessionLocks Primitive = "session advisory locks"
	XactLocks    Primitive = "transaction advisory locks"
	Clock        Primitive = "clock_timestamp()"
)

// Failure is a probe's finding that a primitive does not behave as
// PostgreSQL's does.
type Failure struct {
	Primitive Primitive
	What      string // what the server did, in a few words
}

func (f *Failure) Error() string { return string(f.Primitive) + ": " + f.What }

// Report is what [Probe] found: nil for each primitive that behaves, else
// its *Failure.
type Report struct {
	// SessionSkipped: session locks were not probed (the caller's
	// connection is behind a transaction-mode pooler, which would strand
	// the probe's lock); SessionLocks is nil then.
	SessionSkipped bool
	SessionLocks   *Failure
	XactLocks      *Failure
	Clock          *Failure
}

// Failures returns the report's failures, in the order above.
func (r Report) Failures() []*Failure {
	var out []*Failure
	for _, f := range []*Failure{r.SessionLocks, r.XactLocks, r.Clock} {
		if f != nil {
			out = append(out, f)
		}
	}
	return out
}

// Probe checks every primitive on first, a dedicated connection from pool
// that keeps its server session (no transaction-mode pooler; the caller
// probes that first) and has no transaction open, and on one more
// connection it opens from pool for the purpose and closes before
// returning. It leaves no lock behind on either (every lock is taken on a
// random key and released, or dies with the closed connection). With
// sessions false, first may be behind a transaction-mode pooler and
// session locks are not probed.
func Probe(ctx context.Context, pool *pgxpool.Config, first dial.Conn, sessions bool) (Report, error) {
	second, err := dial.Dedicated(ctx, pool, dial.Options{ApplicationName: "pglocks engine probe"})
	if err != nil {
		return Report{}, fmt.Errorf("engine probe: second connection: %w", err)
	}
	defer second.Close(context.WithoutCancel(ctx))
	a, b := first.PgConn(), second.PgConn()
	r := Report{SessionSkipped: !sessions}
	if sessions {
		if r.SessionLocks, err = sessionLocks(ctx, a, b); err != nil {
			return Report{}, err
		}
	}
	if r.XactLocks, err = xactLocks(ctx, a, b); err != nil {
		return Report{}, err
	}
	if r.Clock, err = clock(ctx, a); err != nil {
		return Report{}, err
	}
	return r, nil
}

// SessionOnly checks session advisory locks alone (see [Probe]); the
// advisory Locker needs no more.
func SessionOnly(ctx context.Context, pool *pgxpool.Config, first dial.Conn) (*Failure, error) {
	second, err := dial.Dedicated(ctx, pool, dial.Options{ApplicationName: "pglocks engine probe"})
	if err != nil {
		return nil, fmt.Errorf("engine probe: second connection: %w", err)
	}
	defer second.Close(context.WithoutCancel(ctx))
	return sessionLocks(ctx, first.PgConn(), second.PgConn())
}

// sessionLocks takes a key on a, tries it on b (must be refused), unlocks
// it on a (must say it was held) and tries it on b again (must be granted
// now), then unlocks it on b.
func sessionLocks(ctx context.Context, a, b *pgconn.PgConn) (*Failure, error) {
	k := randomKey()
	fail := func(what string) *Failure { return &Failure{SessionLocks, what} }
	got, err := boolOf(ctx, a, "select pg_try_advisory_lock("+k+")")
	switch {
	case err != nil:
		return nil, err
	case !got:
		return fail("pg_try_advisory_lock refused a key no session holds"), nil
	}
	other, err := boolOf(ctx, b, "select pg_try_advisory_lock("+k+")")
	if err != nil {
		return nil, err
	}
	if other {
		_, _ = b.Exec(ctx, "select pg_catalog.pg_advisory_unlock_all()").ReadAll()
		_, _ = a.Exec(ctx, "select pg_catalog.pg_advisory_unlock_all()").ReadAll()
		return fail("pg_try_advisory_lock granted a key another session holds: locks do not exclude"), nil
	}
	freed, err := boolOf(ctx, a, "select pg_advisory_unlock("+k+")")
	switch {
	case err != nil:
		return nil, err
	case !freed:
		return fail("pg_advisory_unlock said a held key was not held"), nil
	}
	if other, err = boolOf(ctx, b, "select pg_try_advisory_lock("+k+")"); err != nil {
		return nil, err
	}
	if !other {
		_, _ = a.Exec(ctx, "select pg_catalog.pg_advisory_unlock_all()").ReadAll()
		return fail("pg_advisory_unlock did not free the key"), nil
	}
	if _, err := boolOf(ctx, b, "select pg_advisory_unlock("+k+")"); err != nil {
		return nil, err
	}
	return nil, nil
}

// xactLocks opens a transaction on b that takes a key, tries the key on a
// (must be refused) and rolls b's transaction back.
func xactLocks(ctx context.Context, a, b *pgconn.PgConn) (*Failure, error) {
	k := randomKey()
	got, err := boolOf(ctx, b, "begin; select pg_try_advisory_xact_lock("+k+")")
	defer func() { _, _ = b.Exec(context.WithoutCancel(ctx), "rollback").ReadAll() }()
	switch {
	case err != nil:
		return nil, err
	case !got:
		return &Failure{XactLocks, "pg_try_advisory_xact_lock refused a key no session holds"}, nil
	}
	other, err := boolOf(ctx, a, "select pg_try_advisory_xact_lock("+k+")")
	switch {
	case err != nil:
		return nil, err
	case other:
		return &Failure{XactLocks, "pg_try_advisory_xact_lock granted a key another transaction holds: locks do not exclude"}, nil
	}
	return nil, nil
}

// clock checks that clock_timestamp() is later than the transaction's
// start after a pause inside it: a lease row is tested and stamped with
// clock_timestamp(), and a frozen clock would make expiry never come.
func clock(ctx context.Context, a *pgconn.PgConn) (*Failure, error) {
	moved, err := boolOf(ctx, a, "select clock_timestamp() > pg_catalog.now() from pg_catalog.pg_sleep(0.002)")
	switch {
	case err != nil:
		return nil, err
	case !moved:
		return &Failure{Clock, "did not advance within a transaction"}, nil
	}
	return nil, nil
}

// boolOf runs sql (simple protocol) on c and returns the boolean in the
// last row of its last result.
func boolOf(ctx context.Context, c *pgconn.PgConn, sql string) (bool, error) {
	res, err := c.Exec(ctx, sql).ReadAll()
	if err != nil {
		return false, fmt.Errorf("engine probe: %s: %w", sql, err)
	}
	if len(res) == 0 || len(res[len(res)-1].Rows) != 1 || len(res[len(res)-1].Rows[0]) != 1 {
		return false, fmt.Errorf("engine probe: %s: not one value", sql)
	}
	switch v := string(res[len(res)-1].Rows[0][0]); v {
	case "t":
		return true, nil
	case "f":
		return false, nil
	default:
		return false, fmt.Errorf("engine probe: %s: %q is no boolean", sql, v)
	}
}

// randomKey returns a random int64 key as an SQL literal: no other
// client's key, in the odd chance it is, makes the probe fail with
// "refused a key no session holds", never pass.
func randomKey() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return strconv.FormatInt(int64(binary.LittleEndian.Uint64(b[:])), 10) + "::int8"
}
