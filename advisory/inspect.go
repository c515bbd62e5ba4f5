package advisory

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks"
)

// Querier runs a query: a *pgxpool.Pool, *pgx.Conn or pgx.Tx. Its Query
// must accept a pgx.QueryExecMode as the first argument, as those do.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Holder is one session that holds or waits for an advisory lock, from
// pg_locks joined with pg_stat_activity.
type Holder struct {
	// PID is the server process id (0 for a prepared transaction).
	PID uint32
	// ApplicationName is the session's application_name.
	ApplicationName string
	// ClientAddr is the client's IP address, "" for a Unix socket.
	ClientAddr string
	// Mode is pg_locks.mode: "ExclusiveLock" or "ShareLock".
	Mode string
	// Granted is true for a holder, false for a waiter.
	Granted bool
	// Since is, for a waiter, when its wait began (PostgreSQL 14 and
	// later); for a holder, when its session started, since PostgreSQL does
	// not record when a lock was granted. Zero when unknown.
	Since time.Time
}

// Exclusive reports whether the hold or wait is for the exclusive lock.
func (h Holder) Exclusive() bool { return h.Mode == "ExclusiveLock" }

const holdersSQL = `select coalesce(l.pid, 0), coalesce(a.application_name, ''), coalesce(host(a.client_addr), ''),
	l.mode, l.granted,
	case when l.granted then a.backend_start else (to_jsonb(l)->>'waitstart')::timestamptz end
from pg_locks l left join pg_stat_activity a on a.pid = l.pid
where l.locktype = 'advisory'
	and l.database = (select oid from pg_database where datname = current_database())
	and l.classid::int8 = $1 and l.objid::int8 = $2 and l.objsubid = $3
order by l.granted desc, l.pid`

// Holders returns the sessions of the current database that hold or wait
// for key, holders first. Waiters show up only when they wait on the server
// (pg_advisory_lock); waiting pglocks lockers poll and do not.
func Holders(ctx context.Context, q Querier, key pglocks.Key) ([]Holder, error) {
	if err := checkInspect(ctx, q, key); err != nil {
		return nil, opErr("holders", key, err)
	}
	classid, objid, objsubid := key.LockTag()
	// QueryExecModeExec: one round trip with no prepared statement to
	// outlive the transaction, so it works behind any pooler.
	rows, err := q.Query(ctx, holdersSQL, pgx.QueryExecModeExec, int64(classid), int64(objid), objsubid)
	if err != nil {
		return nil, opErr("holders", key, err)
	}
	hs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Holder, error) {
		var h Holder
		var pid int32
		var since *time.Time
		err := row.Scan(&pid, &h.ApplicationName, &h.ClientAddr, &h.Mode, &h.Granted, &since)
		h.PID = uint32(pid)
		if since != nil {
			h.Since = *since
		}
		return h, err
	})
	return hs, opErr("holders", key, err)
}

// IsHeld reports whether any session of the current database holds key, in
// either mode.
func IsHeld(ctx context.Context, q Querier, key pglocks.Key) (bool, error) {
	hs, err := Holders(ctx, q, key)
	if err != nil {
		return false, err
	}
	for _, h := range hs {
		if h.Granted {
			return true, nil
		}
	}
	return false, nil
}

func checkInspect(ctx context.Context, q Querier, key pglocks.Key) error {
	switch {
	case ctx == nil:
		return errNilContext
	case q == nil:
		return errors.New("nil Querier")
	}
	return key.Validate()
}

// Holders is [Holders] on the locker's pool.
func (l *Locker) Holders(ctx context.Context, key pglocks.Key) ([]Holder, error) {
	if l == nil {
		return nil, fmt.Errorf("advisory: holders: %w", errNilLocker)
	}
	return Holders(ctx, l.pool, key)
}

// IsHeld is [IsHeld] on the locker's pool.
func (l *Locker) IsHeld(ctx context.Context, key pglocks.Key) (bool, error) {
	if l == nil {
		return false, fmt.Errorf("advisory: is held: %w", errNilLocker)
	}
	return IsHeld(ctx, l.pool, key)
}
