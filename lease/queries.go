package lease

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/pglocks/pglocks/internal/plant"
)

// queries holds the store's SQL, with the table name filled in.
//
// Every expiry is judged, and every new expiry computed, with the server's
// clock_timestamp() at the moment the row is tested or changed — not the
// transaction's start (now()), which can be long past when a statement
// waited for a row lock (behind a Guard, say): a lease acquired or renewed
// after such a wait gets its whole TTL. Statements that change ownership
// or expiry also return how long after the server received them the new
// expiry was computed (the lag), so that the local trust window starts
// then too (see trustStart).
//
// Every statement that grants ownership or extends an expiry (acquire,
// renew, resume, break, raise) sets synchronous_commit to on (unless the
// session asks for a remote level already) for its own transaction, with
// set_config(…, true): its commit is flushed to the WAL before the reply,
// whatever the pool's sessions run with, so a crash cannot hand out a
// token twice (TestTokensSurviveCrash) or shorten a lease its holder
// trusts. A statement that only gives ownership up (release, cleanup)
// does not wait for the flush (see giveUp).
type queries struct {
	channel                              string
	acquireSQL, retakeSQL, fastSQL       string
	fastManySQL                          string
	renewSQL, releaseSQL                 string
	renewManySQL, checkManySQL           string
	releaseManySQL                       string
	cleanupSQL                           string
	assertSQL, guardSQL, resumeSQL       string
	getSQL, listSQL, isHeldSQL, breakSQL string
	breakAcqSQL                          string
	shared                               sharedQueries // shared leases' reads (shared_sql.go)
}

// micros converts an interval expression to whole microseconds.
func micros(expr string) string {
	return "(extract(epoch from " + expr + ") * 1000000)::bigint"
}

const infoColumns = `name, owner, token, ttl_us, acquired_at, renewed_at, expires_at, held, left_us, hostname, pid, metadata`

// syncCommit is an expression that makes its statement's commit
// synchronous when the session's setting would not flush it (off, local),
// and does nothing otherwise. The acquire statements evaluate it in the
// RETURNING of their UPDATE (and INSERT), so only for a row they changed:
// a failed try, which writes nothing and has no commit record to flush,
// does not pay for it.
const syncCommit = `case when current_setting('synchronous_commit') in ('off', 'local')
	then set_config('synchronous_commit', 'on', true) end`

// giveUp is an expression that lets its statement's commit skip the wait
// for its WAL flush when the session would wait only for the local one (on,
// local): a statement that only gives up ownership (release, cleanup) is
// safe to lose in a crash. Lost, the row still shows the old acquisition
// until its expiry, which only delays the next holder; and the next
// acquisition's own synchronous commit flushes the WAL up to itself, the
// release with it (WAL is flushed in order), before its token is handed
// out. A session that asks for a remote level (remote_write, remote_apply:
// read your writes on a standby, say) keeps it.
const giveUp = `case when current_setting('synchronous_commit') in ('on', 'local')
	then set_config('synchronous_commit', 'off', true) end`

// durable is a CTE that makes its statement's commit synchronous (see
// syncCommit); the statement must reference it (exists (select from
// durable)) so that it runs.
const durable = `durable as (select ` + syncCommit + `)`

// durability returns durable and syncCommit — or, when the chaos suite
// planted their absence (internal/plant), expressions that make the
// statement's commit asynchronous instead.
func durability() (cte, sync string) {
	if plant.On(plant.AsyncCommit) {
		off := `set_config('synchronous_commit', 'off', true)`
		return `durable as (select ` + off + `)`, off
	}
	return durable, syncCommit
}

// Payloads on the store's channel: "r" + name when a name is released (for
// waiters), "l" + token + ":" + name when every acquisition of name with a
// token up to token is over (Break, takeover after expiry; for holders).
const (
	releasedPayload = "'r' || name"
	lostPayload     = "'l' || (token - 1) || ':' || name"
)

