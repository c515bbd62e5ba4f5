package lease

import (
	"context"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// acquireAllSQL takes every name of $1 (sorted, distinct) or none, in one
// statement and one commit, each with its own token (previous + 1, 1 for
// a name without a row). It reads the rows from the snapshot first: if any
// is held, it returns the holders and locks and writes nothing (the row
// locks below sit under a one-time filter that does not run then). Else it
// locks the free rows in name order without waiting (SKIP LOCKED: it never
// waits for a row lock, so two calls over overlapping sets cannot
// deadlock) and updates them, and inserts the missing ones, only when it
// locked every row it read: a row taken or locked since the snapshot
// makes it take nothing and return no row at all (the caller tries
// again). A name inserted by a racing first acquisition makes the INSERT
// fail (23505) and the whole statement with it: nothing is taken. Each
// row records the attempt id ($7), by which an attempt whose outcome is
// unknown is cleaned up, name by name. A takeover of an expired row tells
// its old holder (lost), as acquireSQL does.
const acquireAllSQL = `with cur as (
	select name, owner, token, expires_at from {T} where name = any($1::text[])
), busy as (
	select name, owner, token, expires_at from cur where owner is not null and expires_at > clock_timestamp()
), lk as (
	select l.name, l.owner is not null as had from {T} l
	where l.name = any($1::text[]) and not exists (select from busy)
		and (l.owner is null or l.expires_at <= clock_timestamp())
	order by l.name
	for no key update of l skip locked
), okc as (
	select not exists (select from busy) and (select count(*) from lk) = (select count(*) from cur) as ok
), upd as (
	update {T} as l set owner = $2::uuid, attempt = $7::uuid, token = l.token + 1, ttl = $3::bigint * interval '1 microsecond',
		acquired_at = clock_timestamp(), renewed_at = clock_timestamp(),
		expires_at = clock_timestamp() + $3::bigint * interval '1 microsecond',
		hostname = $4::text, pid = $5::int, metadata = $6::jsonb
	from lk where l.name = lk.name and (select ok from okc)
	returning l.name, l.token, l.expires_at, l.ttl, lk.had, {SYNC}
), ins as (
	insert into {T} (name, owner, attempt, token, ttl, acquired_at, renewed_at, expires_at, hostname, pid, metadata)
	select k.name, $2::uuid, $7::uuid, 1, $3::bigint * interval '1 microsecond', clock_timestamp(), clock_timestamp(),
		clock_timestamp() + $3::bigint * interval '1 microsecond', $4::text, $5::int, $6::jsonb
	from unnest($1::text[]) as k(name)
	where (select ok from okc) and not exists (select from cur where cur.name = k.name)
	order by k.name
	returning name, token, expires_at, ttl, {SYNC}
)
select true, name, null::uuid, token, expires_at, {LAG},
	case when had then (select 0 from pg_notify($8::text, 'l' || (token - 1) || ':' || name)) else 0 end
from upd
union all
select true, name, null::uuid, token, expires_at, {LAG}, 0 from ins
union all
select false, name, owner, token, expires_at, {LEFT}, 0 from busy`

// semAcquireSQL takes $3 permits of the semaphore $1, all or none, in one
// statement: the lowest free slots below the limit, each a lease row
// "$1#slot". The limit is the metadata of the row "$1#limit" ({"limit",
// "slots"}: slots is the highest limit ever set, so every slot row that
// may be held is below it), or $2 while there is none; the first
// acquisition stores $2 there. The permits held (live slot rows below
// "slots", so above a lowered limit too), plus $3, plus the permits
// reserved by a waiter holding the turn ("$1#turn", its metadata's "n")
// when that is not the caller ($4, the caller's turn owner), must not
// exceed the limit; else the statement returns one row of counts and
// locks and writes nothing. Otherwise it locks up to $3 free slot rows
// without waiting (SKIP LOCKED), fills the rest with slots that have no
// row yet, and takes them only when it got $3 in all — as acquireAllSQL
// does, a lost race returns no row, and a racing insert fails the whole
// statement (23505).
const semAcquireSQL = `with cfg as (
	select coalesce((select (metadata->>'limit')::int from {T} where name = $1::text || '#limit'), $2::int) as lim,
		coalesce((select (metadata->>'slots')::int from {T} where name = $1::text || '#limit'), $2::int) as slots
), slot as (
	select i, $1::text || '#' || i as name from cfg, generate_series(0, greatest(cfg.lim, cfg.slots) - 1) as i
), cur as (
	select s.i, s.name, l.name is not null as present,
		coalesce(l.owner is not null and l.expires_at > clock_timestamp(), false) as busy, l.expires_at
	from slot s left join {T} l on l.name = s.name
), turn as (
	select owner, coalesce((metadata->>'n')::int, 0) as n, expires_at from {T}
	where name = $1::text || '#turn' and owner is not null and expires_at > clock_timestamp() and owner is distinct from $4::uuid
), st as (
	select (select count(*) from cur where busy)::int as held, (select lim from cfg) as lim,
		coalesce((select n from turn), 0) as reserved
), room as (
	select held + $3::int + reserved <= lim as ok from st
), lk as (
	select l.name, s.i, l.owner is not null as had from {T} l join slot s on l.name = s.name
	where s.i < (select lim from cfg) and (select ok from room)
		and (l.owner is null or l.expires_at <= clock_timestamp())
	order by s.i limit $3::int
	for no key update of l skip locked
), fill as (
	select i, name from cur where not present and i < (select lim from cfg) and (select ok from room)
	order by i limit $3::int - (select count(*) from lk)
), okc as (
	select (select count(*) from lk) + (select count(*) from fill) = $3::int as ok
), upd as (
	update {T} as l set owner = $5::uuid, attempt = $10::uuid, token = l.token + 1, ttl = $6::bigint * interval '1 microsecond',
		acquired_at = clock_timestamp(), renewed_at = clock_timestamp(),
		expires_at = clock_timestamp() + $6::bigint * interval '1 microsecond',
		hostname = $7::text, pid = $8::int, metadata = $9::jsonb
	from lk where l.name = lk.name and (select ok from okc)
	returning l.name, l.token, l.expires_at, l.ttl, lk.had, {SYNC}
), ins as (
	insert into {T} (name, owner, attempt, token, ttl, acquired_at, renewed_at, expires_at, hostname, pid, metadata)
	select name, $5::uuid, $10::uuid, 1, $6::bigint * interval '1 microsecond', clock_timestamp(), clock_timestamp(),
		clock_timestamp() + $6::bigint * interval '1 microsecond', $7::text, $8::int, $9::jsonb
	from fill where (select ok from okc)
	order by i
	returning name, token, expires_at, ttl, {SYNC}
), limrow as (
	insert into {T} (name, token, ttl, acquired_at, renewed_at, expires_at, metadata)
	select $1::text || '#limit', 1, interval '0', clock_timestamp(), clock_timestamp(), clock_timestamp(),
		jsonb_build_object('limit', $2::int, 'slots', $2::int)
	where (select ok from okc) and not exists (select from {T} where name = $1::text || '#limit')
	on conflict (name) do nothing
)
select true, name, token, expires_at, {LAG},
	case when had then (select 0 from pg_notify($11::text, 'l' || (token - 1) || ':' || name)) else 0 end,
	0, 0, 0, 0
from upd
union all
select true, name, token, expires_at, {LAG}, 0, 0, 0, 0, 0 from ins
union all
select false, null, null, null, coalesce((select {MINLEFT} from (select expires_at from cur where busy union all select expires_at from turn) x), 0), 0,
	held, lim, reserved, greatest(lim, (select slots from cfg))
from st where not (select ok from okc)`

// semLimitSQL stores the limit $2 of the semaphore $1 in its row
// "$1#limit" (made when missing, released, token 1), keeping "slots" the
// highest limit ever set, and wakes its waiters: a raised limit may let
// them pass.
const semLimitSQL = `insert into {T} as l (name, token, ttl, acquired_at, renewed_at, expires_at, metadata)
values ($1::text || '#limit', 1, interval '0', clock_timestamp(), clock_timestamp(), clock_timestamp(),
	jsonb_build_object('limit', $2::int, 'slots', $2::int))
on conflict (name) do update set metadata = jsonb_build_object('limit', $2::int,
	'slots', greatest(coalesce((l.metadata->>'slots')::int, 0), $2::int))
returning pg_notify($3::text, 'r' || l.name)`

// semSlotsSQL is the part of the inspection statements that lists the
// slot names of the semaphore $1 that may be held ($2: the limit while
// none is stored).
const semSlotsSQL = `with cfg as (
	select coalesce((select greatest((metadata->>'limit')::int, (metadata->>'slots')::int) from {T} where name = $1::text || '#limit'), $2::int) as slots
), slot as (
	select $1::text || '#' || i as name from cfg, generate_series(0, cfg.slots - 1) as i
) `

// semHoldersSQL lists the live permits of a semaphore, as [Store.List]
// lists leases; semCountSQL counts them.
const (
	semHoldersSQL = semSlotsSQL + `select ` + infoColumns + ` from (select name, owner, token, {TTL} as ttl_us, acquired_at, renewed_at,
	expires_at, true as held, {LEFTNOW} as left_us, hostname, pid, metadata
	from {T} where name in (select name from slot) and owner is not null and expires_at > now()) i order by token`
	semCountSQL     = semSlotsSQL + `select count(*) from {T} where name in (select name from slot) and owner is not null and expires_at > now()`
	semLimitReadSQL = `select (metadata->>'limit')::int from {T} where name = $1::text || '#limit'`
)

// multiQueries are the statements of TryAcquireAll and semaphores, with
// the table filled in.
type multiQueries struct {
	all, sem, limit, holders, count, readLimit string
}

func newMultiQueries(cfg Config) multiQueries {
	_, sync := durability()
	r := strings.NewReplacer("{T}", pgx.Identifier{cfg.Schema, cfg.Table}.Sanitize(), "{TTL}", micros("ttl"),
		"{LEFT}", micros("greatest(expires_at - clock_timestamp(), interval '0')"),
		"{MINLEFT}", micros("greatest(min(expires_at) - clock_timestamp(), interval '0')"),
		"{LEFTNOW}", micros("greatest(expires_at - now(), interval '0')"),
		"{LAG}", micros("expires_at - ttl - statement_timestamp()"), "{SYNC}", sync)
	return multiQueries{all: r.Replace(acquireAllSQL), sem: r.Replace(semAcquireSQL), limit: r.Replace(semLimitSQL),
		holders: r.Replace(semHoldersSQL), count: r.Replace(semCountSQL), readLimit: r.Replace(semLimitReadSQL)}
}

// taken is one name an all-or-none statement acquired.
type taken struct {
	name      string
	token     int64
	expiresAt time.Time
	lag       time.Duration
}

// multiResult is what one all-or-none statement did: took every name of
// taken, or found holders (held), or, for a semaphore, no room (full);
// none of the three: it lost a race and should be tried again.
type multiResult struct {
	taken []taken
	held  []HeldError
	full  *FullError
}

// hostMeta returns the hostname and metadata arguments of an acquisition.
func hostMeta(cfg Config, o options) (host, meta any) {
	if cfg.Hostname != "" {
		host = cfg.Hostname
	}
	if o.metadata != nil {
		meta = string(o.metadata)
	}
	return host, meta
}

// acquireAll runs acquireAllSQL for names (sorted, distinct).
func (s *Store) acquireAll(ctx context.Context, db querier, names []string, attempt uuid.UUID, o options, ttl time.Duration) (multiResult, error) {
	host, meta := hostMeta(s.cfg, o)
	rows, err := db.Query(ctx, s.mq.all, names, pgUUID(o.owner), ttl.Microseconds(), host, int32(s.cfg.PID), meta, pgUUID(attempt), s.q.channel)
	if err != nil {
		return multiResult{}, err
	}
	defer rows.Close()
	var res multiResult
	for rows.Next() {
		var (
			ok    bool
			name  string
			owner pgtype.UUID
			token int64
			exp   time.Time
			us    int64
		)
		if err := rows.Scan(&ok, &name, &owner, &token, &exp, &us, nil); err != nil {
			return multiResult{}, err
		}
		d := time.Duration(us) * time.Microsecond
		if ok {
			res.taken = append(res.taken, taken{name: name, token: token, expiresAt: exp, lag: d})
		} else {
			res.held = append(res.held, HeldError{Name: name, Owner: owner.Bytes, Token: token, ExpiresIn: d})
		}
	}
	return res, rows.Err()
}
