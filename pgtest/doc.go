// Package pgtest gives tests — pglocks' own and yours — a real PostgreSQL
// server, a fresh database per test, and the means to break them: terminate
// a backend, restart the server, cut or delay the network through a proxy.
//
// # Finding a server
//
// One server serves a whole test binary (local binaries: every test binary
// of one go test, see below), found in this order:
//
//  1. PGTEST_DSN: a running server you name (a superuser connection
//     string). pgtest creates and drops databases there and leaves it
//     running; tests that need a private server are skipped.
//  2. Docker, through github.com/ory/dockertest/v3, when a daemon answers:
//     image PGTEST_IMAGE, else postgres:16-alpine, pulled if the engine
//     lacks it. The container is AutoRemove, expires after two hours
//     whatever happens, keeps its cluster in memory (tmpfs), and is ready
//     when a connection succeeds; where this host reaches the container's
//     own address, pgtest connects there rather than through the published
//     loopback port (docker-proxy). An image that is not on the engine and
//     whose pull shows no progress for 4 s (no registry, no network) is
//     given up: pgtest logs why to stderr, once per process and image, and
//     goes on to local binaries without trying that image again.
//     PGTEST_DOCKER=0 skips this step. Any image whose docker-entrypoint.sh
//     works as the official one's does will do; pgtest/image/build.sh builds
//     one from this machine's PostgreSQL, without a registry.
//  3. Local binaries: initdb and postgres from PGTEST_BINDIR, else PATH, else
//     `pg_config --bindir`, else the newest /usr/lib/postgresql/*/bin. The
//     cluster lives in a temp dir with its Unix socket, in memory where the
//     machine has it (PGTEST_TMPDIR; else TMPDIR when it is tmpfs; else
//     /dev/shm when writable with 1 GiB free; else TMPDIR), listens on a
//     free loopback port, runs with fsync and full_page_writes off and
//     max_connections 500, and — when the tests run as root, which initdb
//     refuses — as the postgres user. Its files are a copy of one initdb
//     kept in the user's cache directory per PostgreSQL build
//     (PGTEST_INITDB_CACHE=0: run initdb every time).
//
// When none works, the error names all three ways and why each failed. In
// -short mode without PGTEST_DSN, tests that need a server are skipped.
//
// # One local server per go test
//
// go test ./... runs each package's test binary as a child of the go
// command. In local mode (step 3: no PGTEST_DSN, no Docker), the binaries
// of one go command share one server: the first to need it starts it, in
// <temp dir>/pgtest-shared-<key>, and the others find it there — the key
// is the go command's pid and start time, the PostgreSQL binaries, the
// user, and the options that change the server ([WithMaxConnections],
// [WithSetting]): binaries whose [Main] options differ there get a server
// per set of options. A binary whose parent is not the go command (run by
// hand, go test -exec, a debugger), or outside Linux, or without the flock
// command, has a server of its own, as has every binary with PGTEST_SHARE=0
// or [WithPrivateServer] among [Main]'s options. [NewServer] servers are
// always private. [SharedServer] logs which case holds.
//
// Each binary holds a shared flock on the server's users file while it
// uses the server, until [Server.Close] ([Main] calls it) or its death,
// which frees the lock whatever the cause (a panic, a -timeout, SIGKILL).
// The server's watchdog, a small detached process started with the
// directory, removes the server — an immediate shutdown, then the
// directory — once the go command has exited (SIGKILL too) and no binary
// holds that lock, checking every 0.2 s. Between binaries the server stays
// up, idle, for the next one. TestShareGoTest proves this with real go test
// runs. Should the watchdog itself be killed, a binary that still uses the
// server starts another when it closes; if every binary dies too, nothing
// removes the server until a later binary that would share (any go test
// using pgtest, on that temp dir, by that user) starts: it first removes
// every shared server of this user whose go command is gone and that no
// watchdog or binary holds. A binary that finds the directory's lock held
// for a minute (another binary hung while starting the server) logs why
// and starts a server of its own.
//
// The directory's name is predictable and its parent (/dev/shm, /tmp) may
// be writable by all: a binary makes the directory itself, mode 0700, and
// uses one that is there only if it belongs to this user (or, as root, to
// the user the server runs as, which is as trusted as for a private server)
// and no other may write to it; its files are opened without following
// symbolic links. Otherwise the binary logs why and starts a server of its
// own. The key also holds the pid namespace, so containers that share a
// temp dir do not share a server; a server is shared only within one.
//
// A binary uses the shared server as it would a PGTEST_DSN server (see
// below): its databases carry its run id, it holds its run lock and sweeps
// dead runs' databases, so that binaries running at once never touch each
// other's databases; [WithMigrator] templates are made once, by the first
// binary that needs them, and cloned by the others; [WithTemplate]
// templates stay the binary's own. What would hit every binary is refused:
// [Server.Restart] and [Server.RequirePasswords] return [ErrUnsupported]
// (use [NewServer]), and [Server.TerminateApplication] leaves the backends
// of other runs' databases alone. What pgtest cannot refuse is the tests'
// own business: ALTER SYSTEM, signals to the postmaster, roles of fixed
// names, or counts over pg_stat_activity or pg_locks not scoped to the
// test's database would reach the other binaries' tests; such a package
// needs [NewServer], or [WithPrivateServer] in its TestMain. max_connections
// (500 by default) is shared too.
//
// [Start] is the same search outside tests: examples and command-line tools
// use it to run on a throwaway server when no DSN is given.
//
// # Isolation and teardown
//
// Three ways to isolate a test, cheapest last:
//
//   - [New]: the test's own database, a clone of the server's template,
//     dropped when the test ends. Clones are made ahead in the background
//     while tests run, so a test usually finds its database ready.
//   - [New] with [WithMigrator] (or [Main] given one): the same, cloned
//     from a template that the migrations made once per server and
//     migration set, named by the Migrator's Hash, made under an advisory
//     lock so that concurrent test binaries wait for one migration, and
//     reused by later binaries and runs on the same server. Adapters:
//     [SQLFiles]; pgtestgoose (goose) and pgtestmigrate (golang-migrate) in
//     packages of their own. A template is migrated under a database name
//     of its run and renamed to its final name once complete: one half
//     made — its migration failed, its process died — never bears that
//     name, is dropped, and is never cloned.
//   - [NewTx]: a transaction rolled back when the test ends, on a database
//     that the binary's NewTx tests share; for code that needs no session
//     of its own and never commits.
//
// A failed test's database is kept, and its DSN logged, for as long as the
// server lives: a private throwaway server goes when the test binary
// exits, the shared local one when go test has ended (or sooner, should a
// later binary's sweep drop it); on a PGTEST_DSN server it stays until a
// later run's sweep.
//
// On a server that outlives the run (PGTEST_DSN, or the shared local
// server), every database a run
// makes is named pgtest_<run id>_<suffix>, and the run holds a session
// advisory lock on that id for its lifetime, on a session kept alive
// (keepalives, no idle timeouts) and watched: should it be lost, that is
// logged and the lock taken back, and [Server.Close] returns an error if
// it could not be. A run starting drops the databases of every other run
// whose lock no backend of any database holds (pg_locks) — runs that are
// gone, killed or not — but only those no one is connected to, without
// FORCE, and only those its role may drop; its errors are logged, never
// fatal. It never drops those of a run whose lock session lives.
// [Server.Close] drops the run's own, but for failed tests'. Migrator
// templates belong to no run and stay, one per migration set; a template
// is migrated under a name of its run and renamed once complete. A run
// whose lock session ends while it goes on (the server restarted under it)
// counts as gone until its watchdog takes the lock back: a run starting
// meanwhile may drop those of its databases that no one is connected to.
// Behind a pooler (PgBouncer, RDS Proxy, Supavisor: a PGTEST_DSN whose
// announced backend pid is not the one running statements), a session lock
// may sit on a server session lent to other clients: such a run does not
// sweep, and logs so. Give the sweep a direct DSN.
//
// A private throwaway server is removed — processes, files, container —
// by [Server.Close], which [Main] calls after the tests. Should the test
// binary die first (a panic, a -timeout, SIGINT, SIGKILL), a watchdog
// process started with the server notices its pipe close and removes the
// server instead. The package's own tests prove this with child test
// binaries. The shared local server's teardown is described above.
//
// # Clusters
//
// [NewCluster] and [StartCluster] run a primary and one streaming standby
// from local binaries (pg_basebackup, standby.signal, primary_conninfo;
// never Docker), asynchronous or, with [WithSynchronousStandby],
// synchronous. The cluster's [Server] connects through a multi-host DSN
// (host=…,… port=…,… target_session_attrs=read-write), which pgx follows
// to whichever node accepts writes. [Cluster.Promote] fails over as a crash
// would: an immediate stop of the primary, pg_ctl promote on the standby,
// and a return once the new primary accepts writes. [Cluster.Rejoin] makes
// the former primary a standby again; [Cluster.PauseReplication] lets an
// asynchronous standby fall behind; [Cluster.CatchUp] waits for replay.
// Teardown is that of a single server, for each node (TestClusterTeardown).
//
// # Faults
//
// [Server.TerminateBackend] and [Server.TerminateApplication] end sessions
// the way an operator or a failover does, and return once they are gone.
// [Server.Restart] stops and starts a throwaway server on the same address;
// restart tests should use their own server from [NewServer]. A [Proxy]
// stands between clients and the server. What each of its faults looks
// like from either end:
//
//	fault                       client sees                  server sees
//	Blackhole                   queries hang (held bytes      an idle session; TCP
//	                            arrive after Pass)            alive (proxy acks)
//	DropReplies                 queries hang; no reply ever   statements run and
//	                                                          commit; TCP alive
//	DropRequests                queries hang                  nothing arrives; TCP alive
//	SetLatency                  every chunk delayed           the same, delayed
//	Reset                       connection reset              connection reset
//	Partition                   queries hang                  peer silent: the session
//	                                                          ends within its keepalive
//	                                                          bound, locks freed
//	PartitionToServer           queries hang, then the        as Partition
//	                            connection closes when the
//	                            server gives up (its reset
//	                            crosses)
//	PartitionToClient           statements run, no reply      requests arrive, nothing
//	                            ever                          is acked: the session ends
//	                                                          by tcp_user_timeout or
//	                                                          keepalives, locks freed
//
// Blackhole, DropReplies, DropRequests and SetLatency act on bytes in the
// proxy, whose own kernel keeps acknowledging both sides: no TCP timer on
// either side fires, only deadlines and PostgreSQL's own timeouts do. The
// partitions ([Partitionable] proxies) drop packets in the kernel, beyond
// the server's network interface, so the server's keepalives
// (tcp_keepalives_idle + _interval × _count) and tcp_user_timeout see its
// peer vanish, as in a real network partition. Without those settings the
// server waits for the kernel's defaults (hours). [Proxy.Heal] ends a
// partition; [Proxy.Pass] ends every fault.
//
// The proxy is our own, a few hundred lines, rather than an embedded
// Toxiproxy: we need six behaviours applied to every connection at once,
// switched synchronously from test code. Toxiproxy would bring an HTTP API,
// a toxic scheduler and its dependency tree for that, and its timeout toxic
// closes connections where we want them held.
//
// # Poolers
//
// [NewBouncer] and [DB.Bouncer] start a real PgBouncer (the pgbouncer
// binary: PGTEST_PGBOUNCER, PATH or /usr/sbin; Debian's package) in
// session or transaction pooling mode in front of a server, on a free
// loopback port, with every database reachable under its own name. It also
// takes clients from the partition links' range, so that a [Partitionable]
// proxy in front of it cuts PgBouncer's own client connections while its
// link to the server stays healthy, and refuses every other address
// (TestBouncerReach). It is stopped, its files removed, when the test ends,
// and killed by a watchdog should the test binary die first
// (TestBouncerTeardown). Without the binary the test is skipped, unless
// the CI environment variable is set.
//
// # Use
//
// The whole of a package's TestMain, with goleak checking after pgtest's own
// goroutines are gone:
//
//	func TestMain(m *testing.M) {
//		goleak.VerifyTestMain(pgtest.WrapMain(m))
//	}
//
// or simply:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
// A test:
//
//	func TestSomething(t *testing.T) {
//		t.Parallel()
//		db := pgtest.New(t)          // a fresh database, dropped at cleanup
//		pool := db.NewPool(t)        // closed at cleanup
//		p, viaProxy := db.Proxy(t)   // a proxy in front of the server
//		...
//		p.Blackhole()                // now queries through viaProxy hang
//		db.Server.TerminateBackend(ctx, pid)
//	}
//
// Environment: PGTEST_DSN, PGTEST_IMAGE, PGTEST_DOCKER, PGTEST_BINDIR,
// PGTEST_TMPDIR, PGTEST_INITDB_CACHE, PGTEST_SHARE, and Docker's own
// DOCKER_HOST.
package pgtest
