package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// SetMetadata replaces the JSON recorded with this acquisition (see
// [WithMetadata]) in one statement scoped to the acquisition — name,
// owner and token, unexpired by the server clock — so it never touches a
// later holder's row. It changes neither ownership, nor token, nor expiry.
// If the lease is no longer held the error wraps [ErrNotHeld] and the
// lease is lost, as after a renewal that finds it gone. Any other error is
// an unknown outcome: the metadata may or may not have changed, and the
// lease is as it was. ctx bounds the round trip.
func (l *Lease) SetMetadata(ctx context.Context, doc json.RawMessage) error {
	if err := l.usable(); err != nil {
		return fmt.Errorf("set lease metadata: %w", err)
	}
	if err := l.setMetadata(ctx, doc); err != nil {
		return fmt.Errorf("set metadata of lease %q: %w", short(l.name), err)
	}
	return nil
}

func (l *Lease) setMetadata(ctx context.Context, doc json.RawMessage) error {
	if err := checkCtx(ctx); err != nil {
		return err
	}
	if doc == nil {
		doc = json.RawMessage("null")
	}
	if err := checkJSON(doc); err != nil {
		return err
	}
	if err := l.live(); err != nil {
		return err
	}
	q := `update ` + l.store.metaTable() + ` set metadata = $4::jsonb
where name = $1 and owner = $2 and token = $3 and expires_at > clock_timestamp()
returning true`
	var ok bool
	err := retrySerialization(ctx, func() error {
		return noRows(l.store.pool.QueryRow(ctx, q, append(l.args(), string(doc))...).Scan(&ok))
	})
	if err == ErrNotHeld {
		l.notHeld("set metadata")
	}
	return err
}

// ListPrefix returns every lease held now whose name starts with prefix,
// by name, like [Store.List] restricted to those names. The table has no
// index for a prefix in every collation (its primary key's btree orders
// names by the database's collation, in which a range of names is not a
// prefix unless that collation is "C"; an index with text_pattern_ops
// would serve it, at the cost of a schema change): it
// reads every row, about 66 ms per 100,000 rows. ctx bounds the query.
func (s *Store) ListPrefix(ctx context.Context, prefix string) ([]Info, error) {
	if err := checkCtx(ctx); err != nil {
		return nil, fmt.Errorf("list leases %q*: %w", short(prefix), err)
	}
	if err := s.checkOpen(); err != nil {
		return nil, fmt.Errorf("list leases %q*: %w", short(prefix), err)
	}
	q := `select ` + infoColumns + ` from (` + s.q.listSQL + `) l where starts_with(l.name, $1) order by l.name`
	rows, _ := s.pool.Query(ctx, q, prefix)
	infos, err := pgx.CollectRows(rows, scanInfo)
	if err != nil {
		return nil, fmt.Errorf("list leases %q*: %w", short(prefix), err)
	}
	return infos, nil
}

// table is the store's lease table, quoted.
func (s *Store) metaTable() string {
	return pgx.Identifier{s.cfg.Schema, s.cfg.Table}.Sanitize()
}

// Forget deletes the row of name if it is free — released, broken or
// expired — and its token is still token: no acquisition took it since
// the one of that token. It reports whether it deleted the row. A deleted
// name starts over: its next acquisition gets token 1, lower than every
// token handed out for it before. So Forget breaks the promise that a
// name's tokens only grow, and is only for names whose tokens fence
// nothing — membership rows, one-shot requests (package leader's
// candidate and request rows) — never for a lease whose [Lease.Token] or
// [Lease.Guard] protects anything. This store forgets the tokens it saw
// for name, so that its next acquisition of it is not taken for a
// regression (another Store that saw one refuses that acquisition once,
// as after a failover, and raises the counter: see [ErrTokenRegressed]).
// It needs DELETE on the table, which nothing else in this package needs:
// without it the error wraps [ErrNoPrivilege] and the row stays. An
// unknown outcome leaves the row deleted or not, free either way. ctx
// bounds the round trip.
func (s *Store) Forget(ctx context.Context, name string, token int64) (bool, error) {
	if err := s.checkArgs(ctx, name); err != nil {
		return false, fmt.Errorf("forget lease %q: %w", short(name), err)
	}
	q := `delete from ` + s.metaTable() + ` where name = $1 and token = $2
and (owner is null or expires_at <= clock_timestamp())`
	tag, err := s.pool.Exec(ctx, q, name, token)
	if err != nil {
		return false, fmt.Errorf("forget lease %q: %w", short(name), forgetErr(err))
	}
	s.seen.update(name, func(t *tokens) { *t = tokens{} })
	return tag.RowsAffected() > 0, nil
}

// ForgetIdle deletes every free row whose name starts with prefix, whose
// metadata contains match (jsonb @>; nil matches any) and whose
// expiry passed more than idle ago by the server clock, and returns how
// many it deleted: the sweep of rows that [Store.Forget] did not delete
// (a process that died, a Forget refused). It is for such rows only: see
// Forget, whose caveats it shares. It reads the whole table (no index
// serves a prefix in every collation). ctx bounds the statement.
func (s *Store) ForgetIdle(ctx context.Context, prefix string, idle time.Duration, match json.RawMessage) (int64, error) {
	if err := checkCtx(ctx); err != nil {
		return 0, fmt.Errorf("forget idle leases %q*: %w", short(prefix), err)
	}
	if err := s.checkOpen(); err != nil {
		return 0, fmt.Errorf("forget idle leases %q*: %w", short(prefix), err)
	}
	if prefix == "" || idle < 0 {
		return 0, fmt.Errorf("forget idle leases %q*: empty prefix or negative idle %v", short(prefix), idle)
	}
	if match == nil {
		match = json.RawMessage("{}")
	}
	if err := checkJSON(match); err != nil {
		return 0, fmt.Errorf("forget idle leases %q*: match: %w", short(prefix), err)
	}
	q := `delete from ` + s.metaTable() + ` where starts_with(name, $1)
and (owner is null or expires_at <= clock_timestamp())
and expires_at < clock_timestamp() - $2::bigint * interval '1 microsecond'
and coalesce(metadata, 'null'::jsonb) @> $3::jsonb`
	tag, err := s.pool.Exec(ctx, q, prefix, idle.Microseconds(), string(match))
	if err != nil {
		return 0, fmt.Errorf("forget idle leases %q*: %w", short(prefix), forgetErr(err))
	}
	return tag.RowsAffected(), nil
}

// forgetErr says what a refused delete needs.
func forgetErr(err error) error {
	if errors.Is(err, ErrNoPrivilege) {
		return fmt.Errorf("deleting rows needs DELETE on the table (grant delete on it to the store's role); the row stays: %w", err)
	}
	return err
}
