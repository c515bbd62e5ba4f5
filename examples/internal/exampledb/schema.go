package exampledb

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"strings"

	"github.com/jackc/pgx/v5"
)

// SchemaPrefix begins the name of every schema an example makes in a
// database given with -dsn.
const SchemaPrefix = "pglocks_example_"

// openSchema creates a schema of the example's own in dsn's database.
func openSchema(ctx context.Context, dsn string) (*DB, error) {
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		return nil, err
	}
	schema := SchemaPrefix + hex.EncodeToString(b)
	withPath, err := withSearchPath(dsn, schema)
	if err != nil {
		return nil, err
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("-dsn: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "create schema "+pgx.Identifier{schema}.Sanitize()); err != nil {
		return nil, fmt.Errorf("-dsn: create schema %s (the example needs CREATE on the database): %w", schema, err)
	}
	cc := conn.Config()
	return &DB{
		Target: Target{DSN: withPath, Schema: schema},
		Source: fmt.Sprintf("database %q on %s:%d (-dsn), in schema %s, dropped at the end", cc.Database, cc.Host, cc.Port, schema),
		user:   dsn,
	}, nil
}

// dropSchema drops schema and all in it from dsn's database.
func dropSchema(ctx context.Context, dsn, schema string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return fmt.Errorf("drop schema %s (drop it yourself): %w", schema, err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "drop schema if exists "+pgx.Identifier{schema}.Sanitize()+" cascade"); err != nil {
		return fmt.Errorf("drop schema %s (drop it yourself): %w", schema, err)
	}
	return nil
}

// withSearchPath returns dsn, a URL or keyword/value DSN, with search_path
// set to schema: a run-time parameter pgx sends at connect.
func withSearchPath(dsn, schema string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", fmt.Errorf("-dsn: %w", err)
		}
		q := u.Query()
		q.Set("search_path", schema)
		u.RawQuery = q.Encode()
		return u.String(), nil
	}
	if _, err := pgx.ParseConfig(dsn); err != nil {
		return "", fmt.Errorf("-dsn: %w", err)
	}
	return strings.TrimSpace(dsn) + " search_path=" + schema, nil
}
