package singleflight

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pglocks/pglocks/advisory"
)

// heldSQL is true while the session $4 holds the exclusive advisory lock
// whose pg_locks tag is ($5, $6, $7) in this database. The session is
// named by its pid and, where this role may read its backend_start (the
// same role, or pg_read_all_stats), by having started before
// clock_timestamp() − $8 µs, a time at which it was alive (see PutHeld):
// a backend that reused the pid after it died started later.
const heldSQL = `exists (select from pg_locks l
	where l.locktype = 'advisory' and l.pid = $4 and l.granted and l.mode = 'ExclusiveLock'
	and l.classid::int8 = $5 and l.objid::int8 = $6 and l.objsubid = $7
	and l.database = (select oid from pg_database where datname = current_database())
	and coalesce((select a.backend_start < clock_timestamp() - $8::int8 * interval '1 microsecond'
		from pg_stat_activity a where a.pid = $4), true))`

// putHeldSQL is Put's statement with the lock checked twice: before the
// row is written, and — on a conflict with a row, whose lock it waits for
// first — again after it holds the row, so that a store that waited for
// another one is checked after the wait.
func (t *Table) putHeldSQL() string {
	return "insert into " + t.qualified + ` (key, value, expires_at)
select $1, $2, clock_timestamp() + $3 * interval '1 microsecond'
where ` + heldSQL + `
on conflict (key) do update set value = excluded.value, expires_at = excluded.expires_at
where ` + heldSQL
}

// PutHeld stores value for key until ttl has passed by the server clock,
// in one statement that first checks that lock's session still holds lock
// (in pg_locks: its pid, its key, exclusive, granted); [Group.Do] uses it
// when its Results is a *Table. It stores nothing and returns an error wrapping
// [ErrNotStored] and [advisory.ErrLost] when the session no longer holds
// it, and an error wrapping [ErrNotStored] for a lock that has ended or is
// shared. The Table must be in the database of lock's Locker. Any other
// error is the statement's; if its reply was lost the statement may still
// have run, and then stored the value only if the check passed.
//
// The check and the write are one statement, and so one transaction, but
// the commit comes after the check: a store checked just before the
// session died still commits.
func (t *Table) PutHeld(ctx context.Context, lock *advisory.Lock, key string, value []byte, ttl time.Duration) error {
	switch {
	case ctx == nil:
		return fmt.Errorf("%w (key %q): nil context", ErrNotStored, key)
	case lock == nil:
		return fmt.Errorf("%w (key %q): nil *advisory.Lock", ErrNotStored, key)
	}
	if err := t.usable(); err != nil {
		return fmt.Errorf("%w (key %q): %w", ErrNotStored, key, err)
	}
	if lock.Shared() {
		return fmt.Errorf("%w (key %q): PutHeld needs an exclusive lock, not a shared one", ErrNotStored, key)
	}
	if lctx := lock.Context(); lctx.Err() != nil {
		return fmt.Errorf("%w (key %q): the lock has ended: %w", ErrNotStored, key, context.Cause(lctx))
	}
	if value == nil {
		value = []byte{}
	}
	classid, objid, objsubid := lock.Key().LockTag()
	// The session answered a round trip sent at VerifiedAt, so it was
	// alive then: the server's clock_timestamp() minus the time since, read
	// before sending, is later than its start and earlier than the start
	// of any backend that reused its pid.
	alive := time.Since(lock.VerifiedAt()).Microseconds()
	tag, err := t.pool.Exec(ctx, t.putHeldSQL(), key, value, ttl.Microseconds(),
		int32(lock.PID()), int64(classid), int64(objid), objsubid, alive)
	switch {
	case err != nil:
		return err
	case tag.RowsAffected() == 0:
		cause := lock.Err()
		switch {
		case cause == nil: // the Locker has not noticed yet
			cause = fmt.Errorf("%w: pg_locks shows its session (pid %d) no longer holding %v", advisory.ErrLost, lock.PID(), lock.Key())
		case !errors.Is(cause, advisory.ErrLost): // released by Close
			cause = fmt.Errorf("%w: %w", advisory.ErrLost, cause)
		}
		return fmt.Errorf("%w (key %q): %w", ErrNotStored, key, cause)
	}
	return nil
}
