package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/internal/dial"
	"github.com/pglocks/pglocks/internal/pooler"
)

// findings is what doctor learnt about a database.
type findings struct {
	version    string
	standby    bool
	mode       pooler.Mode
	txOK       bool   // a transaction of several statements ran
	txNote     string // why not: refused by the pooler, or the check failed
	writeOK    bool   // an autocommitted UPDATE through the pool was committed
	writeNote  string // why it could not be checked
	sessionOK  bool   // a session lock was still held at the next statement
	notifyOK   bool   // a NOTIFY from another connection arrived
	notifyNote string // why not, or how long it took
	table      string // schema.table
	tableOK    bool
	privs      []string // privileges missing on the table
	runTable   string   // schema.table of scheduled jobs' runs
	runTableOK bool
	runPrivs   []string // privileges missing on the run table
	capacity   int64
	settings   [][2]string
	offset     time.Duration // server clock − client clock
	rtt        time.Duration
	engine     engineFindings
}

// examine runs every check on pool's database. Only a failure to reach the
// server is an error; each check that cannot run says why in findings.
func examine(ctx context.Context, pool *pgxpool.Pool, userMode pgx.QueryExecMode, t tables) (*findings, error) {
	schema, table := t.schema, t.table
	f := &findings{table: schema + "." + table, runTable: schema + "." + t.runTable}
	err := pool.QueryRow(ctx, `select current_setting('server_version'), pg_is_in_recovery(),
		current_setting('max_locks_per_transaction')::int8 *
		  (current_setting('max_connections')::int8 + current_setting('max_prepared_transactions')::int8)`).
		Scan(&f.version, &f.standby, &f.capacity)
	if err != nil {
		return nil, err
	}
	conn, err := dial.Dedicated(ctx, pool.Config(), dial.Options{ApplicationName: "pglocks doctor"})
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if f.mode, err = pooler.Probe(ctx, pool.Config(), conn); err != nil {
		return nil, err
	}
	f.probeEngine(ctx, pool.Config(), conn)
	if f.mode.KeepsSession() { // elsewhere a lock or LISTEN would be stranded
		f.sessionOK = sessionLockKept(ctx, conn.Conn)
		f.notifyOK, f.notifyNote = notifyArrives(ctx, pool, conn.Conn)
	} else {
		f.notifyNote = "not tried: " + f.mode.String() + " drops LISTEN"
	}
	f.txOK, f.txNote = transactionRuns(ctx, pool)
	if f.tableOK, f.privs, err = tablePrivs(ctx, pool, schema, table, "SELECT", "INSERT", "UPDATE"); err != nil {
		return nil, err
	}
	if f.runTableOK, f.runPrivs, err = tablePrivs(ctx, pool, schema, t.runTable, "SELECT", "INSERT", "UPDATE", "DELETE"); err != nil {
		return nil, err
	}
	f.writeOK, f.writeNote = true, "not tried: needs the lease table and UPDATE on it"
	if f.tableOK && !slices.Contains(f.privs, "UPDATE") && !f.standby {
		if f.writeOK, err = writesCommit(ctx, pool, userMode, conn.Conn, pgx.Identifier{schema, table}.Sanitize()); err != nil {
			return nil, err
		}
		f.writeNote = ""
	}
	if err := f.readSettings(ctx, pool); err != nil {
		return nil, err
	}
	return f, nil
}

// sessionLockKept takes a session lock in one statement and looks for it in
// the next, then unlocks it.
func sessionLockKept(ctx context.Context, conn *pgx.Conn) bool {
	const key = "pg_catalog.hashtextextended('pglocks doctor', 0)"
	var ok bool
	if err := conn.QueryRow(ctx, "select pg_catalog.pg_try_advisory_lock("+key+")", pgx.QueryExecModeSimpleProtocol).Scan(&ok); err != nil || !ok {
		return false
	}
	defer conn.Exec(ctx, "select pg_catalog.pg_advisory_unlock("+key+")", pgx.QueryExecModeSimpleProtocol)
	err := conn.QueryRow(ctx, `select exists (select from pg_locks where locktype = 'advisory' and pid = pg_backend_pid()
		and granted and (classid::int8 << 32 | objid::int8) = `+key+`)`, pgx.QueryExecModeSimpleProtocol).Scan(&ok)
	return err == nil && ok
}

