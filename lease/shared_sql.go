package lease

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// A shared lease rw lives in rows of the lease table, each an ordinary
// lease row: the writer's, rw + "#w", and the readers' slots,
// rw + "#r.1", rw + "#r.2", …. A slot's row is made only when every lower
// slot's row exists (see gateSQL), so the slots' rows are numbered 1 to
// n without a gap, and a reader of them stops at the first missing one:
// a few index lookups, whatever else the table holds.
const (
	writerSuffix = "#w"
	readerSuffix = "#r."
	// sharedNameRoom is what the suffixes may add to a shared lease's name.
	sharedNameRoom = len(readerSuffix) + 20
)

func writerName(rw string) string          { return rw + writerSuffix }
func readerName(rw string, k int64) string { return rw + readerSuffix + strconv.FormatInt(k, 10) }

// slotsCTE enumerates the slots whose rows exist, from 1 up to the first
// missing one ($2 is rw + "#r.").
const slotsCTE = `slots(k) as (
	select 1 where exists (select from {T} where name = $2::text || '1')
	union all
	select k + 1 from slots where exists (select from {T} where name = $2::text || (k + 1)::text)
)`

// sharedQueries are the reads of the shared leases; their writes are the
// lease statements of the rows they name.
type sharedQueries struct {
	gateSQL, writerSQL, readersSQL string
}

func newSharedQueries(r *strings.Replacer) sharedQueries {
	// gate: the writer's row, if held, and a reader slot to try — a free
	// one at random (so that racing readers seldom pick the same), else
	// the first slot without a row. It writes and locks nothing.
	gate := `with recursive ` + slotsCTE + `, w as (
	select owner, token, {LEFT} as left_us from {T}
	where name = $1::text and owner is not null and expires_at > clock_timestamp()
)
select (select owner from w), (select token from w), (select left_us from w),
	coalesce((select s.k from slots s join {T} l on l.name = $2::text || s.k::text
		where l.owner is null or l.expires_at <= clock_timestamp() order by random() limit 1),
		(select count(*) + 1 from slots))::bigint`
	writer := `select owner, token, {LEFT} from {T}
where name = $1::text and owner is not null and expires_at > clock_timestamp()`
	readers := `with recursive ` + slotsCTE + `
select l.name, l.owner, l.token, {LEFT} from slots s join {T} l on l.name = $2::text || s.k::text
where $1::text is not null and l.owner is not null and l.expires_at > clock_timestamp()`
	return sharedQueries{gateSQL: r.Replace(gate), writerSQL: r.Replace(writer), readersSQL: r.Replace(readers)}
}

// gate is the answer of gateSQL: the writer, if one holds rw (or waits
// for its readers), and the reader slot to try.
type gate struct {
	writer *HeldError
	slot   int64
}

// gate reads rw's writer and a reader slot to try.
func (s *Store) gate(ctx context.Context, rw string) (gate, error) {
	var (
		owner       pgtype.UUID
		token, left *int64
		g           gate
	)
	err := s.pool.QueryRow(ctx, s.q.shared.gateSQL, writerName(rw), rw+readerSuffix).Scan(&owner, &token, &left, &g.slot)
	if err != nil {
		return gate{}, err
	}
	if owner.Valid && token != nil && left != nil {
		g.writer = &HeldError{Name: writerName(rw), Owner: owner.Bytes, Token: *token, ExpiresIn: time.Duration(*left) * time.Microsecond}
	}
	return g, nil
}

// writer returns rw's writer, nil when none holds it.
func (s *Store) writer(ctx context.Context, rw string) (*HeldError, error) {
	var (
		owner pgtype.UUID
		held  HeldError
		left  int64
	)
	err := s.pool.QueryRow(ctx, s.q.shared.writerSQL, writerName(rw)).Scan(&owner, &held.Token, &left)
	if err != nil {
		if noRows(err) == ErrNotHeld {
			return nil, nil
		}
		return nil, err
	}
	held.Name, held.Owner, held.ExpiresIn = writerName(rw), owner.Bytes, time.Duration(left)*time.Microsecond
	return &held, nil
}

// readers returns the readers that hold rw: one HeldError per live slot.
func (s *Store) readers(ctx context.Context, rw string) ([]*HeldError, error) {
	rows, err := s.pool.Query(ctx, s.q.shared.readersSQL, rw, rw+readerSuffix)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var held []*HeldError
	for rows.Next() {
		var (
			h     HeldError
			owner pgtype.UUID
			left  int64
		)
		if err := rows.Scan(&h.Name, &owner, &h.Token, &left); err != nil {
			return nil, err
		}
		h.Owner, h.ExpiresIn = owner.Bytes, time.Duration(left)*time.Microsecond
		held = append(held, &h)
	}
	return held, rows.Err()
}
