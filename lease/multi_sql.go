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
// makes it take nothing and return the names it could not lock ('l'; the
// caller tries again, and reports them after a few such races, so that a
// row that stays locked, an expired lease's under a Guard's FOR SHARE,
// is not retried for ever). A name inserted by a racing first
// acquisition makes the INSERT fail (23505) and the whole statement with
// it: nothing is taken. Each row records the attempt id ($7), by which an
// attempt whose outcome is unknown is cleaned up. A takeover of an expired row tells
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
select 't', name, null::uuid, token, expires_at, {LAG},
	case when had then (select 0 from pg_notify($8::text, 'l' || (token - 1) || ':' || name)) else 0 end
from upd
union all
select 't', name, null::uuid, token, expires_at, {LAG}, 0 from ins
union all
select 'h', name, owner, token, expires_at, {LEFT}, 0 from busy
union all
select 'l', name, null::uuid, token, expires_at, 0, 0 from cur
where not (select ok from okc) and not exists (select from busy) and name not in (select name from lk)`

// semAcquireSQL takes $3 permits of the semaphore $1, all or none, in one
// statement: the lowest free slots below the limit, each a lease row
// "$1#slot". The limit is the metadata of the row "$1#limit" ({"limit",
// "slots", "gen"}: slots is the highest limit ever set, so every slot row
// that may be held is below it; gen grows with every change), or $2 while
// there is none; the first acquisition stores $2 there. The permits held
// (live slot rows below "slots", so above a lowered limit too), plus $3,
// plus the permits reserved by a waiter holding the turn ("$1#turn", its
// metadata's "n") when that is not the caller ($4, the caller's turn
// owner), must not exceed the limit; else the statement returns one row
// of counts ('f') and locks and writes nothing. Otherwise it locks up to
// $3 free slot rows without waiting (SKIP LOCKED), fills the rest with
// slots that have no row yet, and takes them only when it got $3 in all —
// as acquireAllSQL does, a lost race takes nothing and returns one row
// ('l', with the number of free slot rows it could not lock in place of
// the time left), and a
// racing insert fails the whole statement (23505).
//
// The limit is read from the statement's snapshot, and the counts with
// it, so a grant must not use a limit that changed since: before taking
// anything it locks the limit row and checks that the row's metadata is
// the snapshot's (else it takes nothing: a lost race). The lock is FOR
// KEY SHARE, which grants do not contend on and which semLimitSQL's FOR
// UPDATE waits for: a limit change commits only after every grant that
// used the old limit, so a snapshot that sees the new limit sees their
// permits too. While permits held in slots at or above the limit (left
// by a lowered limit) count, the free slots below it do not bound the
// grants of racing statements that cannot see each other's permits, so
// then grants serialize instead: the statement locks the limit row FOR
// NO KEY UPDATE (SKIP LOCKED: a lost race) and bumps its gen, which makes
// a racing grant with an older snapshot fail the check. Without a limit
// row in the snapshot, the insert of it has no ON CONFLICT: one made
// since fails the statement (23505) and the try runs again.
const semAcquireSQL = `with lim0 as (
	select metadata from {T} where name = $1::text || '#limit'
), cfg as (
	select coalesce((select (metadata->>'limit')::int from lim0), $2::int) as lim,
		coalesce((select (metadata->>'slots')::int from lim0), $2::int) as slots
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
		coalesce((select n from turn), 0) as reserved,
		exists (select from cur where busy and i >= (select lim from cfg)) as over
), room as (
	select held + $3::int + reserved <= lim as ok, over from st
), limk as (
	select metadata from {T} where name = $1::text || '#limit' and (select ok and not over from room)
	for key share
), limx as (
	select metadata from {T} where name = $1::text || '#limit' and (select ok and over from room)
	for no key update skip locked
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
	select (select count(*) from lk) + (select count(*) from fill) = $3::int
		and (not exists (select from lim0)
			or (select metadata from limk union all select metadata from limx) is not distinct from (select metadata from lim0)) as ok
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
), limgen as (
	update {T} set metadata = metadata || jsonb_build_object('gen', coalesce((metadata->>'gen')::bigint, 0) + 1)
	where name = $1::text || '#limit' and (select over from room) and (select ok from okc)
), limrow as (
	insert into {T} (name, owner, token, ttl, acquired_at, renewed_at, expires_at, metadata)
	select $1::text || '#limit', {LIMOWNER}, 1, interval '0', clock_timestamp(), clock_timestamp(), {LIMEXPIRY},
		jsonb_build_object('limit', $2::int, 'slots', $2::int, 'gen', 0)
	where (select ok from okc) and not exists (select from lim0)
)
select 't', name, token, expires_at, {LAG},
	case when had then (select 0 from pg_notify($11::text, 'l' || (token - 1) || ':' || name)) else 0 end,
	0, 0, 0, 0
