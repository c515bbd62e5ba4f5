package leader

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks/lease"
)

// terminateSQL terminates a stale leader's session in one statement, and
// only if, at that moment:
//
//   - the lease row still shows the stale term — same owner and token, not
//     released — and it has expired by the server clock: the leader stopped
//     trusting it before then, so it no longer acts as leader;
//   - that backend holds this election's advisory lock in this database;
//   - that backend holds no other advisory lock, granted or awaited: it may
//     be a Locker session shared with other elections or with the
//     application's locks, and those must never be demoted by this
//     election's takeover.
//
// Otherwise it does nothing, and the candidates wait for the server to drop
// the session. %s is the lease table. It returns whether it terminated.
const terminateSQL = `
select case when
	exists (select from %s
		where name = $5 and owner = $6 and token = $7 and expires_at <= clock_timestamp())
	and exists (select from pg_locks
		where locktype = 'advisory' and granted and pid = $4
		  and database = (select oid from pg_database where datname = current_database())
		  and classid = $1 and objid = $2 and objsubid = $3)
	and not exists (select from pg_locks
		where locktype = 'advisory' and pid = $4
		  and not (database = (select oid from pg_database where datname = current_database())
		           and classid = $1 and objid = $2 and objsubid = $3))
	then pg_terminate_backend($4)
	else false end`

// breakStale terminates the session of a leader whose lease expired (not
// released: its owner is still set) if that very session still holds the
// advisory lock and nothing else (see terminateSQL). A lease-only leader
// records no session, and none is ever terminated for it. fresh says whether
// this stale term is seen for the first time, to log a refusal once.
func (e *Elector) breakStale(ctx context.Context, stale Leader, fresh bool) {
	if stale.sessionPID == 0 || stale.meta.Campaign != "" {
		return // no session of its own: a lease-only leader, or not ours
	}
	table := e.leaseTable()
	classid, objid, objsubid := e.key.LockTag()
	var terminated bool
	err := e.cfg.Pool.QueryRow(ctx, fmt.Sprintf(terminateSQL, table),
		classid, objid, objsubid, int32(stale.sessionPID), e.leaseName, stale.owner, stale.Term).Scan(&terminated)
	switch {
	case err != nil && ctx.Err() == nil:
		e.cfg.Logger.Warn("leader: cannot terminate a stale leader's session; waiting for the server to drop it",
			"election", e.cfg.Name, "stale", stale.Identity, "pid", stale.sessionPID, "err", err)
	case terminated:
		e.cfg.Logger.Info("leader: terminated a stale leader's session",
			"election", e.cfg.Name, "stale", stale.Identity, "term", stale.Term, "pid", stale.sessionPID)
	case err == nil:
		// Not an error of ours, but the reason no candidate leads: State
		// says so for as long as it lasts (a stopped leader's session is
		// never dropped by the server).
		e.setErr(fmt.Errorf("%w: the expired term %d of %s: its session (pid %d) still holds the election's lock, shared with other locks or no longer ours to judge; waiting for the server to drop it",
			ErrStaleLeader, stale.Term, stale.Identity, stale.sessionPID))
		if fresh {
			e.cfg.Logger.Warn("leader: a stale leader's session still holds the lock, with other locks or none of ours: waiting for the server to drop it",
				"election", e.cfg.Name, "stale", stale.Identity, "term", stale.Term, "pid", stale.sessionPID)
		}
	}
}

// breakTerm breaks the lease of the term held, and reports whether the row
// still showed it. A session-mode taker breaks a term only once it has
// outwaited the holder's horizon; and it must not break any other, such
// as a lease-only candidate's that took the lease meanwhile (it is free
// to: the lease expired). Store.Break, which breaks whoever holds the
// lease, would; Store.BreakAcquisition breaks that term or nothing, also when
// its outcome is unknown.
func (e *Elector) breakTerm(ctx context.Context, held Leader) (bool, error) {
	_, err := e.cfg.Store.BreakAcquisition(ctx, e.leaseName, held.owner, held.Term)
	switch {
	case errors.Is(err, lease.ErrNotHeld):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("leader: campaign %q: %w", e.cfg.Name, err)
	}
	return true, nil
}

// leaseTable is the Store's table, quoted.
func (e *Elector) leaseTable() string {
	sc := e.cfg.Store.Config()
	return pgx.Identifier{sc.Schema, sc.Table}.Sanitize()
}
