package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// newStandby makes a standby of primary with pg_basebackup and starts it on
// port, or on a free port when port is 0.
func newStandby(ctx context.Context, primary *local, cfg config, port int) (*local, error) {
	l, err := newLocal(clusterTools...)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			l.close()
		}
	}()
	cmd := l.command(ctx, "pg_basebackup", "-D", filepath.Join(l.dir, "data"), "-h", "127.0.0.1",
		"-p", strconv.Itoa(primary.port), "-U", "postgres", "-X", "stream", "-c", "fast", "--no-sync")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("pg_basebackup: %w: %s", err, strings.TrimSpace(out.String()))
	}
	conninfo := fmt.Sprintf("host=127.0.0.1 port=%d user=postgres application_name=pgtest_standby", primary.port)
	if err := l.writeDataFile("standby.signal", ""); err != nil {
		return nil, err
	}
	if err := l.appendDataFile("postgresql.auto.conf", "primary_conninfo = '"+conninfo+"'\n"); err != nil {
		return nil, err
	}
	l.args = clusterArgs(l, cfg)
	if port == 0 {
		err = l.startOnFreePort(ctx)
	} else {
		l.port = port
		err = l.start(ctx)
	}
	if err != nil {
		return nil, err
	}
	ok = true
	return l, nil
}

func (l *local) writeDataFile(name, text string) error {
	path := filepath.Join(l.dir, "data", name)
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		return err
	}
	return l.own(path)
}

func (l *local) appendDataFile(name, text string) error {
	path := filepath.Join(l.dir, "data", name)
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	_, err = f.WriteString(text)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return l.own(path)
}

// own gives path to the user postgres runs as.
func (l *local) own(path string) error {
	if l.cred == nil {
		return nil
	}
	return os.Chown(path, int(l.cred.Uid), int(l.cred.Gid))
}

// attach waits until the standby streams from the primary; for a
// synchronous cluster it then makes the primary wait for the standby's
// flush on every commit, and waits until the standby is its sync standby.
func (c *Cluster) attach(ctx context.Context) error {
	conn, err := pgx.Connect(ctx, nodeDSN(c.primary, "postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	want := "streaming"
	if c.sync {
		// Set after the base backup, so that the standby's copy of
		// postgresql.auto.conf lacks it: promoted, it must not wait for a
		// standby of its own.
		if _, err := conn.Exec(ctx, "alter system set synchronous_standby_names = '*'"); err != nil {
			return err
		}
		if _, err := conn.Exec(ctx, "select pg_reload_conf()"); err != nil {
			return err
		}
		want = "sync"
	}
	return poll(ctx, func() (bool, error) {
		var n int
		err := conn.QueryRow(ctx, `select count(*) from pg_stat_replication
			where state = 'streaming' and ($1 = 'streaming' or sync_state = $1)`, want).Scan(&n)
		return n > 0, err
	}, "the standby never reached state "+want)
}

// promote runs pg_ctl promote and waits until the node accepts writes.
func (l *local) promote(ctx context.Context) error {
	cmd := l.command(ctx, "pg_ctl", "promote", "-w", "-t", "120", "-D", filepath.Join(l.dir, "data"))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("pg_ctl promote: %w: %s", err, strings.TrimSpace(out.String()))
	}
	conn, err := pgx.Connect(ctx, nodeDSN(l, "postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return poll(ctx, func() (bool, error) {
		var recovering bool
		if err := conn.QueryRow(ctx, "select pg_is_in_recovery()").Scan(&recovering); err != nil || recovering {
			return false, err
		}
		// An xid is assigned only where writes are allowed.
		_, err := conn.Exec(ctx, "select txid_current()")
		return err == nil, nil
	}, "the promoted standby never accepted writes")
}

// poll calls cond until it reports true or fails, or ctx ends.
func poll(ctx context.Context, cond func() (bool, error), what string) error {
	for delay := time.Millisecond; ; delay = min(2*delay, 20*time.Millisecond) {
		ok, err := cond()
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", what, context.Cause(ctx))
		case <-time.After(delay):
		}
	}
}

// Rejoin makes the former primary a standby of the new one after
// [Cluster.Promote]: its files are replaced by a fresh base backup and it
// starts on its old port, so the multi-host DSN lists both nodes again. A
// synchronous cluster is synchronous again when Rejoin returns.
func (c *Cluster) Rejoin(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.standby != nil || len(c.retired) == 0 {
		return errors.New("pgtest: rejoin: no former primary to rejoin (Promote first)")
	}
	old := c.retired[len(c.retired)-1]
	c.retired = c.retired[:len(c.retired)-1]
	port := old.port
	if err := old.close(); err != nil {
		return fmt.Errorf("pgtest: rejoin: %w", err)
	}
	standby, err := newStandby(ctx, c.primary, c.Server.cfg, port)
	if err != nil {
		return fmt.Errorf("pgtest: rejoin: %w", err)
	}
	c.standby = standby
	if err := c.attach(ctx); err != nil {
		return fmt.Errorf("pgtest: rejoin: %w", err)
	}
	return nil
}

