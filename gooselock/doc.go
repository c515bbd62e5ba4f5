// Package gooselock lets replicas that start together run goose
// migrations once: [Locker] is a goose v3 lock.SessionLocker
// (github.com/pressly/goose/v3/lock) that holds a pglocks advisory lock
// on the connection goose migrates on.
//
//	locker, err := gooselock.New(pglocks.KeyOf("goose:orders"))
//	provider, err := goose.NewProvider(goose.DialectPostgres, db, migrations,
//		goose.WithSessionLocker(locker))
//	results, err := provider.Up(ctx) // one replica migrates; the others wait, then find nothing to do
//
// It is [stdsql.SessionLock] and [stdsql.SessionUnlock] on goose's
// *sql.Conn, and guarantees what they do:
//
//   - One session at a time holds the key; the others wait, polling with
//     a backoff of at most 100 ms, until it is free or goose's ctx ends.
//   - The lock lives and dies with goose's connection: a replica that
//     crashes or is killed frees it as soon as the server sees its
//     connection end. goose runs SQL migrations on that connection, so a
//     replica whose session died cannot go on migrating on it.
//   - Behind a pooler in transaction or statement mode (PgBouncer
//     pool_mode=transaction or statement, RDS Proxy, Supavisor on port
//     6543) SessionLock fails with advisory.ErrTransactionPooling and
//     goose applies no migration: there the lock would stay on a pooled
//     server session, held for nobody, or be taken twice. Migrate through
//     a direct or session-mode connection. goose has created its version
//     table (goose_db_version) by then: it does so before it asks for
//     the lock, so the refusal leaves that empty table behind.
//   - Behind a pooler, SessionLock's check opens a second connection for
//     a moment, which needs a second server session from the pooler (see
//     advisory.SessionLock); when none comes within
//     advisory.PoolerCheckTimeout (10 s) — a session-mode pool of one —
//     it fails, saying the pool may be full, rather than wait as long as
//     goose's ctx.
//   - The *sql.DB must use pgx's stdlib driver: import _
//     "github.com/jackc/pgx/v5/stdlib" and open it with sql.Open("pgx",
//     dsn). The pooler check reads the connection's startup pid through
//     it. With another driver (lib/pq) SessionLock fails, with an error
//     saying so, and takes nothing.
//   - SessionUnlock is bounded by [UnlockTimeout] (goose passes a ctx that
//     is never cancelled), checks that the session held the lock, and
//     closes the connection when the unlock's outcome is unknown, so the
//     connection never goes back to the *sql.DB holding the lock.
//
// What it does not guarantee:
//
//   - Nothing announces a lost lock while migrations run; goose learns of
//     it from the failed statements of a dead session. A migration that
//     runs elsewhere — a Go migration on the *sql.DB (goose's RunDB) —
//     is not stopped by it.
//   - A killed replica's lock goes when its server session ends: at once
//     for an idle or waiting session, but a session in the middle of a
//     long statement notices its client is gone only when the statement
//     ends, or sooner with client_connection_check_interval (PostgreSQL 14
//     and later) set on the migrating connection. A partitioned replica's
//     session, and the lock, last as long as the server's TCP keepalives
//     allow — about two hours with the OS defaults, and behind a pooler
//     until the pooler's keepalives give up: goose's connection is yours,
//     and pglocks sets nothing on it. Bound it in the DSN (pgx sends
//     unknown keys to the server as settings):
//     tcp_user_timeout=10000&tcp_keepalives_idle=5&tcp_keepalives_interval=2
//     on a direct connection, and give goose a ctx with a deadline (goose
//     passes that ctx to SessionLock; it never cancels the one it passes
//     to SessionUnlock).
//   - goose's HasPending, Status and GetDBVersion take no lock (goose's
//     design), and Up calls HasPending first: on a fresh database every
//     replica tries to create goose's version table at once, unlocked, and
//     goose retries the losers after 1 s (in TestReplicasMigrateOnce the
//     replicas that did not migrate return after about 1 s). Behind
//     transaction pooling that check runs before the refusal, and needs a
//     DSN with default_query_exec_mode=exec (or a pooler that supports
//     prepared statements) to get that far.
package gooselock