func newQueries(cfg Config) queries {
	t := pgx.Identifier{cfg.Schema, cfg.Table}.Sanitize()
	cte, sync := durability()
	r := strings.NewReplacer("{T}", t, "{TTL}", micros("ttl"),
		"{LEFT}", micros("greatest(expires_at - clock_timestamp(), interval '0')"),
		"{LAG}", micros("expires_at - ttl - statement_timestamp()"),
		"{DURABLE}", cte, "{SYNC}", sync, "{GIVEUP}", giveUp)
	q := queries{channel: cfg.Channel}
	q.acquireSQL = r.Replace(acquireSQL)
	q.retakeSQL = r.Replace(retakeSQL)
	q.fastSQL = r.Replace(fastSQL)
	q.fastManySQL = r.Replace(fastManySQL)
	q.renewSQL = r.Replace(`with {DURABLE}
update {T} set renewed_at = clock_timestamp(), expires_at = clock_timestamp() + ttl
where name = $1 and owner = $2 and token = $3 and expires_at > clock_timestamp() and exists (select from durable)
returning expires_at, {LAG}`)
	// renewMany renews many leases, each scoped to (name, owner, token),
	// in one statement and one commit: the keep-alive's batch. Rows locked
	// by others (a Guard's FOR SHARE) are skipped rather than waited for,
	// so that one guarded transaction cannot hold back every renewal; the
	// renewer renews what the batch did not return on its own.
	q.renewManySQL = r.Replace(`with {DURABLE}, lk as (
	select l.name from {T} l, unnest($1::text[], $2::uuid[], $3::bigint[]) as k(name, owner, token)
	where l.name = k.name and l.owner = k.owner and l.token = k.token and l.expires_at > clock_timestamp()
	for no key update of l skip locked
)
update {T} l set renewed_at = clock_timestamp(), expires_at = clock_timestamp() + l.ttl
from lk where l.name = lk.name and l.expires_at > clock_timestamp() and exists (select from durable)
returning l.name, l.token, l.expires_at, {LAG}`)
	// checkMany returns which of many (name, owner, token) still hold
	// their lease, writing and locking nothing.
	q.checkManySQL = r.Replace(`select l.name, l.token from {T} l, unnest($1::text[], $2::uuid[], $3::bigint[]) as k(name, owner, token)
where l.name = k.name and l.owner = k.owner and l.token = k.token and l.expires_at > clock_timestamp()`)
	// release, cleanup and break notify waiters from RETURNING — so only
	// when a row changed, in the same statement — and only when some
	// listener has an interest in the name (see listener). Break also
	// tells the holder, always, and first: a store that hears of the
	// release has dropped its lease already when its waiters wake.
	notify := func(channel, key string) string {
		return "case when pg_catalog.pg_try_advisory_xact_lock(" + key + ") then null else pg_notify(" + channel + ", " + releasedPayload + ") end"
	}
	// release and cleanup only give up ownership: their commits do not
	// wait for the WAL flush ({GIVEUP}; see giveUp), which halves the
	// flushes of an acquire + release pair.
	q.releaseSQL = r.Replace(`update {T} set owner = null, expires_at = clock_timestamp()
where name = $1 and owner = $2 and token = $3 and expires_at > clock_timestamp()
returning {GIVEUP}, ` + notify("$4", "$5::bigint"))
	q.releaseManySQL = r.Replace(releaseManySQL)
	// cleanup frees the acquisitions an ambiguous acquire attempt may have
	// made of the names $1 (interest keys $4), by the attempt's own id: it
	// cannot touch any other.
	q.cleanupSQL = r.Replace(`update {T} l set owner = null, expires_at = clock_timestamp()
from unnest($1::text[], $4::bigint[]) as k(name, key)
where l.name = k.name and l.attempt = $2 and l.owner is not null and l.expires_at > clock_timestamp()
returning {GIVEUP}, case when pg_catalog.pg_try_advisory_xact_lock(k.key) then null else pg_notify($3, 'r' || l.name) end`)
	q.assertSQL = r.Replace(`select {LEFT} from {T}
where name = $1 and owner = $2 and token = $3 and expires_at > clock_timestamp()`)
	q.guardSQL = r.Replace(`select expires_at from {T}
where name = $1 and owner = $2 and token = $3 and expires_at > clock_timestamp()
for share`)
	q.resumeSQL = r.Replace(`with {DURABLE}
update {T} set renewed_at = clock_timestamp(), expires_at = clock_timestamp() + ttl
where name = $1 and owner = $2 and token = $3 and expires_at > clock_timestamp() and exists (select from durable)
returning expires_at, {TTL}, {LAG}`)
	info := `select ` + infoColumns + ` from (select name, owner, token, {TTL} as ttl_us, acquired_at, renewed_at,
	expires_at, owner is not null and expires_at > now() as held, ` + micros("greatest(expires_at - now(), interval '0')") + ` as left_us, hostname, pid, metadata
	from {T}) i `
	q.getSQL = r.Replace(info + `where name = $1`)
	q.listSQL = r.Replace(info + `where held order by name`)
	q.isHeldSQL = r.Replace(`select exists (select from {T} where name = $1 and owner is not null and expires_at > now())`)
	brk := `with {DURABLE}
update {T} set owner = null, token = token + 1, expires_at = least(expires_at, clock_timestamp())
where name = $1 and exists (select from durable){COND}
returning token, pg_notify($2, ` + lostPayload + `), ` + notify("$2", "$3::bigint")
	q.breakSQL = r.Replace(strings.Replace(brk, "{COND}", "", 1))
	q.breakAcqSQL = r.Replace(strings.Replace(brk, "{COND}", " and owner = $4 and token = $5", 1))
	q.shared = newSharedQueries(r)
	return q
}