// PauseReplication stops the standby's WAL receiver (primary_conninfo is
// emptied and reloaded), so commits on the primary no longer reach it: an
// asynchronous standby falls behind, as a lagging replica does; on a
// synchronous cluster every commit then waits. ResumeReplication undoes it.
func (c *Cluster) PauseReplication(ctx context.Context) error {
	return c.setConninfo(ctx, "''", false)
}

// ResumeReplication restarts the WAL receiver stopped by
// [Cluster.PauseReplication] and returns once the standby streams again.
func (c *Cluster) ResumeReplication(ctx context.Context) error {
	c.mu.Lock()
	port := c.primary.port
	c.mu.Unlock()
	conninfo := fmt.Sprintf("'host=127.0.0.1 port=%d user=postgres application_name=pgtest_standby'", port)
	return c.setConninfo(ctx, conninfo, true)
}

func (c *Cluster) setConninfo(ctx context.Context, literal string, streaming bool) error {
	dsn := c.StandbyDSN("postgres")
	if dsn == "" {
		return errors.New("pgtest: the cluster has no standby")
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return fmt.Errorf("pgtest: standby: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "alter system set primary_conninfo = "+literal); err != nil {
		return fmt.Errorf("pgtest: standby: %w", err)
	}
	if _, err := conn.Exec(ctx, "select pg_reload_conf()"); err != nil {
		return fmt.Errorf("pgtest: standby: %w", err)
	}
	return poll(ctx, func() (bool, error) {
		var n int
		err := conn.QueryRow(ctx, "select count(*) from pg_stat_wal_receiver where status = 'streaming'").Scan(&n)
		return (n > 0) == streaming, err
	}, "the standby's WAL receiver did not change state")
}

// restart restarts the primary (a fast shutdown); the standby reconnects.
func (c *Cluster) restart(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.primary.restart(ctx)
}

// close removes every node.
func (c *Cluster) close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for _, l := range append([]*local{c.standby, c.primary}, c.retired...) {
		if l != nil {
			errs = append(errs, l.close())
		}
	}
	c.standby, c.primary, c.retired = nil, nil, nil
	return errors.Join(errs...)
}

func (c *Cluster) describe() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	mode := "async"
	if c.sync {
		mode = "sync"
	}
	s := fmt.Sprintf("cluster: primary 127.0.0.1:%d (data in %s)", c.primary.port, c.primary.dir)
	if c.standby != nil {
		s += fmt.Sprintf(", %s standby 127.0.0.1:%d (data in %s)", mode, c.standby.port, c.standby.dir)
	}
	return s
}

// CatchUp waits until the standby has replayed everything the primary had
// committed when CatchUp was called: then a read on the standby sees every
// commit acknowledged before, asynchronous ones too (a lease release, say),
// which the primary may not have written yet: CatchUp first flushes its
// WAL, by a commit of its own that waits for the local flush.
func (c *Cluster) CatchUp(ctx context.Context) error {
	primary, standby := c.PrimaryDSN("postgres"), c.StandbyDSN("postgres")
	if standby == "" {
		return errors.New("pgtest: catch up: the cluster has no standby")
	}
	lsn, err := flushedLSN(ctx, primary)
	if err != nil {
		return fmt.Errorf("pgtest: catch up: %w", err)
	}
	conn, err := pgx.Connect(ctx, standby)
	if err != nil {
		return fmt.Errorf("pgtest: catch up: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	return poll(ctx, func() (bool, error) {
		var done bool
		err := conn.QueryRow(ctx, "select coalesce(pg_last_wal_replay_lsn() >= $1::pg_lsn, false)", lsn).Scan(&done)
		return done, err
	}, "the standby did not replay up to "+lsn)
}

// flushedLSN commits a transaction that writes WAL (a transactional
// logical message: a transaction with an xid but no WAL of its own commits
// without a flush) at synchronous_commit = local, so that its commit
// flushes the WAL up to it, every asynchronous commit before it included,
// and returns the WAL position at the message's end.
func flushedLSN(ctx context.Context, dsn string) (string, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return "", err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	// The message's own end position, not pg_current_wal_lsn(): after a
	// record that ends on a page boundary the latter points past the next
	// page's header, which the standby replays only with a later record.
	var lsn string
	err = conn.QueryRow(ctx, "select pg_logical_emit_message(true, 'pgtest', 'catch up')::text, set_config('synchronous_commit', 'local', true)").Scan(&lsn, nil)
	return lsn, err
}
