package advisory

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks"
)

// Permit is one permit of a semaphore held now: its slot and the session
// that holds it, from pg_locks and pg_stat_activity.
type Permit struct {
	// Slot is the permit's slot number.
	Slot int
	// PID is the holding session's server process id.
	PID uint32
	// ApplicationName is the session's application_name.
	ApplicationName string
	// ClientAddr is the client's IP address, "" for a Unix socket.
	ClientAddr string
	// Since is when the holding session started (PostgreSQL does not
	// record when a lock was granted); zero when unknown.
	Since time.Time
}

const permitsSQL = `select s.i, l.pid, coalesce(a.application_name, ''), coalesce(host(a.client_addr), ''), a.backend_start
from generate_series(0, $2::int - 1) as s(i)
join pg_locks l on l.locktype = 'advisory' and l.granted and l.mode = 'ExclusiveLock' and l.objsubid = 1
	and l.database = (select oid from pg_database where datname = current_database())
	and (l.classid::int8 << 32 | l.objid::int8) = hashtextextended($1 || s.i, 0)
left join pg_stat_activity a on a.pid = l.pid
order by s.i, l.pid`

// SemaphorePermits returns the permits of the semaphore name held now in
// the current database, by every process, slot by slot: the granted
// exclusive advisory locks on its slot keys (see [Semaphore]) for every
// slot below [MaxLimit], so that permits taken under a larger limit than
// the caller's are counted too. Waiting acquirers do not show: they wait
// in their own process, not on the server.
func SemaphorePermits(ctx context.Context, q Querier, name string) ([]Permit, error) {
	switch {
	case ctx == nil:
		return nil, fmt.Errorf("advisory: semaphore permits: %w", errNilContext)
	case q == nil:
		return nil, errors.New("advisory: semaphore permits: nil Querier")
	}
	if err := pglocks.ValidateName(name); err != nil {
		return nil, fmt.Errorf("advisory: semaphore permits: %w", err)
	}
	rows, err := q.Query(ctx, permitsSQL, pgx.QueryExecModeExec, semPrefix+name+":", MaxLimit)
	if err != nil {
		return nil, fmt.Errorf("advisory: semaphore %q permits: %w", name, err)
	}
	ps, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Permit, error) {
		var p Permit
		var pid int32
		var since *time.Time
		err := row.Scan(&p.Slot, &pid, &p.ApplicationName, &p.ClientAddr, &since)
		p.PID = uint32(pid)
		if since != nil {
			p.Since = *since
		}
		return p, err
	})
	if err != nil {
		return nil, fmt.Errorf("advisory: semaphore %q permits: %w", name, err)
	}
	return ps, nil
}

// Holders returns the permits of the semaphore held now, by every process
// (see [SemaphorePermits]).
func (sem *Semaphore) Holders(ctx context.Context) ([]Permit, error) {
	if err := sem.unusable(); err != nil {
		return nil, fmt.Errorf("advisory: semaphore holders: %w", err)
	}
	return SemaphorePermits(ctx, sem.l.pool, sem.name)
}

// Count returns how many permits of the semaphore are held now, by every
// process, from pg_locks (see [SemaphorePermits]).
func (sem *Semaphore) Count(ctx context.Context) (int, error) {
	ps, err := sem.Holders(ctx)
	return len(ps), err
}
