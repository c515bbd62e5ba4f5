package advisory

import (
	"strconv"
	"strings"

	"github.com/pglocks/pglocks"
)

// multi is a try on several keys in one statement (see anySQL): take need
// of keys, in their order, or none. [Locker.TryLockAll] asks for all of
// them; a [Semaphore] for n of its free slots. When turnstile is set
// (a Semaphore's single takers), the statement first takes the turnstile
// key shared for itself alone (pg_try_advisory_xact_lock_shared, released
// when the statement ends) and takes nothing if a gatherer holds it
// exclusively.
type multi struct {
	keys      []pglocks.Key
	need      int
	turnstile pglocks.Key // the zero Key: none
	label     pglocks.Key // names the call in errors, logs and events
	semName   string      // a Semaphore's: the Observer's name of each permit's hold
}

// anyName is the prepared name of anySQL.
const anyName = "pglocks_any"

// anySQL takes $3 of the keys $1 (bigints; a pair where $2 says so, as
// hi<<32 | lo) in their order, or none, in one statement and one implicit
// transaction. The tries are filtered through LIMIT, so the statement
// stops at the $3rd key taken; if fewer were free, the same statement
// unlocks those it took (the CASE runs its ELSE branch only then) and,
// when $5 and $6 are given, notifies $5 with each payload of $6 (the
// waiter's asks). Its first column says whether $3 were taken; its second
// lists the taken keys' 1-based positions in $1, comma-separated. $4, if
// not null, is the turnstile: without its shared lock nothing is tried.
// Nothing is left held when the answer is false: a try that takes nothing
// releases in the same round trip (TestTryLockAllLeavesNothing).
const anySQL = `with t as materialized (
	select o, k, p from unnest($1::int8[], $2::bool[]) with ordinality as u(k, p, o)
	where case when coalesce((select pg_catalog.pg_try_advisory_xact_lock_shared($4::int8)), true)
		then case when p then pg_catalog.pg_try_advisory_lock((k >> 32)::int4, ((k << 32) >> 32)::int4)
			else pg_catalog.pg_try_advisory_lock(k) end
		else false end
	limit $3::int4),
c as materialized (select count(*)::int4 as n from t)
select c.n = $3::int4,
	case when c.n = $3::int4 then (select string_agg(o::text, ',' order by o) from t)
	else (select count(case when p then pg_catalog.pg_advisory_unlock((k >> 32)::int4, ((k << 32) >> 32)::int4)
			else pg_catalog.pg_advisory_unlock(k) end)::text from t)
		|| ';' || coalesce((select count(pg_notify($5::text, w))::text from unnest($6::text[]) as w), '') end
from c`

// maxAsksPerTry is the most keys a failed multi asks the holders of to notify
// their unlock (each ask is one event for every listener): the first
// maxAsksPerTry of its keys, plus the turnstile. A waiter for a key it did not
// ask for polls it (up to MaxBackoff).
const maxAsksPerTry = 16

// anyArgs returns the parameters of anySQL for m, all in text format;
// with want, the failed try asks every key's holder to notify its unlock.
func (s *session) anyArgs(m *multi, want bool) (string, [][]byte, []int16) {
	var ks, ps, asks strings.Builder
	ks.WriteByte('{')
	ps.WriteByte('{')
	asks.WriteByte('{')
	for i, k := range m.keys {
		if i > 0 {
			ks.WriteByte(',')
			ps.WriteByte(',')
		}
		if i > 0 && i < maxAsksPerTry {
			asks.WriteByte(',')
		}
		ks.WriteString(strconv.FormatInt(k.Int64(), 10))
		ps.WriteString(strconv.FormatBool(k.Space() == pglocks.SpaceInt32Pair))
		if i < maxAsksPerTry {
			asks.WriteString(payload("w", k))
		}
	}
	if m.turnstile.Space() != 0 {
		asks.WriteString("," + payload("w", m.turnstile))
	}
	ks.WriteByte('}')
	ps.WriteByte('}')
	asks.WriteByte('}')
	params := [][]byte{[]byte(ks.String()), []byte(ps.String()), []byte(strconv.Itoa(m.need)), nil, nil, nil}
	if m.turnstile.Space() != 0 {
		params[3] = []byte(strconv.FormatInt(m.turnstile.Int64(), 10))
	}
	if want {
		params[4], params[5] = []byte(s.l.cfg.Channel), []byte(asks.String())
	}
	return anyName, params, []int16{0, 0, 0, 0, 0, 0}
}

// takenPositions parses the second column of anySQL's answer: the 0-based
// positions of the keys taken.
func takenPositions(b []byte, n int) ([]int, bool) {
	out := make([]int, 0, n)
	for f := range strings.SplitSeq(string(b), ",") {
		o, err := strconv.Atoi(f)
		if err != nil || o < 1 || o > n {
			return nil, false
		}
		out = append(out, o-1)
	}
	return out, len(out) > 0
}