// transactionRuns runs a transaction of several statements on a
// connection of its own, as Guard, XactLock and every BEGIN of the
// caller's do: statement pooling refuses it (and ends that connection).
// A failure of another kind (no connection could be had) is not a
// refusal: note says so, and the features stay undecided by it.
func transactionRuns(ctx context.Context, pool *pgxpool.Pool) (ok bool, note string) {
	conn, err := dial.Dedicated(ctx, pool.Config(), dial.Options{ApplicationName: "pglocks doctor"})
	if err != nil {
		return false, "not tried: " + oneLine(err.Error())
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, sql := range []string{"begin", "select 1", "commit"} { // one message each, as a driver sends them
		if _, err := conn.PgConn().Exec(ctx, sql).ReadAll(); err != nil {
			if pooler.StatementPooling(err) {
				return false, "refused: a BEGIN ends the connection"
			}
			return false, "not tried: " + oneLine(err.Error())
		}
	}
	return true, ""
}

// writesCommit runs an UPDATE of the lease table that changes nothing
// through pool, as the user's exec mode sends it, and then looks whether the
// server session that ran it was left inside a transaction: Pgpool-II in
// raw mode wraps extended-protocol DML in a transaction it does not
// commit, so a lease release would stay uncommitted and the lease held.
// other, a connection of its own, looks (the pool's next statement could
// run inside that very transaction).
func writesCommit(ctx context.Context, pool *pgxpool.Pool, mode pgx.QueryExecMode, other *pgx.Conn, qual string) (bool, error) {
	mark := fmt.Sprintf("pglocks doctor %d", time.Now().UnixNano())
	c, err := pool.Acquire(ctx) // held while other looks: released, pgxpool would close it
	if err != nil {
		return false, err
	}
	defer c.Release()
	if _, err := c.Exec(ctx, "update "+qual+" set name = name where name = $1 and false /* "+mark+" */", mode, mark); err != nil {
		return false, err
	}
	var open bool
	err = other.QueryRow(ctx, `select exists (select from pg_stat_activity where datname = current_database()
		and state like 'idle in transaction%' and position($1 in query) > 0)`, pgx.QueryExecModeSimpleProtocol, mark).Scan(&open)
	return !open, err
}

// notifyArrives LISTENs on conn and NOTIFYs from a pool connection.
func notifyArrives(ctx context.Context, pool *pgxpool.Pool, conn *pgx.Conn) (bool, string) {
	ch := fmt.Sprintf("pglocks_doctor_%d", time.Now().UnixNano())
	if _, err := conn.Exec(ctx, "listen "+ch, pgx.QueryExecModeSimpleProtocol); err != nil {
		return false, "LISTEN failed: " + err.Error()
	}
	start := time.Now()
	if _, err := pool.Exec(ctx, "select pg_notify($1, 'ping')", ch); err != nil {
		return false, "NOTIFY failed: " + err.Error()
	}
	wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if _, err := conn.WaitForNotification(wctx); err != nil {
		return false, "none within 3s"
	}
	return true, fmt.Sprintf("in %v", time.Since(start).Round(time.Microsecond))
}

// tablePrivs reports whether a table exists and which of privs the role
// lacks on it.
func tablePrivs(ctx context.Context, pool *pgxpool.Pool, schema, table string, privs ...string) (bool, []string, error) {
	qual := pgx.Identifier{schema, table}.Sanitize()
	var exists bool
	if err := pool.QueryRow(ctx, "select to_regclass($1) is not null", qual).Scan(&exists); err != nil || !exists {
		return false, nil, err
	}
	var missing []string
	for _, p := range privs {
		var ok bool
		if err := pool.QueryRow(ctx, "select has_table_privilege($1, $2)", qual, p).Scan(&ok); err != nil {
			return true, nil, err
		}
		if !ok {
			missing = append(missing, p)
		}
	}
	return true, missing, nil
}

// readSettings reads the settings that matter and the clock offset.
func (f *findings) readSettings(ctx context.Context, pool *pgxpool.Pool) error {
	for _, name := range []string{"synchronous_commit", "statement_timeout", "lock_timeout",
		"idle_in_transaction_session_timeout", "idle_session_timeout", "default_transaction_isolation",
		"default_transaction_read_only"} {
		var v *string
		if err := pool.QueryRow(ctx, "select current_setting($1, true)", name).Scan(&v); err != nil {
			return err
		}
		if v != nil {
			f.settings = append(f.settings, [2]string{name, *v})
		}
	}
	var server time.Time
	t0 := time.Now()
	if err := pool.QueryRow(ctx, "select clock_timestamp()").Scan(&server); err != nil {
		return err
	}
	t1 := time.Now()
	f.rtt = t1.Sub(t0)
	f.offset = server.Sub(t0.Add(f.rtt / 2))
	return nil
}

// safe says, per feature, whether it is safe here and why not; notes
// qualify a feature that is safe.
func (f *findings) safe() (why, notes map[string]string) {
	why, notes = map[string]string{}, map[string]string{}
	add := func(feature, reason string) {
		if why[feature] == "" {
			why[feature] = reason
		}
	}
	f.engineSafety(add)
	if !f.writeOK {
		add("leases", "an autocommitted UPDATE was left in an open transaction by the pooler (Pgpool-II with the extended protocol: use default_query_exec_mode=simple_protocol)")
		add("leader", "autocommitted writes are not committed by the pooler")
	}
	if !f.txOK && strings.HasPrefix(f.txNote, "refused") {
		add("xact-locks", "transactions refused (statement pooling ends the connection at BEGIN)")
		add("leases", "transactions refused: Lease.Guard cannot fence writes")
		add("leader", "transactions refused: Term.Guard cannot fence writes")
	}
	if !f.mode.KeepsSession() {
		add("session-locks", f.mode.String()+": refused (advisory.ErrTransactionPooling)")
		notes["leader"] = "lease-only campaign (leader.ModeAuto falls back to it): failover after a crash within the TTL"
	} else if !f.sessionOK {
		add("session-locks", "a session lock was not held at the next statement")
		add("leader", "session locks do not work")
	}
	if !f.notifyOK {
		add("listen", "notifications do not arrive (lease waiters and Observe poll instead)")
	}
	switch {
	case f.standby:
		add("leases", "standby: read-only")
		add("leader", "standby: read-only")
	case !f.tableOK:
		add("leases", "no lease table "+f.table+" (pglocks migrate)")
		add("leader", "no lease table")
	case len(f.privs) > 0:
		add("leases", "missing privilege "+strings.Join(f.privs, ", ")+" on "+f.table)
		add("leader", "missing privileges on the lease table")
	}
	switch {
	case why["leases"] != "":
		add("schedule", "leases are not safe: "+why["leases"])
	case !f.runTableOK:
		add("schedule", "no run table "+f.runTable+" (pglocks migrate)")
	case len(f.runPrivs) > 0:
		add("schedule", "missing privilege "+strings.Join(f.runPrivs, ", ")+" on "+f.runTable)
	}
	return why, notes
}
