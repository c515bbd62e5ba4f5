package schedule

import (
	"strings"

	"github.com/jackc/pgx/v5"
)

// queries holds the runner's SQL, with the table name filled in. Every
// time in them is the server's clock_timestamp(); parameters carry explicit
// casts, so that the statements run in any pgx exec mode, behind a pooler
// too.
type queries struct {
	peek, mark, end, row, slot, history string
}

// syncCommit is the lease package's expression (lease/queries.go) that
// makes its statement's commit synchronous when the session's setting
// would not flush it (synchronous_commit off or local), and does nothing
// otherwise: set_config(…, true) lasts for the transaction only.
const syncCommit = `case when current_setting('synchronous_commit') in ('off', 'local')
	then set_config('synchronous_commit', 'on', true) end`

// recordColumns are the columns of a run, as scanRecord reads them.
const recordColumns = `token, slot, slot_start, owner, hostname, pid, started_at, ended_at, outcome, error`

func newQueries(cfg Config) queries {
	r := strings.NewReplacer("{T}", pgx.Identifier{cfg.Schema, cfg.Table}.Sanitize(), "{COLS}", recordColumns,
		"{US}", "* interval '1 microsecond'", "{SYNC}", syncCommit)
	return queries{
		peek: r.Replace(peekSQL),
		mark: r.Replace(markSQL),
		end:  r.Replace(endSQL),
		row:  r.Replace(`select {COLS} from {T} where job = $1::text and token = $2::bigint`),
		slot: r.Replace(`select {COLS} from {T} where job = $1::text and (slot = $2::text or slot_start = $4::timestamptz
	or ($3::bigint > 0 and started_at > clock_timestamp() - $3::bigint {US})) order by token desc limit 1`),
		history: r.Replace(historySQL),
	}
}

// peekSQL reads the server's clock, computes the slot of that moment when
// the job has a period ($2 µs, tolerance $3 µs), and returns the newest run
// that has the slot already: the same period slot, the same explicit key
// ($4), or — with AtLeast ($5 µs) — any run started within AtLeast. It
// reads and locks nothing else: the decision is made again, under the
// job's lease, by markSQL.
const peekSQL = `with c as (select clock_timestamp() as now),
s as (
	select now, case when $2::bigint > 0 then timestamptz 'epoch' +
		(((extract(epoch from now) * 1000000)::bigint + $3::bigint) / $2::bigint * $2::bigint) {US}
	end as slot_start from c
)
select s.now, s.slot_start, r.*
from s left join lateral (
	select {COLS} from {T} r
	where r.job = $1::text and (r.slot_start = s.slot_start or r.slot = $4::text
		or ($5::bigint > 0 and r.started_at > s.now - $5::bigint {US}))
	order by r.token desc limit 1
) r on true`

// markSQL runs in a transaction whose lease of the job was checked by
// Guard (its row locked FOR SHARE, so no other owner can take the job
// before the commit), by the holder of token $2, the job's newest. It
//   - marks every older run still "running" as crashed: its lease ended
//     (a newer token exists) before its end was recorded;
//   - finds the newest run that has the slot — its key ($3) or, for a
//     period slot, its start ($4), whatever the key's spelling — or, with
//     AtLeast ($9 µs), started within AtLeast; a run marked crashed here
//     counts as crashed;
//   - for a period slot (period $11 µs, tolerance $12 µs), finds whether
//     the Start comes too late (late: why): the slot's window has closed
//     by the server clock, or a run of a later slot exists — a replica
//     that stalled between its read of the slot and its acquire of the
//     job, whose slot may have run and been pruned from the history since;
//   - inserts this run, as running, unless it is late or such a run exists
//     and is not a crashed one that may be run again ($8: RerunCrashed),
//     and then commits synchronously whatever the session's
//     synchronous_commit ({SYNC}): a mark lost in a crash would let the
//     slot run again;
//   - keeps the job's newest $10 runs, and deletes older ones that are not
//     being marked crashed by this statement (those go at the next mark).
//
// It returns the new run's start (null if not inserted), why it is late
// (null if not) and the run found.
const markSQL = `with durable as (select {SYNC}), crashed as (
	update {T} set outcome = 'crashed'
	where job = $1::text and outcome = 'running' and token < $2::bigint
), prev as (
	select token, slot, slot_start, owner, hostname, pid, started_at, ended_at,
		case when outcome = 'running' and token < $2::bigint then 'crashed' else outcome end as outcome, error
	from {T}
	where job = $1::text and (slot = $3::text or slot_start = $4::timestamptz
		or ($9::bigint > 0 and started_at > clock_timestamp() - $9::bigint {US}))
	order by token desc limit 1
), late as (
	select case
		when $4::timestamptz is null then null
		when clock_timestamp() + $12::bigint {US} >= $4::timestamptz + $11::bigint {US} then 'window'
		when exists (select from {T} where job = $1::text and slot_start > $4::timestamptz) then 'later'
	end as why
), ins as (
	insert into {T} (job, token, slot, slot_start, owner, hostname, pid, started_at, outcome)
	select $1::text, $2::bigint, $3::text, $4::timestamptz, $5::uuid, $6::text, $7::int, clock_timestamp(), 'running'
	where not exists (select from prev where not ($8::bool and outcome = 'crashed'))
		and (select why from late) is null and exists (select from durable)
	returning started_at
), pruned as (
	delete from {T}
	where job = $1::text and outcome <> 'running'
		and ($10::int = 1 or token < (select token from {T} where job = $1::text order by token desc offset greatest($10::int - 2, 0) limit 1))
		and exists (select from ins)
)
select (select started_at from ins), (select why from late), p.*
from (select) x left join prev p on true`

// endSQL records the end of the run of token $2, unless a later run has
// marked it crashed meanwhile (its lease was lost and taken). It commits
// synchronously, as markSQL does: an end lost in a crash leaves the run
// crashed, which RerunCrashed runs again.
const endSQL = `with durable as (select {SYNC})
update {T} set ended_at = clock_timestamp(), outcome = $3::text, error = $4::text
where job = $1::text and token = $2::bigint and outcome = 'running' and exists (select from durable)
returning started_at, ended_at`

// historySQL returns the newest $2 runs of job $1, or of every job when $1
// is empty, by job and newest first.
const historySQL = `select job, {COLS} from (
	select *, row_number() over (partition by job order by token desc) as n
	from {T} where $1::text = '' or job = $1::text
) h where n <= $2::int order by job, token desc`
