package leader

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
// Otherwise it does nothing, and says why: "current" (the row no longer
// shows that expired term), "free" (no session holds the election's lock:
// the campaign's wait ends by itself), "other" (another session than the
// one the row names holds it — a candidate that took the lock and is
// outwaiting the term, or something that never lets go: see stuckFor),
// "shared" (the named session holds other advisory locks too: the
// candidates wait for the server to drop it), or "ended" (the session
// ended before pg_terminate_backend reached it). It returns the verdict
// and the pid that holds the lock, 0 if none. %s is the lease table.
const terminateSQL = `
with holder as (
	select pid from pg_locks
	where locktype = 'advisory' and granted
	  and database = (select oid from pg_database where datname = current_database())
	  and classid = $1 and objid = $2 and objsubid = $3
	limit 1)
select case
	when not exists (select from %s
		where name = $5 and owner = $6 and token = $7 and expires_at <= clock_timestamp())
	then 'current'
	when not exists (select from holder) then 'free'
	when not exists (select from holder where pid = $4) then 'other'
	when exists (select from pg_locks
		where locktype = 'advisory' and pid = $4
		  and not (database = (select oid from pg_database where datname = current_database())
		           and classid = $1 and objid = $2 and objsubid = $3))
	then 'shared'
	when pg_terminate_backend($4) then 'terminated'
	else 'ended' end,
	coalesce((select pid from holder), 0)`

// stuck is how long an expired term has been seen with the election's
// lock held by one session it does not name (verdict "other"), by the
// campaigns' watchers, one at a time; any other verdict, or another
// holder, starts it again.
type stuck struct {
	term   int64
	holder int32
	since  time.Time
	told   bool
}

// breakStale terminates the session of a leader whose lease expired (not
// released: its owner is still set) if that very session still holds the
// advisory lock and nothing else (see terminateSQL). A lease-only leader
// records no session, and none is ever terminated for it. fresh says whether
// this stale term is seen for the first time, to log once. What keeps the
// candidates waiting is reported (State.LastError as ErrStaleLeader, and
// a Warn): the named session holding the lock with other locks; another
// session holding the lock past the time a candidate needs to outwait
// and break the term (see stuckFor); a statement that fails. A session
// that holds no lock here — it ended, or it was a backend of the primary
// before a failover — is nobody's to terminate and holds no one up.
func (e *Elector) breakStale(ctx context.Context, stale Leader, fresh bool) {
	if stale.sessionPID == 0 || stale.meta.Campaign != "" {
		return // no session of its own: a lease-only leader, or not ours
	}
	table := e.leaseTable()
	classid, objid, objsubid := e.key.LockTag()
	var (
		verdict string
		holder  int32
	)
	err := e.bounded(ctx, func(ctx context.Context) error {
		return e.cfg.Pool.QueryRow(ctx, fmt.Sprintf(terminateSQL, table),
			classid, objid, objsubid, int32(stale.sessionPID), e.leaseName, stale.owner, stale.Term).Scan(&verdict, &holder)
	})
	attrs := []any{"election", e.cfg.Name, "stale", stale.Identity, "term", stale.Term, "pid", stale.sessionPID}
	if err != nil || verdict != "other" {
		e.stuck = stuck{}
	}
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr):
		// The server refused the statement (a privilege, say): this
		// election cannot end a stale session, and says so.
		e.setErr(fmt.Errorf("%w: the expired term %d of %s: cannot judge or terminate its session (pid %d): %w",
			ErrStaleLeader, stale.Term, stale.Identity, stale.sessionPID, err))
		if fresh {
			e.cfg.Logger.Warn("leader: cannot terminate a stale leader's session; waiting for the server to drop it", append(attrs, "err", err)...)
		}
	case err != nil:
		// Not answered: the watcher's next read reports the database.
		e.cfg.Logger.Debug("leader: judge a stale leader's session", append(attrs, "err", err)...)
	case verdict == "terminated":
		e.cfg.Logger.Info("leader: terminated a stale leader's session", attrs...)
	case verdict == "shared":
		// Not an error of ours, but the reason no candidate leads: State
		// says so for as long as it lasts (a stopped leader's session is
		// never dropped by the server).
		e.setErr(fmt.Errorf("%w: the expired term %d of %s: its session (pid %d) still holds the election's lock with other locks, not ours to end; waiting for the server to drop it",
			ErrStaleLeader, stale.Term, stale.Identity, stale.sessionPID))
		if fresh {
			e.cfg.Logger.Warn("leader: a stale leader's session still holds the lock with other locks: waiting for the server to drop it", attrs...)
		}
	case verdict == "other":
		e.heldByOther(stale, holder, attrs)
	case fresh:
		e.cfg.Logger.Debug("leader: nothing to terminate for an expired term", append(attrs, "verdict", verdict)...)
	}
}

// heldByOther notes that the election's lock is held by session holder,
// which the expired term stale does not name, and reports it once that
// has lasted stuckFor: no campaign takes that long to outwait and break a
// term, so the holder is no candidate that is getting on (another program
// that locks the key, a candidate stopped between the lock and the lease,
// a Locker on another database than Config.Pool's).
func (e *Elector) heldByOther(stale Leader, holder int32, attrs []any) {
	if e.stuck.term != stale.Term || e.stuck.holder != holder {
		e.stuck = stuck{term: stale.Term, holder: holder, since: time.Now()}
		e.cfg.Logger.Debug("leader: the election's lock is held by a session the expired term does not name; waiting", append(attrs, "holder_pid", holder)...)
	}
	waited := time.Since(e.stuck.since)
	if waited < e.stuckFor(stale) {
		return
	}
	e.setErr(fmt.Errorf("%w: the expired term %d of %s: the election's lock has been held for %v by session pid %d, which no term names (another program that locks the key, or a candidate stopped between the lock and the lease)",
		ErrStaleLeader, stale.Term, stale.Identity, waited.Round(time.Second), holder))
	if !e.stuck.told {
		e.stuck.told = true
		e.cfg.Logger.Warn("leader: the election's lock is held by a session no term names; waiting for it to let go", append(attrs, "holder_pid", holder, "waited", waited.Round(time.Second))...)
	}
}

// stuckFor is how long a session the expired term stale does not name may
// hold the election's lock before heldByOther reports it: more than a
// candidate that took the lock needs to outwait the term (the longer of
// the two Graces) and to take, read and break the lease (each call bounded
// by termBound, or by the stale term's TTL + stmtSlack if longer: the
// taker may run with that TTL), with two RetryIntervals to spare.
func (e *Elector) stuckFor(stale Leader) time.Duration {
	g, _ := stale.meta.horizon()
	ttl, _ := time.ParseDuration(stale.meta.TTL)
	return max(e.cfg.Grace, g) + 3*max(e.termBound(), ttl+stmtSlack) + 2*e.cfg.RetryInterval
}

// breakTerm breaks the lease of the term held, and reports whether the row
// still showed it. A session-mode taker breaks a term only once it has
// outwaited the holder's horizon; and it must not break any other, such
// as a lease-only candidate's that took the lease meanwhile (it is free
// to: the lease expired). Store.Break, which breaks whoever holds the
// lease, would; Store.BreakAcquisition breaks that term or nothing, also when
// its outcome is unknown.
func (e *Elector) breakTerm(ctx context.Context, held Leader) (bool, error) {
	err := e.bounded(ctx, func(ctx context.Context) error {
		_, err := e.cfg.Store.BreakAcquisition(ctx, e.leaseName, held.owner, held.Term)
		return err
	})
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