// acquireSQL: a conditional UPDATE for a free, released or expired row; an
// INSERT for a name never seen; else the holder, from the snapshot. A
// failed try updates nothing, inserts nothing and locks nothing. The
// UPDATE re-checks its condition on the newest row version (READ
// COMMITTED), so two racing tries cannot both win; the INSERT's ON
// CONFLICT DO NOTHING settles two first-ever tries. The row records the
// attempt's id ($7), by which an attempt whose outcome is unknown is
// cleaned up. A takeover of an expired row tells its old holder (lost).
const acquireSQL = `with cur as (
	select owner, token, expires_at from {T} where name = $1::text
), upd as (
	update {T} as l set owner = $2::uuid, attempt = $7::uuid, token = l.token + 1, ttl = $3::bigint * interval '1 microsecond',
		acquired_at = clock_timestamp(), renewed_at = clock_timestamp(),
		expires_at = clock_timestamp() + $3::bigint * interval '1 microsecond',
		hostname = $4::text, pid = $5::int, metadata = $6::jsonb
	where l.name = $1::text and (l.owner is null or l.expires_at <= clock_timestamp())
	returning l.name, l.token, l.expires_at, l.ttl, {SYNC}
), ins as (
	insert into {T} (name, owner, attempt, token, ttl, acquired_at, renewed_at, expires_at, hostname, pid, metadata)
	select $1::text, $2::uuid, $7::uuid, 1, $3::bigint * interval '1 microsecond', clock_timestamp(), clock_timestamp(),
		clock_timestamp() + $3::bigint * interval '1 microsecond', $4::text, $5::int, $6::jsonb
	where not exists (select from cur)
	on conflict (name) do nothing
	returning name, token, expires_at, ttl, {SYNC}
)
select true, null::uuid, token, expires_at, {LAG},
	case when exists (select from cur where owner is not null)
	then (select 0 from pg_notify($8::text, ` + lostPayload + `)) else 0 end
from upd
union all
select true, null::uuid, token, expires_at, {LAG}, 0 from ins
union all
select false, owner, token, expires_at, {LEFT}, 0 from cur
where owner is not null and expires_at > clock_timestamp()`

// retakeSQL is acquireSQL for a name whose row exists (the store has seen
// a token of it): the same conditional UPDATE and the holder from the
// snapshot, without the INSERT and the extra read of the row it needs:
// less server time per acquisition, which bounds throughput (see
// BenchmarkThroughput). A name without a row returns no row at all: the
// caller runs acquireSQL. The holder is read only when the UPDATE took
// nothing (a one-time filter), so an acquisition reads the row once.
//
// A takeover of an expired row tells its old holder. RETURNING sees only
// the new row version, so the SET list notes the replaced version's token
// when it had an owner (in a transaction-local setting; every CASE branch
// sets the attempt id), and the outer select, over the rows the UPDATE
// really changed, sends the notice when the noted token is the one just
// replaced. The SET list may run on a version the UPDATE then does not
// replace — under READ COMMITTED it is computed on the snapshot's version
// before the row lock is taken, and again on the newest one — so it must
// not notify itself: a retake that took nothing would tell a live holder
// that its lease is over (TestRetakeThatTakesNothingSendsNoLoss).
const retakeSQL = `with upd as (
	update {T} as l set owner = $2::uuid, token = l.token + 1, ttl = $3::bigint * interval '1 microsecond',
		attempt = case when l.owner is not null and set_config('pglocks.taken', l.token::text, true) is not null
			then $7::uuid else $7::uuid end,
		acquired_at = clock_timestamp(), renewed_at = clock_timestamp(),
		expires_at = clock_timestamp() + $3::bigint * interval '1 microsecond',
		hostname = $4::text, pid = $5::int, metadata = $6::jsonb
	where l.name = $1::text and (l.owner is null or l.expires_at <= clock_timestamp())
	returning l.token, l.expires_at, l.ttl, {SYNC}
)
select true, null::uuid, token, expires_at, {LAG},
	case when current_setting('pglocks.taken', true) = (token - 1)::text
	then (select 0 from pg_notify($8::text, 'l' || (token - 1) || ':' || $1::text)) else 0 end
from upd
union all
select false, owner, token, expires_at, {LEFT}, 0 from {T}
where name = $1::text and owner is not null and expires_at > clock_timestamp() and not exists (select from upd)`

