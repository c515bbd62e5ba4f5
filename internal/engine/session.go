package engine

import (
	"context"
	"crypto/rand"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/pglocks/pglocks/internal/lockstmt"
)

// key is a random probe key and its binary parameters, as the Locker
// sends a key (one int8, or two int4 for a pair).
type key struct {
	params  [][]byte
	formats []int16
}

// newKey returns a random key: no other client's key, in the odd chance
// it is, makes the probe fail with "refused a key no session holds", never
// pass.
func newKey(pair bool) key {
	var b [8]byte
	_, _ = rand.Read(b[:])
	if pair {
		return key{[][]byte{b[0:4], b[4:8]}, []int16{1, 1}}
	}
	return key{[][]byte{b[:]}, []int16{1}}
}

// call runs lockstmt.Select(fn, pair) on c with the extended protocol and
// k's binary parameters — the Locker's statement, sent the Locker's way —
// and returns its boolean.
func (k key) call(ctx context.Context, c *pgconn.PgConn, fn lockstmt.Fn, pair bool) (bool, error) {
	sql := lockstmt.Select(fn, pair)
	res := c.ExecParams(ctx, sql, k.params, nil, k.formats, nil).Read()
	if res.Err != nil {
		return false, fmt.Errorf("engine probe: %s: %w", sql, res.Err)
	}
	if len(res.Rows) != 1 || len(res.Rows[0]) != 1 {
		return false, fmt.Errorf("engine probe: %s: not one value", sql)
	}
	return parseBool(sql, res.Rows[0][0])
}

// name is fn's name and argument types, for a Failure.
func (k key) name(fn lockstmt.Fn) string {
	n := strings.TrimPrefix(string(fn), "pg_catalog.")
	if len(k.params) == 2 {
		return n + "(int4, int4)"
	}
	return n + "(int8)"
}

func tryXact(shared bool) lockstmt.Fn { return lockstmt.TryXact(shared) }

// step is one statement of the session check: on which connection (a or
// b), which function, shared or not, and the answer PostgreSQL gives.
type step struct {
	onA, shared, unlock, want bool
	why                       string // what the server did if it answered !want
}

// sessionSteps: an exclusive lock on a refuses b both modes, and once
// unlocked is free; a shared lock on a grants b a shared lock and refuses
// it an exclusive one, and once both unlock is free.
var sessionSteps = []step{
	{onA: true, want: true, why: "refused a key no session holds"},
	{want: false, why: "granted a key another session holds exclusively: locks do not exclude"},
	{shared: true, want: false, why: "granted a key another session holds exclusively: locks do not exclude"},
	{onA: true, unlock: true, want: true, why: "said a held key was not held"},
	{want: true, why: "refused a key its holder unlocked: unlock did not free it"},
	{unlock: true, want: true, why: "said a held key was not held"},
	{onA: true, shared: true, want: true, why: "refused a key no session holds"},
	{shared: true, want: true, why: "refused a shared lock to a second session holding none: shared locks exclude each other"},
	{want: false, why: "granted a key other sessions hold shared: locks do not exclude"},
	{shared: true, unlock: true, want: true, why: "said a held key was not held"},
	{onA: true, shared: true, unlock: true, want: true, why: "said a held key was not held"},
	{want: true, why: "refused a key its holders unlocked: unlock did not free it"},
	{unlock: true, want: true, why: "said a held key was not held"},
}

// sessionLocks runs sessionSteps for a random key of each form (bigint,
// int4 pair) on a and b. Whatever happens, it releases on a what the steps
// took there (b is the probe's own and is closed after).
func sessionLocks(ctx context.Context, a, b *pgconn.PgConn) (*Failure, error) {
	for _, pair := range []bool{false, true} {
		if f, err := sessionForm(ctx, a, b, pair); f != nil || err != nil {
			return f, err
		}
	}
	return nil, nil
}

func sessionForm(ctx context.Context, a, b *pgconn.PgConn, pair bool) (*Failure, error) {
	k := newKey(pair)
	var held []bool // the locks a holds, by shared
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		for _, shared := range held {
			_, _ = k.call(cctx, a, lockstmt.Release(shared), pair)
		}
	}()
	for _, s := range sessionSteps {
		c, fn := b, lockstmt.Try(s.shared)
		if s.onA {
			c = a
		}
		if s.unlock {
			fn = lockstmt.Release(s.shared)
		}
		got, err := k.call(ctx, c, fn, pair)
		if err != nil {
			return nil, err
		}
		if s.onA && !s.unlock && got {
			held = append(held, s.shared)
		}
		if s.onA && s.unlock && got && len(held) > 0 {
			held = held[:len(held)-1]
		}
		if got != s.want {
			return &Failure{SessionLocks, k.name(fn) + " " + s.why}, nil
		}
	}
	return nil, nil
}