from upd
union all
select 't', name, token, expires_at, {LAG}, 0, 0, 0, 0, 0 from ins
union all
select 'f', null, null, null, coalesce((select {MINLEFT} from (select expires_at from cur where busy union all select expires_at from turn) x), 0), 0,
	held, lim, reserved, greatest(lim, (select slots from cfg))
from st where not (select ok from room)
union all
select 'l', null, null, null,
	(select count(*) from cur where present and not busy and i < (select lim from cfg) and name not in (select name from lk)), 0,
	held, lim, reserved, greatest(lim, (select slots from cfg))
from st where (select ok from room) and not (select ok from okc)`

// semLimitSQL stores the limit $2 of the semaphore $1 in its row
// "$1#limit" (made when missing), keeping "slots" the highest limit ever
// set and growing "gen", and wakes its waiters: a raised limit may let
// them pass. Its ON CONFLICT sets the key column (to itself), which makes
// it lock the row FOR UPDATE, so that it waits for every grant in flight
// (each holds FOR KEY SHARE on the row, see semAcquireSQL): the limit
// changes only once no grant that used the old one can still commit.
const semLimitSQL = `insert into {T} as l (name, owner, token, ttl, acquired_at, renewed_at, expires_at, metadata)
values ($1::text || '#limit', {LIMOWNER}, 1, interval '0', clock_timestamp(), clock_timestamp(), {LIMEXPIRY},
	jsonb_build_object('limit', $2::int, 'slots', $2::int, 'gen', 0))
on conflict (name) do update set name = excluded.name, owner = excluded.owner, expires_at = excluded.expires_at,
	metadata = jsonb_build_object('limit', $2::int,
	'slots', greatest(coalesce((l.metadata->>'slots')::int, 0), $2::int),
	'gen', coalesce((l.metadata->>'gen')::bigint, 0) + 1)
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

// limitOwner and limitExpiry make a semaphore's limit row look held for
// good, by an owner no Store has (the nil UUID, which WithOwner refuses):
// a lease acquisition of the name "<name>#limit" (TryAcquire,
// TryAcquireAll, ...) reports it held instead of overwriting the limit.
// The expiry is 100 years ahead, renewed by every SetLimit ('infinity'
// has no distance to now in PostgreSQL 15, and a time.Duration reaches
// 292 years).
const (
	limitOwner  = `'00000000-0000-0000-0000-000000000000'::uuid`
	limitExpiry = `clock_timestamp() + interval '100 years'`
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
		"{LAG}", micros("expires_at - ttl - statement_timestamp()"), "{SYNC}", sync,
		"{LIMOWNER}", limitOwner, "{LIMEXPIRY}", limitExpiry)
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
// none of the three: it lost a race and should be tried again, and lost
// (lostFull for a semaphore) describes the rows it could not lock, for a
// caller that stops retrying.
type multiResult struct {
	taken    []taken
	held     []HeldError
	full     *FullError
	lost     []HeldError
	lostFull *FullError
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
			kind  string
			name  string
			owner pgtype.UUID
			token int64
			exp   time.Time
			us    int64
		)
		if err := rows.Scan(&kind, &name, &owner, &token, &exp, &us, nil); err != nil {
			return multiResult{}, err
		}
		d := time.Duration(us) * time.Microsecond
		switch kind {
		case "t":
			res.taken = append(res.taken, taken{name: name, token: token, expiresAt: exp, lag: d})
		case "h":
			res.held = append(res.held, HeldError{Name: name, Owner: owner.Bytes, Token: token, ExpiresIn: d})
		default:
			res.lost = append(res.lost, HeldError{Name: name, Token: token, Locked: true})
		}
	}
	return res, rows.Err()
}
