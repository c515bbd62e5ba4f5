package advisory_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/pgtest"
)

// TestRefusedDialLeavesNoSettings: behind a transaction-mode
// PgBouncer the Locker refuses its connection, and must leave nothing on
// the server session the pooler lent it: that session goes on to serve
// other clients, and the Locker's session settings there
// (statement_timeout = 0 overriding their role's or database's timeout,
// idle_session_timeout ending the pooler's idle server sessions, the TCP
// settings) would be theirs. The pooler is probed before any setting is
// sent. With a pool of one server session, another client then finds
// that session as the database's defaults made it.
func TestRefusedDialLeavesNoSettings(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := ctxT(t)
	admin := db.Conn(t)
	for _, set := range []string{"statement_timeout = '37s'", "lock_timeout = '3s'",
		"idle_in_transaction_session_timeout = '41s'", "idle_session_timeout = '0'"} {
		if _, err := admin.Exec(ctx, "alter database "+pgx.Identifier{db.Name}.Sanitize()+" set "+set); err != nil {
			t.Fatal(err)
		}
	}
	_, dsn := db.Bouncer(t, pgtest.PoolTransaction, pgtest.BouncerPoolSize(1))
	before := serverSettings(t, ctx, dsn)
	l := newLocker(t, lazyPool(t, dsn), advisory.Config{})
	if _, err := l.TryLock(ctx, pglocks.KeyOf("refused-settings")); !errors.Is(err, advisory.ErrTransactionPooling) {
		t.Fatalf("TryLock behind transaction pooling: %v, want ErrTransactionPooling", err)
	}
	after := serverSettings(t, ctx, dsn)
	if after["pid"] != before["pid"] {
		t.Fatalf("the pool of one lent another server session: pid %s, then %s", before["pid"], after["pid"])
	}
	for name, was := range before {
		if after[name] != was {
			t.Errorf("after the Locker's refused dial, the pooled server session (pid %s) has %s = %q, was %q",
				after["pid"], name, after[name], was)
		}
	}
	t.Logf("the pooled server session (pid %s) after the refused dial: %v", after["pid"], after)
}

// serverSettings reads, through dsn, the settings the Locker sets on its
// sessions and the backend's pid, as another client of the pooler sees
// them.
func serverSettings(t *testing.T, ctx context.Context, dsn string) map[string]string {
	t.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	names := []string{"statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout",
		"idle_session_timeout", "tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count",
		"tcp_user_timeout", "synchronous_commit"}
	out := map[string]string{}
	var pid string
	if err := conn.QueryRow(ctx, "select pg_backend_pid()::text").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	out["pid"] = pid
	for _, n := range names {
		var v string
		if err := conn.QueryRow(ctx, "select current_setting($1)", n).Scan(&v); err != nil {
			t.Fatal(err)
		}
		out[n] = v
	}
	return out
}
