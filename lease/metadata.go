package lease

import (
	"context"
	"encoding/json"
	"fmt"

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
// index for a prefix in every collation: it reads every row. ctx bounds
// the query.
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