// fastSQL is retakeSQL for a name the store released last (see tokenMemory):
// a plain UPDATE of a released row — no owner, so no holder to tell of a
// takeover — without the read of the holder, whose plan nodes cost server
// time on every acquisition even when they do not run (a quarter of the
// statement's cost with 64 clients). It returns no row when the row is not
// released (another client took it since, its release was lost in a crash,
// it is missing); the caller then runs retakeSQL, which takes an expired row
// and reports a live holder (and, for a missing row, acquireSQL). Like the
// others it records the attempt id and commits synchronously.
const fastSQL = `update {T} set owner = $2::uuid, attempt = $7::uuid, token = token + 1, ttl = $3::bigint * interval '1 microsecond',
	acquired_at = clock_timestamp(), renewed_at = clock_timestamp(),
	expires_at = clock_timestamp() + $3::bigint * interval '1 microsecond',
	hostname = $4::text, pid = $5::int, metadata = $6::jsonb
where name = $1::text and owner is null
returning true, null::uuid, token, expires_at, {LAG}, {SYNC}`

// acquireKind picks the acquire statement: acquireSQL, retakeSQL or
// fastSQL.
type acquireKind int

const (
	acquireFull acquireKind = iota
	acquireRetake
	acquireFast
)

// acquireResult is one row of the acquire statement.
type acquireResult struct {
	acquired, held bool
	owner          uuid.UUID
	token          int64
	expiresAt      time.Time
	expiresIn      time.Duration // held: time left
	lag            time.Duration // acquired: see trustStart
}

// acquire runs the acquire statement of kind k.
func (q queries) acquire(ctx context.Context, db querier, name string, attempt uuid.UUID, o options, ttl time.Duration, cfg Config, k acquireKind) (acquireResult, error) {
	var host, meta any
	if cfg.Hostname != "" {
		host = cfg.Hostname
	}
	if o.metadata != nil {
		meta = string(o.metadata)
	}
	args := []any{name, pgUUID(o.owner), ttl.Microseconds(), host, int32(cfg.PID), meta, pgUUID(attempt), q.channel}
	sql := q.acquireSQL
	switch k {
	case acquireRetake:
		sql = q.retakeSQL
	case acquireFast:
		sql, args = q.fastSQL, args[:7] // it tells no holder: no channel
	}
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return acquireResult{}, err
	}
	defer rows.Close()
	var res acquireResult
	for rows.Next() {
		var (
			ok    bool
			owner pgtype.UUID
			token int64
			exp   time.Time
			us    int64
		)
		if err := rows.Scan(&ok, &owner, &token, &exp, &us, nil); err != nil {
			return acquireResult{}, err
		}
		d := time.Duration(us) * time.Microsecond
		if ok {
			res = acquireResult{acquired: true, token: token, expiresAt: exp, lag: d}
		} else if !res.acquired {
			res = acquireResult{held: true, owner: owner.Bytes, token: token, expiresAt: exp, expiresIn: d}
		}
	}
	return res, rows.Err()
}

// trustStart is the local time from which a lease acquired or renewed by a
// statement sent at sent (and answered by now) may be trusted: sent + the
// lag the server reported between receiving the statement and computing
// the new expiry (a wait for a row lock, say). The server received it after
// sent, so this is no later than the moment its expiry counts from. The
// lag is capped by the round trip, which contains it (a server clock step
// cannot stretch it), and floored at zero.
func trustStart(sent time.Time, lag time.Duration, now time.Time) time.Time {
	return sent.Add(min(max(lag, 0), max(now.Sub(sent), 0)))
}

// querier is what the store's statements need: a pool, a connection or a
// transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

func pgUUID(id uuid.UUID) pgtype.UUID { return pgtype.UUID{Bytes: id, Valid: true} }

// noRows translates pgx.ErrNoRows into ErrNotHeld at the SQL edge.
func noRows(err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrNotHeld
	}
	return err
}
