package lease

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// queries holds the store's SQL, with the table name filled in. Every
// expiry test uses the server clock: now() in the store's own single-
// statement transactions, clock_timestamp() in Guard, which runs inside the
// caller's transaction where now() may be long past.
type queries struct {
	channel                              string
	acquireSQL, renewSQL, releaseSQL     string
	releaseOwnerSQL                      string
	assertSQL, guardSQL, resumeSQL       string
	getSQL, listSQL, isHeldSQL, breakSQL string
}

// micros converts an interval expression to whole microseconds.
func micros(expr string) string {
	return "(extract(epoch from " + expr + ") * 1000000)::bigint"
}

const infoColumns = `name, owner, token, ttl_us, acquired_at, renewed_at, expires_at, held, left_us, hostname, pid, metadata`

func newQueries(cfg Config) queries {
	t := pgx.Identifier{cfg.Schema, cfg.Table}.Sanitize()
	r := strings.NewReplacer("{T}", t, "{TTL}", micros("ttl"), "{LEFT}", micros("greatest(expires_at - now(), interval '0')"))
	q := queries{channel: cfg.Channel}
	// acquire: a conditional UPDATE for a free, released or expired row; an
	// INSERT for a name never seen; else the holder, from the snapshot. A
	// failed try updates nothing, inserts nothing and locks nothing. The
	// UPDATE re-checks its condition on the newest row version (READ
	// COMMITTED), so two racing tries cannot both win; the INSERT's ON
	// CONFLICT DO NOTHING settles two first-ever tries.
	q.acquireSQL = r.Replace(`with cur as (
	select owner, token, expires_at from {T} where name = $1::text
), upd as (
	update {T} as l set owner = $2::uuid, token = l.token + 1, ttl = $3::bigint * interval '1 microsecond',
		acquired_at = now(), renewed_at = now(), expires_at = now() + $3::bigint * interval '1 microsecond',
		hostname = $4::text, pid = $5::int, metadata = $6::jsonb
	where l.name = $1::text and (l.owner is null or l.expires_at <= now())
	returning l.token, l.expires_at
), ins as (
	insert into {T} (name, owner, token, ttl, acquired_at, renewed_at, expires_at, hostname, pid, metadata)
	select $1::text, $2::uuid, 1, $3::bigint * interval '1 microsecond', now(), now(),
		now() + $3::bigint * interval '1 microsecond', $4::text, $5::int, $6::jsonb
	where not exists (select from cur)
	on conflict (name) do nothing
	returning token, expires_at
)
select true, null::uuid, token, expires_at, 0::bigint from upd
union all
select true, null::uuid, token, expires_at, 0::bigint from ins
union all
select false, owner, token, expires_at, {LEFT} from cur
where owner is not null and expires_at > now()`)
	q.renewSQL = r.Replace(`update {T} set renewed_at = now(), expires_at = now() + ttl
where name = $1 and owner = $2 and token = $3 and expires_at > now()
returning expires_at`)
	// release, releaseOwner and break notify waiters from RETURNING — so
	// only when a row changed, in the same statement — and only when some
	// listener has an interest in the name (see listener).
	notify := func(channel, key string) string {
		return "case when pg_try_advisory_xact_lock(" + key + ") then null else pg_notify(" + channel + ", name) end"
	}
	q.releaseSQL = r.Replace(`update {T} set owner = null, expires_at = now()
where name = $1 and owner = $2 and token = $3 and expires_at > now()
returning ` + notify("$4", "$5::bigint"))
	q.releaseOwnerSQL = r.Replace(`update {T} set owner = null, expires_at = now()
where name = $1 and owner = $2 and expires_at > now()
returning ` + notify("$3", "$4::bigint"))
	q.assertSQL = r.Replace(`select {LEFT} from {T}
where name = $1 and owner = $2 and token = $3 and expires_at > now()`)
	q.guardSQL = r.Replace(`select expires_at from {T}
where name = $1 and owner = $2 and token = $3 and expires_at > clock_timestamp()
for share`)
	q.resumeSQL = r.Replace(`update {T} set renewed_at = now(), expires_at = now() + ttl
where name = $1 and owner = $2 and token = $3 and expires_at > now()
returning expires_at, {TTL}`)
	info := `select ` + infoColumns + ` from (select name, owner, token, {TTL} as ttl_us, acquired_at, renewed_at,
	expires_at, owner is not null and expires_at > now() as held, {LEFT} as left_us, hostname, pid, metadata
	from {T}) i `
	q.getSQL = r.Replace(info + `where name = $1`)
	q.listSQL = r.Replace(info + `where held order by name`)
	q.isHeldSQL = r.Replace(`select exists (select from {T} where name = $1 and owner is not null and expires_at > now())`)
	q.breakSQL = r.Replace(`update {T} set owner = null, token = token + 1, expires_at = least(expires_at, now())
where name = $1
returning token, ` + notify("$2", "$3::bigint"))
	return q
}

// acquireResult is one row of the acquire statement.
type acquireResult struct {
	acquired, held bool
	owner          uuid.UUID
	token          int64
	expiresAt      time.Time
	expiresIn      time.Duration
}

func (q queries) acquire(ctx context.Context, db querier, name string, o options, ttl time.Duration, cfg Config) (acquireResult, error) {
	var host, meta any
	if cfg.Hostname != "" {
		host = cfg.Hostname
	}
	if o.metadata != nil {
		meta = string(o.metadata)
	}
	rows, err := db.Query(ctx, q.acquireSQL, name, pgUUID(o.owner), ttl.Microseconds(), host, int32(cfg.PID), meta)
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
			left  int64
		)
		if err := rows.Scan(&ok, &owner, &token, &exp, &left); err != nil {
			return acquireResult{}, err
		}
		if ok {
			res = acquireResult{acquired: true, token: token, expiresAt: exp}
		} else if !res.acquired {
			res = acquireResult{held: true, owner: owner.Bytes, token: token, expiresAt: exp,
				expiresIn: time.Duration(left) * time.Microsecond}
		}
	}
	return res, rows.Err()
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

func jsonValid(b []byte) bool { return json.Valid(b) }
